"""A Cloud TPU v6e-64 (Trillium) slice: 64 chips (32 GiB HBM each) in an 8x8 torus, 16 hosts, batch 8192.

128 images per chip. Recipe: Nesterov momentum 0.9 with Goyal et al.'s linear scaling (LR 0.1 x 8192 / 256
= 3.2, 5-epoch warm-up, x0.1 at epochs 30, 60, 80, weight decay 1e-4), the case study's recipe below 16k
images a step; bfloat16 compute, batch norm per chip (128 images). 91 epochs: 14,232 steps.

No topology (`system.topology`): libtpu 0.0.42.1 crashes (a segmentation fault, twice) compiling this step
ahead of time for `v6e:8x8`, so there is no compile report; the planner scales a shipped TPU program of the
same model to this chip instead (`planning/estimates.py system_from_plan`, on the 8x8 torus of its 64
chips). On a v6e slice it trains as is.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v6e-64 (64 chips)", device_kind="TPU v6 lite", num_devices=64)
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 0  # per chip
    config.training.global_batch_size = 8192
    return recipes.use_case_study_recipe(config)
