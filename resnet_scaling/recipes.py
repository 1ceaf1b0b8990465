"""The published training recipes the system configs follow, each set in one place, with its source.

A config under `configs/` sets hardware and global batch, then calls one of these to pick optimizer,
learning rate, schedule and regularisation; docs/case_study.md cites each source (repository, file,
commit). The case study ran tensorflow/tpu's r1.12 (`use_case_study_recipe`); tensorflow/tpu's later LARS
table and the MLPerf v0.7 JAX submission's recipe are here to compare against.
"""

from __future__ import annotations

import ml_collections

# The case study's methodology: 90 measured epochs plus 1 warm-up epoch (r1.12's v2-512.yaml: 3,558 steps).
CASE_STUDY_EPOCHS = 91.0
# tensorflow/tpu's resnet_main.py switches to LARS (with label smoothing) at 16k images per step.
LARS_MIN_GLOBAL_BATCH = 16_384


def lars_learning_rate_r1_12(global_batch_size: int) -> tuple[float, float]:
    """(base learning rate, warm-up epochs) of tensorflow/tpu r1.12's lars_util.poly_rate_schedule."""
    if global_batch_size <= 16_384:
        return 25.0, 5.0
    if global_batch_size == 32_768:
        return 34.0, 12.0
    return 41.0, 16.0


def lars_learning_rate(global_batch_size: int) -> tuple[float, float]:
    """(base learning rate, warm-up epochs) of tensorflow/tpu's later lars_util table (master since 2019)."""
    for below, learning_rate, warmup_epochs in ((16_384, 10.0, 5.0), (32_768, 25.0, 5.0),
                                                (65_536, 32.0, 14.0)):
        if global_batch_size < below:
            return learning_rate, warmup_epochs
    return 35.6, 40.0


def mlperf_v07_jax_hyperparameters(global_batch_size: int) -> dict[str, float]:
    """The MLPerf v0.7 Google JAX ResNet-50 submission's hyperparameters for a global batch (its train.py:
    polynomial_learning_rate_fn and main)."""
    # (global batch below, base learning rate, warm-up epochs, momentum, epochs), searched in order.
    table = ((16_384, 10.0, 5.0, 0.9, 56.0), (32_768, 25.0, 5.0, 0.9, 56.0),
             (65_536, 29.0, 18.0, 0.929, 64.0), (None, 23.080977304670448, 33.0, 0.9537213777059405, 92.0))
    _, lr, warmup, momentum, epochs = next(row for row in table
                                           if row[0] is None or global_batch_size < row[0])
    return {"base_learning_rate": lr, "warmup_epochs": warmup, "momentum": momentum,
            "weight_decay": 2e-4 if global_batch_size < 32_768 else 1e-4, "num_epochs": epochs}


def use_momentum_linear_scaling(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """tensorflow/tpu r1.12 resnet_main.py below 16k images per step (Goyal et al. 2017's schedule; they
    warm up from 0.1, not 0, with plain momentum): L2 loss on every non-BN variable (classifier bias too)."""
    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9
    config.optimizer.nesterov = True
    config.optimizer.weight_decay = 1e-4
    config.optimizer.weight_decay_on = "non_batchnorm"
    config.optimizer.base_learning_rate = 0.1
    config.optimizer.lr_reference_batch_size = 256
    config.optimizer.lr_scaling = "linear"
    config.schedule.name = "piecewise"
    config.schedule.warmup_epochs = 5.0
    config.schedule.boundary_epochs = (30.0, 60.0, 80.0)
    config.schedule.decay_factor = 0.1
    config.training.label_smoothing = 0.0
    return config


def _use_lars_polynomial(config: ml_collections.ConfigDict, learning_rate: float, warmup_epochs: float,
                         variant: str, weight_decay_on: str, momentum: float = 0.9,
                         weight_decay: float = 1e-4) -> ml_collections.ConfigDict:
    """What every LARS recipe here shares: linear warm-up, polynomial decay, label smoothing."""
    config.optimizer.name = "lars"
    config.optimizer.lars_variant = variant
    config.optimizer.momentum = momentum
    config.optimizer.nesterov = False
    config.optimizer.weight_decay = weight_decay
    config.optimizer.weight_decay_on = weight_decay_on
    config.optimizer.lars_trust_coefficient = 0.001
    config.optimizer.lars_epsilon = 0.0
    config.optimizer.base_learning_rate = learning_rate
    config.optimizer.lr_scaling = "none"  # The table gives the learning rate per batch size.
    config.schedule.name = "polynomial"
    config.schedule.polynomial_power = 2.0
    config.schedule.end_learning_rate = 1e-4
    config.schedule.warmup_epochs = warmup_epochs
    config.training.label_smoothing = 0.1
    return config


def use_case_study_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """tensorflow/tpu r1.12's LARS for `training.global_batch_size` (set it first): its lars_util table,
    TensorFlow 1.12.0's LARSOptimizer (`lars_variant="tf1.12"`), weight decay an L2 loss on non-BN variables.
    """
    learning_rate, warmup_epochs = lars_learning_rate_r1_12(config.training.global_batch_size)
    return _use_lars_polynomial(config, learning_rate, warmup_epochs, "tf1.12", "non_batchnorm")


def use_tensorflow_tpu_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """tensorflow/tpu's later LARS (master's lars_util table, the reference LARSOptimizer, weight decay in
    the optimizer on kernels only, none in the loss): otherwise as `use_case_study_lars`."""
    learning_rate, warmup_epochs = lars_learning_rate(config.training.global_batch_size)
    return _use_lars_polynomial(config, learning_rate, warmup_epochs, "reference", "kernels")


def use_mlperf_v07_jax_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The MLPerf v0.7 Google JAX submission's LARS (flax.optim.LARS on kernels, plain momentum elsewhere)
    for the global batch. Its decay counted from warm-up's fractional end; ours from the whole step before
    it (tensorflow/tpu's), which moves the decay by under one step."""
    h = mlperf_v07_jax_hyperparameters(config.training.global_batch_size)
    _use_lars_polynomial(config, h["base_learning_rate"], h["warmup_epochs"], "reference", "kernels",
                         momentum=h["momentum"], weight_decay=h["weight_decay"])
    config.training.num_epochs = h["num_epochs"]
    config.eval.every_epochs = 4.0
    return config


def use_case_study_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """What the case study ran for the global batch (tensorflow/tpu r1.12): `use_case_study_lars` at >= 16k
    images per step, `use_momentum_linear_scaling` below; 91 epochs; evaluation every 4 epochs (as MLPerf)."""
    if config.training.global_batch_size >= LARS_MIN_GLOBAL_BATCH:
        use_case_study_lars(config)
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
