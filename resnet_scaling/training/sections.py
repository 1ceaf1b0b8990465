"""A config read once, at the edge, into the typed sections the parts of a run take.

`read(config)` is the one place a validated `ml_collections.ConfigDict` becomes frozen dataclasses, as
`steps.StepConfig` began it; the model, optimizer, schedule, input and steps take only their own section
and never see the config (flax's imagenet example passes its parts plain values the same way). Each section
lives in the module that consumes it and says what it needs; sizes and durations derived from several
sections are the `plan.TrainingPlan`'s. The edges that call `read`: `training_setup.setup` (every command
that trains or compiles), `evaluation.evaluate_workdir` and `predict.Predictor` (a saved run's config).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import ml_collections

from resnet_scaling import data as data_lib
from resnet_scaling import models
from resnet_scaling.training import optim, steps

_Section = TypeVar("_Section")


@dataclasses.dataclass(frozen=True)
class Sections:
    """Every typed section of one config.

    Attributes:
      model: `config.model`: the network and its initial weights (`models.model_from_config`, init_from.py).
      optimizer: `config.optimizer` (`optim.create_optimizer`).
      schedule: `config.schedule` (`optim.create_learning_rate_schedule`).
      data: `config.data` with the seed, classes and MLPerf's crop (`data.create_data_source`).
      step: the constants the train and eval steps bind (`steps.jit_train_step`).
    """

    model: models.ModelConfig
    optimizer: optim.OptimizerConfig
    schedule: optim.ScheduleConfig
    data: data_lib.DataConfig
    step: steps.StepConfig


def read(config: ml_collections.ConfigDict) -> Sections:
    """The typed sections of `config` (validated already: `config.validate`, or `training_setup.setup`)."""
    return Sections(
        model=_fields(models.ModelConfig, config.model),
        optimizer=_fields(optim.OptimizerConfig, config.optimizer),
        schedule=_fields(optim.ScheduleConfig, config.schedule),
        data=_fields(data_lib.DataConfig, config.data, num_classes=config.model.num_classes,
                     seed=config.seed, mlperf_crop=bool(config.mlperf.enabled)),
        step=steps.StepConfig(
            mean_rgb=tuple(float(v) for v in config.data.mean_rgb),
            stddev_rgb=tuple(float(v) for v in config.data.stddev_rgb),
            num_classes=int(config.model.num_classes),
            label_smoothing=float(config.training.label_smoothing),
        ),
    )


def _fields(cls: type[_Section], section: Mapping[str, Any], **extra: Any) -> _Section:
    """`cls` from the fields of a config section it names (lists as tuples; values otherwise as set, so
    the program is the one the config gave), plus `extra`. A field an older saved run's config lacks takes
    the dataclass's default."""
    values = {f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section}
    values = {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}
    return cls(**values, **extra)
