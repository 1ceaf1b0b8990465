"""The embedded default: a narrow ResNet-18 learns the generated shapes dataset on a CPU in minutes.

Ten classes of shapes and textures (resnet_scaling/data/shapes.py), 32x32 pixels, 12,000 training and
2,000 held-out images, generated (nothing is downloaded) and written once as JPEG files in the class-folder
layout under `data.cache_dir`; training reads them through the real input pipeline (decode, random crop,
flip) like any folder of JPEGs.
"""

from resnet_scaling.config import get_base_config


def get_config():
    config = get_base_config()
    config.model.name = "resnet18"
    config.model.num_classes = 10
    config.model.num_filters = 16  # A quarter of ResNet-18's width: fast on two CPU cores.

    config.data.source = "shapes"
    config.data.image_size = 32
    config.data.num_train_examples = 12_000
    config.data.num_eval_examples = 2_000
    # The shapes fill the small images: milder crops than ImageNet's (0.08, 1), no evaluation border.
    config.data.crop_area_range = (0.35, 1.0)
    config.data.eval_resize_size = 32
    config.data.mean_rgb = (0.5, 0.5, 0.5)
    config.data.stddev_rgb = (0.25, 0.25, 0.25)

    config.training.global_batch_size = 128
    config.training.num_epochs = 6.0
    config.training.log_every_steps = 25

    config.schedule.warmup_epochs = 0.5
    config.eval.global_batch_size = 1000  # Divides over 1, 2, 4 or 8 devices (as the train batch does).
    config.eval.every_epochs = 2.0
    return config
