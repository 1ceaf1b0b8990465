"""A Cloud TPU v4-32 slice: 16 chips (32 GiB HBM each) in a 2x2x4 torus, 4 hosts, global batch 4096.

Recipe: Nesterov momentum 0.9 with Goyal et al.'s linear scaling (LR 0.1 x 4096 / 256 = 1.6, 5-epoch warm-up,
x0.1 at epochs 30, 60, 80, weight decay 1e-4), as the case study's v2-32 (same batch); bfloat16 compute,
batch norm over the global batch. 91 epochs: 28,464 steps. JAX runs each chip as one device (megacore: 256
images a device), and so does the ahead-of-time compile (libtpu's megacore chip config).
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v4-32 (16 chips)", device_kind="TPU v4", num_devices=16,
                       topology="v4:2x2x4")
    config.model.compute_dtype = "bfloat16"
    config.training.global_batch_size = 4096
    return recipes.use_case_study_recipe(config)
