"""The case study's system: a full Cloud TPU v2 Pod, 256 chips = 512 cores ("v2-512").

Recipe (`recipes.use_case_study_recipe` at 32,768 images per step): what the case study ran, tensorflow/tpu
branch r1.12 (docs/case_study.md cites files and commits): its lars_util table at exactly 32,768 -> base
learning rate 34.0, 12 warm-up epochs, polynomial decay with power 2 to 1e-4; TensorFlow 1.12.0's
LARSOptimizer (`optimizer.lars_variant = "tf1.12"`) with momentum 0.9 and weight decay 1e-4 as an L2 loss on
every non-batch-norm variable; label smoothing 0.1, bfloat16 compute; evaluation every 4 epochs. 91 epochs:
the published methodology's 90 measured epochs plus 1 warm-up epoch, 3,558 steps. Batch norm over groups of
128 images (the 2 cores of a chip), as the pod-scale MLPerf TPU submissions and Ying et al. 2018 normalised.

Compile it for the pod on any machine with libtpu: `python -m resnet_scaling.compile --config=configs/pod.py`.

Input: imagenet2012 prepared by TFDS (see docs/datasets.md); `--config.data.data_dir`
names the TFDS data directory. `--config.data.source=synthetic` measures the model alone.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    # 16x16 chips, 4 per host VM (64 hosts); JAX sees each chip's 2 TensorCores as 2 devices.
    recipes.set_system(config, name="Cloud TPU v2 Pod (v2-512: 256 chips, 512 cores)", device_kind="TPU v2",
                       num_devices=512, topology="v2:16x16", chips_per_host_bounds=(2, 2, 1))
    config.model.compute_dtype = "bfloat16"  # TPUs compute in bfloat16; no loss scaling needed.
    config.model.bn_group_size = 128  # 2 cores x 64 images: no BN reduction leaves a chip.
    config.training.global_batch_size = 32_768  # 64 images per core.
    config.eval.global_batch_size = 32_768
    return recipes.use_case_study_recipe(config)
