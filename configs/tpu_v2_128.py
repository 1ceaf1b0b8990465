"""The case study's Cloud TPU v2-128: 64 chips, 128 cores (8 GiB HBM each), global batch 16384.

Recipe: tensorflow/tpu r1.12's LARS (lars_util up to 16,384: base LR 25, 5 warm-up epochs, polynomial decay
power 2 to 1e-4; TF 1.12.0's LARSOptimizer), label smoothing 0.1; weight decay 1e-4, bfloat16 compute, batch
norm per core (128 images, as the TPUEstimator reference normalised each replica's batch). 91 epochs (90
measured + 1 warm-up): 7,116 steps; the warm-up epoch is 78 steps (docs/case_study.md's table).
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="Cloud TPU v2-128 (64 chips)", device_kind="TPU v2", num_devices=128,
                       topology="v2:8x8")
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 0  # per core
    config.training.global_batch_size = 16384
    return recipes.use_case_study_recipe(config)
