"""A Cloud TPU v5e slice of 16 chips (v5litepod-16: 16 GiB HBM per chip, 4x4), global batch 4096.

Recipe: Nesterov momentum 0.9 with Goyal et al.'s linear scaling (LR 0.1 x 4096 / 256 = 1.6, 5-epoch warm-up,
x0.1 at epochs 30, 60, 80, weight decay 1e-4); bfloat16 compute, batch norm over the global batch
(256 images per chip). 91 epochs: 28,464 steps.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v5e-16 (16 chips)", device_kind="TPU v5 lite", num_devices=16,
                       topology="v5e:4x4")
    config.model.compute_dtype = "bfloat16"
    config.training.global_batch_size = 4096
    return recipes.use_case_study_recipe(config)
