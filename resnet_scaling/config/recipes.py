"""The published training recipes the system configs follow, each set in one place, with its source.

A config under `configs/` sets hardware and global batch, then calls one of these to pick optimizer,
learning rate, schedule and regularisation; docs/case_study.md cites each source (repository, file,
commit). The case study ran tensorflow/tpu's r1.12 (`use_case_study_recipe`); tensorflow/tpu's later LARS
table and the MLPerf v0.7 JAX submission's recipe are here to compare against.

A recipe's values depend on the global batch, and a command-line override of the batch comes after the
config file ran its recipe: `resolve` gives every field the recipe still sets its value for the final
batch (the commands and `training_setup.setup` call it), so a run trains with what its recipe says.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import ml_collections

from resnet_scaling import config as config_lib

logger = logging.getLogger(__name__)

# The case study's methodology: the clock times 90 epochs to 76% top-1 (CASE_STUDY_TIMED_EPOCHS, what the
# published minutes cover) after 1 untimed warm-up epoch (the default `training.timing_warmup_epochs`); a
# run trains both (CASE_STUDY_TRAINED_EPOCHS: r1.12's v2-512.yaml, 3,558 steps of 32,768 images).
CASE_STUDY_TIMED_EPOCHS = 90
CASE_STUDY_UNTIMED_EPOCHS = 1
CASE_STUDY_TRAINED_EPOCHS = float(CASE_STUDY_TIMED_EPOCHS + CASE_STUDY_UNTIMED_EPOCHS)
CASE_STUDY_EVAL_EVERY_EPOCHS = 4.0  # As MLPerf's ResNet rules.
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
    return _record(config, "momentum_linear_scaling")


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
    _use_lars_polynomial(config, learning_rate, warmup_epochs, "tf1.12", "non_batchnorm")
    return _record(config, "case_study_lars")


def use_tensorflow_tpu_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """tensorflow/tpu's later LARS (master's lars_util table, the reference LARSOptimizer, weight decay in
    the optimizer on kernels only, none in the loss): otherwise as `use_case_study_lars`."""
    learning_rate, warmup_epochs = lars_learning_rate(config.training.global_batch_size)
    _use_lars_polynomial(config, learning_rate, warmup_epochs, "reference", "kernels")
    return _record(config, "tensorflow_tpu_lars")


def use_mlperf_v07_jax_lars(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The MLPerf v0.7 Google JAX submission's LARS (flax.optim.LARS on kernels, plain momentum elsewhere)
    for the global batch. Its decay counted from warm-up's fractional end; ours from the whole step before
    it (tensorflow/tpu's), which moves the decay by under one step."""
    h = mlperf_v07_jax_hyperparameters(config.training.global_batch_size)
    _use_lars_polynomial(config, h["base_learning_rate"], h["warmup_epochs"], "reference", "kernels",
                         momentum=h["momentum"], weight_decay=h["weight_decay"])
    config.training.num_epochs = h["num_epochs"]
    config.eval.every_epochs = 4.0
    return _record(config, "mlperf_v07_jax_lars")


def use_case_study_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """What the case study ran for the global batch (tensorflow/tpu r1.12): `use_case_study_lars` at >= 16k
    images per step, `use_momentum_linear_scaling` below; 91 epochs; evaluation every 4 epochs (as MLPerf)."""
    if config.training.global_batch_size >= LARS_MIN_GLOBAL_BATCH:
        use_case_study_lars(config)
    else:
        use_momentum_linear_scaling(config)
    config.training.num_epochs = CASE_STUDY_TRAINED_EPOCHS
    config.eval.every_epochs = CASE_STUDY_EVAL_EVERY_EPOCHS
    return _record(config, "case_study")


# config.recipe -> the function that applies it to a config for its `training.global_batch_size`.
RECIPES: Mapping[str, Callable[[ml_collections.ConfigDict], ml_collections.ConfigDict]] = {
    "case_study": use_case_study_recipe,
    "momentum_linear_scaling": use_momentum_linear_scaling,
    "case_study_lars": use_case_study_lars,
    "tensorflow_tpu_lars": use_tensorflow_tpu_lars,
    "mlperf_v07_jax_lars": use_mlperf_v07_jax_lars,
}
# Every field a recipe above sets (the LARS recipes and the SGD one set different ones).
RECIPE_FIELDS = (
    "optimizer.name", "optimizer.momentum", "optimizer.nesterov", "optimizer.weight_decay",
    "optimizer.weight_decay_on", "optimizer.base_learning_rate", "optimizer.lr_reference_batch_size",
    "optimizer.lr_scaling", "optimizer.lars_variant", "optimizer.lars_trust_coefficient",
    "optimizer.lars_epsilon", "schedule.name", "schedule.warmup_epochs", "schedule.boundary_epochs",
    "schedule.decay_factor", "schedule.polynomial_power", "schedule.end_learning_rate",
    "training.label_smoothing", "training.num_epochs", "eval.every_epochs",
)


