"""The case study's Cloud TPU v2-32: 16 chips, 32 cores (8 GiB HBM each), global batch 4096.

Recipe: Nesterov momentum 0.9 with Goyal et al.'s linear scaling (LR 0.1 x 4096 / 256, 5-epoch warm-up, x0.1
at epochs 30, 60, 80), as tensorflow/tpu r1.12's resnet_main.py; weight decay 1e-4 on every non-BN variable,
bfloat16 compute, batch norm per core (128 images, as the TPUEstimator reference normalised each replica's
batch). 91 epochs (90 measured + 1 warm-up): 28,464 steps; the warm-up epoch is 313 steps
(docs/case_study.md's table).
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v2-32 (16 chips)", device_kind="TPU v2", num_devices=32,
                       topology="v2:4x4")
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 0  # per core
    config.training.global_batch_size = 4096
    return recipes.use_case_study_recipe(config)
