"""A Cloud TPU v5p-128 slice: 64 chips (95 GiB HBM each) in a 4x4x4 torus, global batch 32768.

The case study's pod batch on a quarter of the chips: 512 images per chip. Recipe: the case study's
r1.12 LARS for 32k (lars_util: base LR 34, 12 warm-up epochs, polynomial decay power 2 to 1e-4),
momentum 0.9, weight decay 1e-4, label smoothing 0.1; bfloat16 compute; batch norm per chip (512 images;
the MLPerf pod runs used ~128-image groups, which a chip's batch cannot be split into here).
91 epochs: 3,558 steps.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v5p-128 (64 chips)", device_kind="TPU v5", num_devices=64,
                       topology="v5p:4x4x4")
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 0  # per chip
    config.training.global_batch_size = 32_768
    return recipes.use_case_study_recipe(config)