def _record(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Names the recipe that set `config`'s values, and the batch they are for (`resolve` reads both)."""
    config.recipe = name
    config.recipe_batch_size = config.training.global_batch_size
    return config


@dataclasses.dataclass(frozen=True)
class Resolution:
    """A config with its recipe applied to its final global batch.

    Attributes:
      config: the resolved config (the one given, where nothing changed).
      changed: field -> (value before, the recipe's value for the final batch).
      kept: field -> (its value, the recipe's value) for each field that was set after the recipe (in the
        config file or `explicit`) and keeps a value other than the recipe's.
    """

    config: ml_collections.ConfigDict
    changed: dict[str, tuple[Any, Any]]
    kept: dict[str, tuple[Any, Any]]


def resolve(config: ml_collections.ConfigDict, explicit: Collection[str] = ()) -> Resolution:
    """`config` with `config.recipe`'s values for its final `training.global_batch_size`.

    A field keeps its value where it is in `explicit` (the command line's overrides) or differs from what
    the recipe set for `config.recipe_batch_size` (a config file changed it after the recipe). Calling it
    again changes nothing.

    Raises:
      ConfigError: `config.recipe` names no recipe.
    """
    name, batch, was = config.recipe, config.training.global_batch_size, config.recipe_batch_size
    if not name or batch == was:
        return Resolution(config, {}, {})
    if name not in RECIPES:
        raise config_lib.ConfigError(f"config.recipe: {name!r} is not a recipe; use one of "
                                     f"{', '.join(RECIPES)}, or \"\" for none.")
    after = recipe_values(name, batch)
    before = recipe_values(name, was) if was > 0 else None  # 0: the recipe has set nothing yet.
    resolved = copy.deepcopy(config)
    changed, kept = {}, {}
    for field in RECIPE_FIELDS:
        value = _get(config, field)
        if field in explicit or (before is not None and not _same(value, before[field])):
            if not _same(value, after[field]):
                kept[field] = (value, after[field])
        elif not _same(value, after[field]):
            _set(resolved, field, after[field])
            changed[field] = (value, after[field])
    resolved.recipe_batch_size = batch
    return Resolution(resolved, changed, kept)


def log_resolution(resolution: Resolution, *, kept_by: str = "the config") -> None:
    """Says which values the recipe changed for the final batch and which were kept as set."""
    config = resolution.config
    if resolution.changed:
        changes = (f"{field} {old!r} -> {new!r}" for field, (old, new) in resolution.changed.items())
        logger.info("Recipe %s for a global batch of %d: %s.", config.recipe,
                    config.training.global_batch_size, "; ".join(changes))
    if resolution.kept:
        logger.info("Kept as set by %s over recipe %s: %s.", kept_by, config.recipe,
                    "; ".join(f"{field} {value!r} (the recipe's: {recipe!r})"
                              for field, (value, recipe) in resolution.kept.items()))


def recipe_values(name: str, global_batch_size: int) -> dict[str, Any]:
    """What recipe `name` sets each of `RECIPE_FIELDS` to for a global batch (over the defaults)."""
    config = config_lib.get_base_config()
    config.training.global_batch_size = global_batch_size
    RECIPES[name](config)
    return {field: _get(config, field) for field in RECIPE_FIELDS}


def _get(config: ml_collections.ConfigDict, field: str) -> Any:
    section, name = field.split(".")
    return config[section][name]


def _set(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    section, name = field.split(".")
    config[section][name] = value


def _same(a: Any, b: Any) -> bool:
    """Equal as settings: a tuple and the list a saved config holds, an int and the float it stands for."""
    return (tuple(a) if isinstance(a, list) else a) == (tuple(b) if isinstance(b, list) else b)


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
