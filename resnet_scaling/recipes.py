"""The published training recipes the system configs follow, each set in one place.

A config under `configs/` sets its hardware and global batch, then calls one of these; the recipe picks
optimizer, learning rate, schedule and regularisation for that batch (docs/case_study.md lists the
sources). Keeping them here means the tensorflow/tpu LARS table is written once, not copied per config.
"""

from __future__ import annotations

import ml_collections

# The case study's methodology: 90 measured epochs plus 1 warm-up epoch.
CASE_STUDY_EPOCHS = 91.0
# LARS needs a large batch; the tensorflow/tpu reference switches to it (with label smoothing) at 16k.
LARS_MIN_GLOBAL_BATCH = 16_384

# tensorflow/tpu lars_util: (global batch below, base learning rate, warm-up epochs), searched in order.
_LARS_TABLE = ((16_384, 10.0, 5.0), (32_768, 25.0, 5.0), (65_536, 32.0, 14.0))
_LARS_LARGEST = (35.6, 40.0)


def lars_learning_rate(global_batch_size: int) -> tuple[float, float]:
    """(base learning rate, warm-up epochs) of the tensorflow/tpu LARS schedule for a global batch."""
    for below, learning_rate, warmup_epochs in _LARS_TABLE:
        if global_batch_size < below:
            return learning_rate, warmup_epochs
    return _LARS_LARGEST


def use_momentum_linear_scaling(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Goyal et al. 2017: SGD momentum 0.9, LR 0.1 x batch / 256, 5-epoch linear warm-up, x0.1 at epochs
    30, 60 and 80, weight decay 1e-4 on kernels. The tensorflow/tpu ResNet reference (the case study's
    TPU code below 16k images per step) uses the same schedule; tf_cnn_benchmarks on GPUs too.
    """
    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9
    config.optimizer.weight_decay = 1e-4
    config.optimizer.base_learning_rate = 0.1
    config.optimizer.lr_reference_batch_size = 256
    config.optimizer.lr_scaling = "linear"
    config.schedule.name = "piecewise"
    config.schedule.warmup_epochs = 5.0
    config.schedule.boundary_epochs = (30.0, 60.0, 80.0)
    config.schedule.decay_factor = 0.1
    config.training.label_smoothing = 0.0
    return config


def use_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The tensorflow/tpu LARS recipe (lars_util, MLPerf v0.5/v0.6) for `training.global_batch_size`:
    base LR and warm-up from its table, polynomial decay (power 2) to 1e-4, momentum 0.9, weight decay
    1e-4 and trust ratios on kernels only, label smoothing 0.1. Set the global batch first.
    """
    learning_rate, warmup_epochs = lars_learning_rate(config.training.global_batch_size)
    config.optimizer.name = "lars"
    config.optimizer.momentum = 0.9
    config.optimizer.weight_decay = 1e-4
    config.optimizer.base_learning_rate = learning_rate
    config.optimizer.lr_scaling = "none"  # The table gives the learning rate per batch size.
    config.schedule.name = "polynomial"
    config.schedule.polynomial_power = 2.0
    config.schedule.end_learning_rate = 1e-4
    config.schedule.warmup_epochs = warmup_epochs
    config.training.label_smoothing = 0.1
    return config


def use_case_study_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """What the case study ran for the config's global batch: LARS + label smoothing at >= 16k images per
    step, momentum with linear scaling below; 91 epochs; evaluation every 4 epochs (as MLPerf)."""
    if config.training.global_batch_size >= LARS_MIN_GLOBAL_BATCH:
        use_lars(config)
    else:
        use_momentum_linear_scaling(config)
    config.training.num_epochs = CASE_STUDY_EPOCHS
    config.eval.every_epochs = 4.0
    return config


def set_system(config: ml_collections.ConfigDict, *, name: str, device_kind: str, num_devices: int,
               topology: str = "", chips_per_host_bounds: tuple[int, int, int] = (2, 2, 1)
               ) -> ml_collections.ConfigDict:
    """Fills `config.system` and pins the mesh to the system's device count (-1: whatever is there)."""
    config.system.name = name
    config.system.device_kind = device_kind
    config.system.topology = topology
    config.system.chips_per_host_bounds = chips_per_host_bounds
    config.mesh.num_devices = num_devices
    return config
