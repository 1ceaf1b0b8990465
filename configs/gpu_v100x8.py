"""The case study's 8-GPU VM: 8x NVIDIA V100 (16 GB, NVLink) on an n1-standard-64.

Recipe: tf_cnn_benchmarks as the published methodology ran it: 312 images per GPU (global batch 2496),
float16 with dynamic loss scaling, batch norm per GPU (each replica normalises its own 312 images, as
tf_cnn_benchmarks' replicated towers did), SGD with Nesterov momentum 0.9, weight decay 1e-4, Goyal et al.'s
linear scaling (LR 0.1 x 2496 / 256 = 0.975, 5-epoch warm-up, x0.1 at epochs 30, 60, 80). 91 epochs: 46,710
steps (the case study: ~213 minutes at ~8.5k images/s).
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="8x NVIDIA V100 (n1-standard-64)", device_kind="Tesla V100-SXM2-16GB",
                       num_devices=8)
    config.model.compute_dtype = "float16"
    config.model.bn_group_size = 0  # per GPU
    config.training.global_batch_size = 2496
    config.eval.global_batch_size = 2496
    return recipes.use_case_study_recipe(config)
