"""An 8-GPU A100 node: 8x NVIDIA A100 80GB (SXM, NVLink), global batch 2048 (256 per GPU).

Recipe: Goyal et al.'s linear scaling (SGD with Nesterov momentum 0.9, LR 0.1 x 2048 / 256 = 0.8, 5-epoch
warm-up, x0.1 at epochs 30, 60, 80, weight decay 1e-4), bfloat16 compute (no loss scaling), batch norm over
the global batch. 91 epochs as the case study: 56,927 steps.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="8x NVIDIA A100 80GB", device_kind="NVIDIA A100-SXM4-80GB", num_devices=8)
    config.model.compute_dtype = "bfloat16"
    config.training.global_batch_size = 2048
    return recipes.use_case_study_recipe(config)
