"""Small shared pieces for the tests: a tiny config and a tiny dataset."""

import numpy as np

from resnet_scaling.config import get_base_config


def tiny_config(**overrides):
    """A resnet_tiny config on 32x32 arrays: compiles and steps in seconds on a CPU.

    Overrides name `section__field` (or a top-level field such as `seed`).
    """
    config = get_base_config()
    config.model.name = "resnet_tiny"
    config.model.num_classes = 10
    config.model.num_filters = 8
    config.data.source = "arrays"
    config.data.image_size = 32
    config.training.global_batch_size = 16
    config.training.num_train_steps = 4
    config.training.log_every_steps = 2
    config.schedule.warmup_steps = 1
    config.eval.global_batch_size = 16
    config.eval.every_epochs = 0
    config.training.tensorboard = False  # Saves importing TensorFlow in every test process.
    config.checkpoint.enabled = False  # tests/test_checkpointing.py turns it on where it matters.
    for key, value in overrides.items():
        if "__" in key:
            section, name = key.split("__")
            config[section][name] = value
        else:
            config[key] = value
    return config


def random_arrays(num_train=64, num_eval=20, image_size=32, num_classes=10, seed=0):
    rng = np.random.default_rng(seed)

    def draw(n):
        images = rng.integers(0, 256, (n, image_size, image_size, 3), dtype=np.uint8)
        return images, rng.integers(0, num_classes, n).astype(np.int32)

    return (*draw(num_train), *draw(num_eval))
