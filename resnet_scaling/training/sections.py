"""A config read once, at the edge, into the typed sections the parts of a run take.

`read(config)` is the one place a validated `ml_collections.ConfigDict` becomes frozen dataclasses, as
`steps.StepConfig` began it; the model, optimizer, schedule, input, steps, checkpointer and the run's report
take only their own section and never see the config (flax's imagenet example passes its parts plain values
the same way). Each section lives in the module that consumes it and says what it needs; sizes and
durations derived from several sections are the `plan.TrainingPlan`'s. The edges that call `read`:
`training_setup.setup` (every command that trains or compiles), `evaluation.evaluate_workdir` and
`predict.Predictor` (a saved run's config).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, TypeVar

import ml_collections

from resnet_scaling import checkpointing, models
from resnet_scaling import data as data_lib
from resnet_scaling.config import fields as config_fields
from resnet_scaling.metrics import mlperf_log, run_report
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
      checkpoint: `config.checkpoint` (`checkpointing.Checkpointer`).
      report: what the run's report and its MLPerf log need (`run_report.RunReport`).
      loop: the training loop's guards and profile window (`trainer`).
      record: the whole config as JSON values: what a run records of itself (config.json, each
        checkpoint's meta and the compatibility fingerprint a resume checks, the export, summary.json).
    """

    model: models.ModelConfig
    optimizer: optim.OptimizerConfig
    schedule: optim.ScheduleConfig
    data: data_lib.DataConfig
    step: steps.StepConfig
    checkpoint: checkpointing.CheckpointConfig
    report: run_report.ReportConfig
    loop: LoopConfig
    record: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the training loop itself reads of `config.training`.

    Attributes:
      max_param_norm_growth: a parameter norm this many times the initial one is divergence
        (`divergence.DivergenceGuard`).
      profile_steps: `(first, last)` steps profiled to TensorBoard; `(0, 0)` none.
    """

    max_param_norm_growth: float = 100.0
    profile_steps: tuple[int, int] = (0, 0)


def record(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """`config` as JSON values (tuples as lists), as a run records it."""
    return json.loads(config.to_json_best_effort())


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
        checkpoint=_fields(checkpointing.CheckpointConfig, config.checkpoint),
        report=run_report.ReportConfig(
            target_top1=float(config.eval.target_top1), tensorboard=bool(config.training.tensorboard),
            mlperf=_mlperf(config), record=record(config), config_text=str(config)),
        loop=LoopConfig(max_param_norm_growth=float(config.training.max_param_norm_growth),
                        profile_steps=tuple(int(s) for s in config.training.profile_steps)),
        record=record(config),
    )


def _mlperf(config: ml_collections.ConfigDict) -> mlperf_log.MLPerfConfig:
    """The MLPerf log's settings: `config.mlperf`, and the recipe's values MLPerf's rules name."""
    m, o, s = config.mlperf, config.optimizer, config.schedule
    warmup_in_epochs = (config_fields.set_duration_field(config, config_fields.WARMUP)
                        == "schedule.warmup_epochs")
    return mlperf_log.MLPerfConfig(
        enabled=bool(m.enabled), target_top1=float(m.target_top1), eval_every_epochs=int(m.eval_every_epochs),
        caches_cleared=bool(m.caches_cleared), submission_org=m.submission_org,
        submission_platform=m.submission_platform or config.system.name,
        submission_division=m.submission_division, submission_status=m.submission_status,
        seed=config.seed, optimizer=o.name, momentum=o.momentum, weight_decay=o.weight_decay,
        lars_epsilon=o.get("lars_epsilon", 0.0), schedule=s.name, end_learning_rate=s.end_learning_rate,
        polynomial_power=s.polynomial_power,
        warmup_epochs=float(s.warmup_epochs) if warmup_in_epochs else None)


def _fields(cls: type[_Section], section: Mapping[str, Any], **extra: Any) -> _Section:
    """`cls` from the fields of a config section it names (lists as tuples; values otherwise as set, so
    the program is the one the config gave), plus `extra`. A field an older saved run's config lacks takes
    the dataclass's default."""
    values = {f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section}
    values = {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}
    return cls(**values, **extra)
