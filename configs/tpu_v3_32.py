"""A Cloud TPU v3-32 slice: 16 chips, 32 cores (16 GiB HBM each) in a 4x4 torus, 4 hosts, global batch 4096.

The system and batch of Google's MLPerf v0.6 and v0.7 v3-32 submissions (128 images per core), on the case
study's recipe: Nesterov momentum 0.9 with Goyal et al.'s linear scaling (LR 0.1 x 4096 / 256 = 1.6, 5-epoch
warm-up, x0.1 at epochs 30, 60, 80, weight decay 1e-4); bfloat16 compute, batch norm per core (128 images).
91 epochs: 28,464 steps.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v3-32 (16 chips)", device_kind="TPU v3", num_devices=32,
                       topology="v3:4x4")
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 0  # per core
    config.training.global_batch_size = 4096
    return recipes.use_case_study_recipe(config)
