"""The case study's GPU baseline: 1x NVIDIA V100 (16 GB) on an n1-standard-8 VM.

Recipe: as the published methodology ran tf_cnn_benchmarks: global batch 312 (312 per GPU), float16 compute
with dynamic loss scaling (V100s have no bfloat16 units), SGD with Nesterov momentum 0.9, weight decay 1e-4,
Goyal et al.'s linear scaling (LR 0.1 x 312 / 256 = 0.122, 5-epoch warm-up, x0.1 at epochs 30, 60, 80). 91
epochs (90 measured + 1 warm-up): 373,674 steps, about 26 hours at the case study's ~1,230 images/s.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="1x NVIDIA V100 (n1-standard-8)", device_kind="Tesla V100-SXM2-16GB",
                       num_devices=1)
    config.model.compute_dtype = "float16"
    config.training.global_batch_size = 312
    config.eval.global_batch_size = 312
    return recipes.use_case_study_recipe(config)
