"""The training plan: every value derived from a config, the mesh and the dataset's size, computed once.

Consumers read the plan, never the config's raw batch sizes, durations or sentinels. Two steps, because the
data source needs the batch sizes before it can say how large its splits are:

    batch = plan.batch_plan_for_mesh(config, mesh)
    source = data.create_data_source(sections.read(config).data, mesh, batch=batch)
    training_plan = plan.derive(config, source.num_train_examples, batch=batch,
                                num_eval_examples=source.num_eval_examples)

Durations (length, warm-ups, intervals) are given in steps, examples or epochs (which fields:
`config_fields.DURATIONS`); `duration_steps` converts them all (as big_vision's `u.steps`). Wherever the
package turns epochs into steps or back, `EpochLength` (the plan's `epoch_length`) does it.

When the loop logs, evaluates, saves and stops is decided here too, in one place that the loop asks:

    schedule = plan.loop_schedule(config, training_plan)
    schedule.is_log_step(step), schedule.is_eval_step(step), schedule.is_save_step(step, ...)
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import ml_collections

from resnet_scaling.config.fields import (
    CHECKPOINT_INTERVAL,
    EVAL_INTERVAL,
    TIMING_WARMUP,
    TRAINING_LENGTH,
    WARMUP,
    Duration,
    Rounding,
    set_duration_field,
)
from resnet_scaling.job.errors import ConfigError

if TYPE_CHECKING:
    from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class EpochLength:
    """The one converter between epochs and steps: an epoch is `num_train_examples` images, a step
    `global_batch_size` of them. Both directions are fractional; `whole_steps` rounds a length to steps.

    Attributes:
      num_train_examples: the training split's size (all processes).
      global_batch_size: images per step.
    """

    num_train_examples: int
    global_batch_size: int

    def steps(self, epochs: float) -> float:
        """Steps (fractional) whose images make `epochs` passes over the training split."""
        return epochs * self.num_train_examples / self.global_batch_size

    def epochs(self, steps: float) -> float:
        """Epochs done after `steps` steps, by images seen (MLPerf's `epoch_num` counts so); `steps /
        steps_per_epoch` would undercount (2.3% at 32k: 40 steps per epoch rounded up from 39.1)."""
        return steps * self.global_batch_size / self.num_train_examples

    @property
    def exact_steps_per_epoch(self) -> float:
        """Steps in one epoch, unrounded (39.1 at 32k): what a schedule divides a step by for its epoch."""
        return self.steps(1)

    @property
    def steps_per_epoch(self) -> int:
        """Whole steps that see every training example once (rounded up: 40 at 32k)."""
        return math.ceil(self.exact_steps_per_epoch)  # As eval_steps_by_epochs: no tolerance needed.


def whole_steps(steps: float, rounding: Rounding) -> int:
    """Fractional `steps` as whole steps, rounded as a `Duration`'s `rounding` says
    (`config_fields.Duration`): "up" and "down" tolerate float error (90 epochs of an exact multiple stay
    exact); "interval" gives at least 1 step for a positive interval and 0 for none."""
    if rounding == "interval" and steps <= 0:
        return 0
    if steps == int(steps):
        return int(steps)
    if rounding == "up":
        return math.ceil(steps - 1e-9)
    if rounding == "down":
        return math.floor(steps + 1e-9)
    if rounding == "interval":
        return max(1, int(round(steps)))
    return int(round(steps))


def fractional_steps(config: ml_collections.ConfigDict, duration: Duration, num_train_examples: int,
                     global_batch_size: int) -> float | None:
    """A duration as (fractional) steps before rounding, an epoch being `num_train_examples` examples; None
    where none of its fields is set."""
    field = set_duration_field(config, duration)
    if field is None:
        return None
    section, name = field.split(".")
    value = config[section][name]
    if name == duration.steps:
        return float(int(value))
    if name == duration.examples:
        return value / global_batch_size
    return EpochLength(num_train_examples, global_batch_size).steps(value)


def duration_steps(config: ml_collections.ConfigDict, duration: Duration, num_train_examples: int,
                   global_batch_size: int) -> int | None:
    """A duration in whole steps, rounded as `duration.rounding` says; None where none of its fields is."""
    steps = fractional_steps(config, duration, num_train_examples, global_batch_size)
    return None if steps is None else whole_steps(steps, duration.rounding)


def resolve_bn_group_size(bn_group_size: int, global_batch_size: int, num_devices: int | None) -> int | None:
    """Images per batch-norm group for the model, or None for one group over the whole (global) batch.

    Args:
      bn_group_size: `config.model.bn_group_size`: -1 the whole batch, 0 each device's images, N images.
      num_devices: devices in the mesh; required for 0 (per device).
    """
    group_size = int(bn_group_size)
    if group_size == 0:
        if num_devices is None:
            raise ValueError("config.model.bn_group_size = 0 (per device) needs the mesh's device count; "
                             "pass num_devices.")
        group_size = global_batch_size // num_devices
    if group_size < 0 or group_size == global_batch_size:
        return None  # One group: plain nn.BatchNorm over the global batch.
    return group_size


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Batch sizes of a run on a mesh: global, per process (what one host's input pipeline makes) and per
    device, for training and evaluation, and the resolved batch-norm group.

    Attributes:
      num_devices: devices the batch is split over (the whole mesh).
      num_local_devices: this process's devices in the mesh.
      num_processes: processes the mesh spans.
      bn_group_size: images per batch-norm group in training; None for the whole global batch.
      eval_global_batch_size: `eval.global_batch_size`; once fitted to an evaluation set
        (`for_eval_set`, as `derive` and the data sources do), never more than that set needs.
    """

    global_batch_size: int
    eval_global_batch_size: int
    num_devices: int
    num_local_devices: int
    num_processes: int
    bn_group_size: int | None

    @property
    def per_device_batch_size(self) -> int:
        return self.global_batch_size // self.num_devices

    @property
    def per_process_batch_size(self) -> int:
        return self.global_batch_size * self.num_local_devices // self.num_devices

    @property
    def eval_per_device_batch_size(self) -> int:
        return self.eval_global_batch_size // self.num_devices

    @property
    def eval_per_process_batch_size(self) -> int:
        return self.eval_global_batch_size * self.num_local_devices // self.num_devices

    def for_eval_set(self, num_eval_examples: int) -> BatchPlan:
        """This plan with an evaluation batch no larger than `num_eval_examples` needs: the configured one,
        or, for a smaller set, the fewest images per device that take every process's share in one step
        (1,024 for 128 images on 8 devices pads 896 images per pass and runs 8x the work; 128 pads none).

        Every source and `derive` fit their plan here, so they agree on the batch."""
        largest_share = math.ceil(num_eval_examples / self.num_processes)
        per_device = max(1, math.ceil(largest_share / self.num_local_devices))
        fitted = min(self.eval_global_batch_size, per_device * self.num_devices)
        return self if fitted == self.eval_global_batch_size else dataclasses.replace(
            self, eval_global_batch_size=fitted)

    def eval_steps(self, num_eval_examples: int) -> int:
        """Evaluation steps for one exact pass: every process runs this many, enough for the largest
        process share (shares differ by at most one example); the last batches are padded and masked."""
        largest_share = math.ceil(num_eval_examples / self.num_processes)
        return math.ceil(largest_share / self.eval_per_process_batch_size)


def batch_plan(config: ml_collections.ConfigDict, num_devices: int, num_local_devices: int | None = None,
               num_processes: int = 1) -> BatchPlan:
    """The batch sizes of `config` on a mesh of `num_devices` (`num_local_devices` of them this
    process's; default: all, a single-process job) spanning `num_processes` processes."""
    global_batch = int(config.training.global_batch_size)
    return BatchPlan(
        global_batch_size=global_batch,
        eval_global_batch_size=int(config.eval.global_batch_size),
        num_devices=num_devices,
        num_local_devices=num_devices if num_local_devices is None else num_local_devices,
        num_processes=num_processes,
        bn_group_size=resolve_bn_group_size(config.model.bn_group_size, global_batch, num_devices),
    )


def batch_plan_for_mesh(config: ml_collections.ConfigDict, mesh: Mesh) -> BatchPlan:
    """The batch sizes of `config` on `mesh`, as seen from this process."""
    # jax only here, where there is a mesh: the rest is arithmetic that the planner
    # (planning/estimates.py) uses without it.
    from resnet_scaling.job import mesh as mesh_lib

    return batch_plan(config, mesh.size, *mesh_lib.process_layout(mesh))


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Values derived from a config, the mesh and the number of training examples.

    Attributes:
      batch: the batch sizes (global, per process, per device; training and evaluation) and BN groups;
        the evaluation batch fitted to the evaluation set (`BatchPlan.for_eval_set`).
      warmup_steps: whole warm-up steps (rounded down, as tensorflow/tpu): where the decay starts counting.
      peak_learning_rate: learning rate at the end of warm-up.
      eval_every_steps: steps between evaluations (0: only at the end).
      checkpoint_every_steps: steps between checkpoints (0: only at the end and on preemption).
      log_every_steps: steps between fetches of the training metrics from the device.
      timing_warmup_steps: steps before the timed region (steady-state throughput, time-to-accuracy).
      warmup_exact_steps: the warm-up's fractional length, until which the LR rises.
    """

    batch: BatchPlan
    num_train_examples: int
    num_eval_examples: int
    total_steps: int
    warmup_steps: int
    peak_learning_rate: float
    eval_every_steps: int
    eval_steps: int
    checkpoint_every_steps: int
    log_every_steps: int
    timing_warmup_steps: int
    warmup_exact_steps: float

    @property
    def global_batch_size(self) -> int:
        return self.batch.global_batch_size

    @property
    def per_device_batch_size(self) -> int:
        return self.batch.per_device_batch_size

    @property
    def num_devices(self) -> int:
        return self.batch.num_devices

    @property
    def bn_group_size(self) -> int | None:
        return self.batch.bn_group_size

    @property
    def epoch_length(self) -> EpochLength:
        """The run's epochs <-> steps converter."""
        return EpochLength(self.num_train_examples, self.global_batch_size)

    @property
    def steps_per_epoch(self) -> int:
        """Whole steps that see every example once (rounded up); for display and bookkeeping. Epochs and
        steps convert through `epoch_length` (unrounded: `epoch_length.exact_steps_per_epoch`)."""
        return self.epoch_length.steps_per_epoch

    @property
    def polynomial_decay_steps(self) -> int:
        """Steps the polynomial decay spans: `total_steps - warmup_steps + 1`, as tensorflow/tpu's lars_util
        and MLPerf's references count them (its last step so stays just above the end learning rate)."""
        return self.total_steps - self.warmup_steps + 1


def derive(config: ml_collections.ConfigDict, num_train_examples: int, num_devices: int | None = None, *,
           batch: BatchPlan | None = None, num_eval_examples: int | None = None) -> TrainingPlan:
    """Computes every derived value of a run in one place.

    Args:
      config: a validated config.
      num_train_examples: size of the training split (defines an epoch).
      num_devices: devices the batch is split over, for a single-process plan; or pass `batch`.
      batch: the run's `BatchPlan` (from `batch_plan`, as the data source got it).
      num_eval_examples: size of the evaluation split (default: `config.data.num_eval_examples`).

    Returns:
      The run's `TrainingPlan`.
    """
    if (batch is None) == (num_devices is None):
        raise ValueError("derive: pass either num_devices or batch.")
    if batch is None:
        batch = batch_plan(config, num_devices)
    if num_train_examples <= 0:
        raise ConfigError(f"The training split is empty ({num_train_examples} examples).")
    if num_eval_examples is None:
        num_eval_examples = int(config.data.num_eval_examples)
    batch = batch.for_eval_set(num_eval_examples)  # As the data source fitted its own.
    global_batch = batch.global_batch_size

    def steps(duration: Duration) -> int:
        return duration_steps(config, duration, num_train_examples, global_batch) or 0

    total_steps = max(1, steps(TRAINING_LENGTH))
    warmup_steps = min(steps(WARMUP), total_steps)
    warmup_exact = min(fractional_steps(config, WARMUP, num_train_examples, global_batch) or 0.0,
                       float(total_steps))
    peak = config.optimizer.base_learning_rate
    if config.optimizer.lr_scaling == "linear":
        peak = config.optimizer.base_learning_rate * global_batch / config.optimizer.lr_reference_batch_size
    return TrainingPlan(
        batch=batch,
        num_train_examples=num_train_examples,
        num_eval_examples=num_eval_examples,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        peak_learning_rate=float(peak),
        eval_every_steps=steps(EVAL_INTERVAL),
        eval_steps=batch.eval_steps(num_eval_examples),
        checkpoint_every_steps=steps(CHECKPOINT_INTERVAL),
        log_every_steps=int(config.training.log_every_steps),
        timing_warmup_steps=min(steps(TIMING_WARMUP), total_steps),
        warmup_exact_steps=max(0.0, warmup_exact),
    )


@dataclasses.dataclass(frozen=True)
class LoopSchedule:
    """When the training loop logs, evaluates, saves and stops (not the learning rate's schedule: optim.py).

    "Every N steps" means after each step that is a multiple of N (0: never) and after the last step.

    Attributes:
      total_steps: the run's last step.
      log_every_steps: steps between log points (fetches of the training metrics).
      log_every_sec: seconds after which a step is a log point too, however few steps the last one was
        (0: never); a run of slow steps still shows progress.
      eval_every_steps: steps between evaluations, where `eval_after_steps` is None.
      eval_after_steps: MLPerf mode: exactly the steps an evaluation follows (`eval_steps_by_epochs`).
      checkpoint_every_steps: steps between checkpoints.
      checkpoints: whether the run saves checkpoints at all (`checkpoint.enabled`).
      save_evaluated: every evaluated state is saved with its metrics, so the best one is kept
        (`checkpoint.keep_best`).
      stop_at_target: MLPerf mode: the run stops at the first evaluation at or above MLPerf's target, and
        a launch resumed after it trains nothing.
    """

    total_steps: int
    log_every_steps: int
    log_every_sec: float = 0.0
    eval_every_steps: int = 0
    eval_after_steps: tuple[int, ...] | None = None
    checkpoint_every_steps: int = 0
    checkpoints: bool = False
    save_evaluated: bool = False
    stop_at_target: bool = False

    def is_log_step(self, step: int, sec_since_log: float = 0.0) -> bool:
        """Whether the training metrics are fetched, checked and logged after `step`: every
        `log_every_steps`, once `sec_since_log` (since the last progress line) reaches `log_every_sec`,
        and in MLPerf mode at every evaluation too, where the run may stop."""
        return (_every(step, self.log_every_steps, self.total_steps)
                or (self.log_every_sec > 0 and sec_since_log >= self.log_every_sec)
                or (self.stop_at_target and self.is_eval_step(step)))

    def is_eval_step(self, step: int) -> bool:
        """Whether an evaluation follows `step`."""
        if self.eval_after_steps is not None:
            return step in self.eval_after_steps
        return _every(step, self.eval_every_steps, self.total_steps)

    def next_eval_after(self, step: int) -> int:
        """The first step after `step` that an evaluation follows (the last step at the latest)."""
        if self.eval_after_steps is not None:
            return next((s for s in self.eval_after_steps if s > step), self.total_steps)
        if self.eval_every_steps <= 0:
            return self.total_steps
        return min(self.total_steps, (step // self.eval_every_steps + 1) * self.eval_every_steps)

    def is_save_step(self, step: int, *, preempted: bool = False, stopped: bool = False) -> bool:
        """Whether a checkpoint is saved after `step`: every `checkpoint_every_steps`, at the end, on
        preemption, where an MLPerf-mode run stops, and after each evaluation with `save_evaluated`."""
        if not self.checkpoints:
            return False
        return (_every(step, self.checkpoint_every_steps, self.total_steps) or preempted or stopped
                or (self.save_evaluated and self.is_eval_step(step)))

    def last_step(self, start_step: int, target_reached_at: int | None = None) -> int:
        """The last step this launch trains: the run's last, or `start_step` (nothing to train) in MLPerf
        mode once an earlier launch reached the target (at step `target_reached_at`)."""
        if self.stop_at_target and target_reached_at is not None:
            return start_step
        return self.total_steps


def _every(step: int, every_steps: int, total_steps: int) -> bool:
    """Whether a periodic action runs after `step`: every `every_steps` steps (0: never) and at the end."""
    return step == total_steps or (every_steps > 0 and step % every_steps == 0)


def eval_steps_by_epochs(num_train_examples: int, global_batch_size: int, every_epochs: int,
                         total_steps: int) -> tuple[int, ...]:
    """MLPerf's evaluation points: after the first step whose images reach each multiple of `every_epochs`
    epochs (`ceil(k * every_epochs * examples / batch)`), and after the last step."""
    epoch_length = EpochLength(num_train_examples, global_batch_size)
    steps = []
    k = 1
    # math.ceil without whole_steps' tolerance: whole epochs' steps are a correctly rounded ratio of whole
    # numbers, which is exact where the ratio is whole and far from whole numbers where it is not.
    while (step := math.ceil(epoch_length.steps(k * every_epochs))) < total_steps:
        steps.append(step)
        k += 1
    return (*steps, total_steps)


def loop_schedule(config: ml_collections.ConfigDict, plan: TrainingPlan) -> LoopSchedule:
    """The run's `LoopSchedule`: the plan's intervals, or in MLPerf mode (`mlperf.enabled`) evaluations
    every `mlperf.eval_every_epochs` epochs by images seen and a stop at MLPerf's target.

    `training.log_every_sec` applies to single-process runs only: a log point checks for divergence and
    failed saves, and raises there, so every process must take the same ones; each process's clock would
    choose its own (agreeing would cost a collective per step)."""
    mlperf = bool(config.mlperf.enabled)
    return LoopSchedule(
        total_steps=plan.total_steps,
        log_every_steps=plan.log_every_steps,
        log_every_sec=float(config.training.log_every_sec) if plan.batch.num_processes == 1 else 0.0,
        eval_every_steps=plan.eval_every_steps,
        eval_after_steps=eval_steps_by_epochs(plan.num_train_examples, plan.global_batch_size,
                                              int(config.mlperf.eval_every_epochs), plan.total_steps)
        if mlperf else None,
        checkpoint_every_steps=plan.checkpoint_every_steps,
        checkpoints=bool(config.checkpoint.enabled),
        save_evaluated=bool(config.checkpoint.keep_best),
        stop_at_target=mlperf,
    )
