"""The case study's system: a full Cloud TPU v2 Pod, 256 chips = 512 cores ("v2-512").

Recipe: the tensorflow/tpu reference LARS schedule for global batch 32768 (lars_util: batch in
[32k, 64k) -> base learning rate 32.0, 14 warm-up epochs, polynomial decay with power 2 to 1e-4),
weight decay 1e-4 and momentum 0.9, label smoothing 0.1, bfloat16 compute. 91 epochs: the published
methodology's 90 measured epochs plus 1 warm-up epoch, 3,558 steps. Batch norm over groups of 128 images
(the 2 cores of a chip), as the pod-scale MLPerf TPU submissions and Ying et al. 2018 normalised.

Compile it for the pod on any machine with libtpu: `python -m resnet_scaling.compile --config=configs/pod.py`.

Input: imagenet2012 prepared by TFDS (see the README's "ImageNet" section); `--config.data.data_dir`
names the TFDS data directory. `--config.data.source=synthetic` measures the model alone.
"""

from resnet_scaling.config import get_base_config


def get_config():
    config = get_base_config()
    config.model.compute_dtype = "bfloat16"  # TPUs compute in bfloat16; no loss scaling needed.
    config.model.bn_group_size = 128  # 2 cores x 64 images: no BN reduction leaves a chip.

    config.system.name = "Cloud TPU v2 Pod (v2-512: 256 chips, 512 cores)"
    config.system.device_kind = "TPU v2"
    config.system.topology = "v2:16x16"  # 16x16 chips; JAX sees 2 devices (cores) per chip.
    config.system.chips_per_host_bounds = (2, 2, 1)  # 4 chips per host VM, 64 hosts.

    config.mesh.num_devices = 512  # Each v2 chip has 2 TensorCores; JAX sees each as a device.

    config.training.global_batch_size = 32_768  # 64 images per core.
    config.training.num_epochs = 91.0
    config.training.label_smoothing = 0.1

    config.optimizer.name = "lars"
    config.optimizer.base_learning_rate = 32.0
    config.optimizer.lr_scaling = "none"  # LARS recipes give the learning rate per batch size.
    config.optimizer.weight_decay = 1e-4
    config.optimizer.momentum = 0.9

    config.schedule.name = "polynomial"
    config.schedule.polynomial_power = 2.0
    config.schedule.end_learning_rate = 1e-4
    config.schedule.warmup_epochs = 14.0

    config.eval.global_batch_size = 32_768
    config.eval.every_epochs = 4.0  # As MLPerf evaluates.
    return config
