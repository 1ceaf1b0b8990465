"""ResNet-50 v1.5 for 90 epochs on any number of devices (Goyal et al.'s recipe).

Global batch 1024, SGD with momentum 0.9, learning rate 0.1 x batch / 256 after a 5-epoch linear
warm-up, cosine decay, weight decay 1e-4 on kernels, zero-initialised last BN scale per block.
Input: imagenet2012 prepared by TFDS (see docs/datasets.md); `--config.data.data_dir`
names the TFDS data directory. `--config.data.source=synthetic` measures the model alone.
"""

from resnet_scaling.config import get_base_config


def get_config():
    return get_base_config()
