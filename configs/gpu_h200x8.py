"""Today's 8-GPU node: 8x NVIDIA H200 (141 GB HBM3e, NVLink), global batch 4096 (512 per GPU).

Recipe: Goyal et al.'s linear scaling, which they showed holds to 8k images per step (SGD with Nesterov
momentum 0.9, LR 0.1 x 4096 / 256 = 1.6, 5-epoch warm-up, x0.1 at epochs 30, 60, 80, weight decay 1e-4),
bfloat16 compute, batch norm over the global batch. 91 epochs as the case study: 28,464 steps.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="8x NVIDIA H200", device_kind="NVIDIA H200", num_devices=8)
    config.model.compute_dtype = "bfloat16"
    config.training.global_batch_size = 4096
    return recipes.use_case_study_recipe(config)
