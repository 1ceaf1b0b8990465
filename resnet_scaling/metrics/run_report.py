"""One launch's report of a run: its clock (with goodput), its records, its metric files and its MLPerf log.

The training loop tells the report what happens (a step dispatched, a log point, an evaluation, a save, the
end), and the report keeps the accounts: evaluation and checkpoints off the training clock, a record per
log point and per evaluation (logged and written by process 0), the MLPerf log's events, and at the end the
summary. Only process 0 (`write=True`) logs at INFO and writes files; every process keeps the same clocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import jax

from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job.console import format_duration
from resnet_scaling.metrics import mlperf_log
from resnet_scaling.metrics.device import MetricsBuffer
from resnet_scaling.metrics.goodput import GoodputRecorder
from resnet_scaling.metrics.run_clock import RunClock
from resnet_scaling.metrics.summary import build_summary, write_summary
from resnet_scaling.metrics.utilisation import utilisation
from resnet_scaling.metrics.writers import MetricWriters

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """What a run's report needs of its config (`sections.read`).

    Attributes:
      target_top1: `eval.target_top1`, the top-1 whose first evaluation at or above it is timed.
      tensorboard: `training.tensorboard`: TensorBoard files beside metrics.jsonl.
      mlperf: the MLPerf log's settings.
      record: the whole config as JSON values (`sections.record`), the summary's copy.
      config_text: the config as text (ConfigDict's YAML), TensorBoard's copy.
    """

    target_top1: float
    tensorboard: bool
    mlperf: mlperf_log.MLPerfConfig
    record: Mapping[str, Any]
    config_text: str


class RunReport:
    """The accounts of one launch, resumed from a checkpoint's clocks where there is one.

    Args:
      workdir: where process 0 writes metrics.jsonl, TensorBoard files and mlperf_log.txt.
      settings: what the report needs of the run's config (`ReportConfig`).
      plan: the run's plan; schedule: when it evaluates and stops (`plan.loop_schedule`).
      mesh: the devices (named in the MLPerf log and the summary).
      goodput: this launch's goodput account, on record since the launch started; the report keeps it.
      saved_clock: the restored checkpoint's clocks (`RunClock.state_dict()`), or None.
      start_step: the step this launch starts from.
      launch_start_wall: `time.time()` when the launch started.
      write: whether this process logs at INFO and writes files (process 0).

    Attributes:
      last_step: the last step this launch trains (`LoopSchedule.last_step`).
      train_history, eval_history: a record per log point and per evaluation.
      files: name -> path of the files process 0 wrote for a person to open (after `finish`).
    """

    def __init__(self, workdir: str, settings: ReportConfig, plan: plan_lib.TrainingPlan,
                 schedule: plan_lib.LoopSchedule, mesh: jax.sharding.Mesh, goodput: GoodputRecorder, *,
                 saved_clock: Mapping[str, Any] | None, start_step: int, launch_start_wall: float,
                 write: bool) -> None:
        self._workdir, self._settings, self._plan, self._schedule, self._mesh = (
            workdir, settings, plan, schedule, mesh)
        self._goodput, self._write, self._start_step = goodput, write, start_step
        self._log = logger.info if write else logger.debug
        self._clock = RunClock(plan.global_batch_size, plan.timing_warmup_steps, settings.target_top1,
                              saved_clock, launch_start_wall, goodput)
        goodput.started(start_step)
        stopped_at = self._clock.mlperf_stop_step
        self.last_step = schedule.last_step(start_step, stopped_at)
        if schedule.stop_at_target and stopped_at is not None:
            self._log("This MLPerf-mode run reached MLPerf's target top-1 at step %d and stopped: nothing to "
                      "train.", stopped_at)
        # A launch with nothing left to train adds nothing to the MLPerf log.
        self._mlperf = mlperf_log.MLPerfLog(workdir, settings.mlperf, plan, schedule, start_step=start_step,
                                            write=write and start_step < self.last_step)
        device = mesh.devices.flat[0]
        self._mlperf.init_start(f"{mesh.size}x{device.device_kind}", launch_start_wall)
        if schedule.stop_at_target:
            points = schedule.eval_after_steps or ()
            self._log("MLPerf mode: evaluations after steps %s (every %d epochs by images seen), a stop at "
                      "the first at or above top-1 %.3f; MLPerf log %s.",
                      ", ".join(map(str, points[:3])) + (", ..." if len(points) > 3 else ""),
                      settings.mlperf.eval_every_epochs, settings.mlperf.target_top1, self._mlperf.path)
        self._buffer = MetricsBuffer()
        self._interval_first_step = start_step + 1
        self._last_line_time = time.monotonic()  # Of the last progress or evaluation line.
        self._writers: MetricWriters | None = None
        self.train_history: list[dict[str, float]] = []
        self.eval_history: list[dict[str, float]] = []
        self.files: dict[str, str] = {}

    def start(self, compile_sec: float) -> None:
        """The training loop starts: the metric files open (process 0), MLPerf's clock and the run's start."""
        if self._write:
            self._writers = MetricWriters(self._workdir, tensorboard=self._settings.tensorboard,
                                          config_text=self._settings.config_text,
                                          resume_step=self._start_step)
        self._mlperf.run_start()
        self._clock.start(compile_sec)
        self._last_line_time = time.monotonic()

    def next_batch(self, batches: Iterator[T], step: int) -> T:
        """Step `step`'s batch, the wait for it on the training clock."""
        return self._clock.next_batch(batches, step)

    def before_step(self, step: int) -> None:
        """Before step `step` is dispatched: the MLPerf log's block and epoch open."""
        self._mlperf.before_step(step)

    def after_step(self, step: int, outputs: Any) -> None:
        """After step `step` is dispatched: its metrics kept on the device until a log point, the step
        counted (`outputs` not waited for, but at the timing warm-up's end)."""
        self._mlperf.after_step(step)
        self._buffer.append(step, outputs)
        self._clock.step_dispatched(step, outputs)

    def fetch(self) -> list[dict[str, float]]:
        """The steps' metrics not fetched yet (blocks until computed): for the divergence checks."""
        return self._buffer.fetch()

    def sec_since_line(self) -> float:
        """Seconds since the last progress or evaluation line (or the loop's start): the loop logs once
        they reach `training.log_every_sec` (`LoopSchedule.is_log_step`)."""
        return time.monotonic() - self._last_line_time

    def log_point(self, step: int) -> None:
        """Closes the log interval ending at `step`: its means and timing, as a record, logged and written.

        The record's `window_steps` counts the steps its means cover; `window_since_resume` marks the first
        window of a resumed launch that is shorter than the uninterrupted run's (its means are over the
        steps since the resume only, and differ from that run's line at the same step)."""
        plan, first = self._plan, self._interval_first_step
        record = {"step": step, "epoch": plan.epoch_length.epochs(step), **self._buffer.mean(),
                  **self._clock.end_interval(first, step), "window_steps": step - first + 1}
        since_resume = self._cut_by_resume(first)
        if since_resume:
            record["window_since_resume"] = True
        self._interval_first_step = step + 1
        self._last_line_time = time.monotonic()
        self.train_history.append(record)
        if self._writers is not None:
            eta = (plan.total_steps - step) * record.get("sec_per_step", 0.0)
            logger.info("step %d/%d (epoch %.2f): loss %.4f, top1 %.3f, top5 %.3f, lr %.4g, %.1f images/sec, "
                        "ETA %s%s", step, plan.total_steps, record["epoch"], record["loss"], record["top1"],
                        record["top5"], record["learning_rate"], record.get("images_per_sec", float("nan")),
                        format_duration(eta),
                        f" (means over the {record['window_steps']} steps since the resume)"
                        if since_resume else "")
            self._writers.write(step, record)

    def _cut_by_resume(self, first_step: int) -> bool:
        """Whether the window from `first_step` began at this launch's resume, past where the uninterrupted
        run's window (every `log_every_steps`) began: a resume at step 97 with windows of 100 steps."""
        every = self._schedule.log_every_steps
        return (self._start_step > 0 and first_step == self._start_step + 1
                and (every <= 0 or self._start_step % every != 0))

    def evaluate(self, step: int, state: Any, evaluate_fn: Callable[[Any], dict[str, float] | None]
                 ) -> tuple[dict[str, float] | None, bool]:
        """One evaluation after `step`, off the training clock: `evaluate_fn(state)` (its metrics with their
        `eval_sec`; None: abandoned, a stop came in), logged, recorded, in the MLPerf log and towards
        time-to-accuracy.

        Returns:
          The evaluation's record (None if abandoned), and whether the run stops there (MLPerf mode, at
          MLPerf's target).
        """
        with self._clock.paused(wait_for=state, step=step):  # Waits for the steps dispatched first.
            self._mlperf.eval_start(step)
            metrics = evaluate_fn(state)
            if metrics is None:
                self._log("Evaluation after step %d abandoned: a stop came in.", step)
                return None, False
            record = {"step": step, **metrics}
            epoch, top1 = self._plan.epoch_length.epochs(step), record["eval_top1"]
            reached = self._clock.evaluated(step, epoch, top1)
            stops = bool(self._mlperf.eval_stop(step, top1) and self._schedule.stop_at_target)
            mlperf_stop = (f"MLPerf's target top-1 {self._settings.mlperf.target_top1:.4f} at epoch "
                           f"{self._mlperf.epoch_num(step):.3f} by images seen: the run stops (MLPerf mode)"
                           if stops else "")
            if reached:  # Both targets at one evaluation (0.76 and MLPerf's 0.759): one line, not two.
                self._log("Reached the target top-1 %.4f at step %d (epoch %.2f): %.1fs timed, %.1fs wall%s.",
                          self._settings.target_top1, step, epoch, self._clock.timed_sec(),
                          self._clock.wall_sec(), f"; and {mlperf_stop}" if mlperf_stop else "")
            self._log("eval at step %d: loss %.4f, top1 %.4f, top5 %.4f over %d images (%.1fs)", step,
                      record["eval_loss"], record["eval_top1"], record["eval_top5"], record["eval_count"],
                      record["eval_sec"])
            if stops:
                self._clock.mlperf_stop_step = step  # Saved: a launch resumed after it trains nothing.
                if not reached:
                    self._log("Reached %s.", mlperf_stop)
            self.eval_history.append(record)
            if self._writers is not None:
                self._writers.write(step, record)
        self._last_line_time = time.monotonic()
        return record, stops

    @contextlib.contextmanager
    def checkpointing(self, step: int, state: Any) -> Iterator[None]:
        """The block that saves `state` after `step`, off the training clock (counted as checkpointing)."""
        with self._clock.paused(wait_for=state, step=step, checkpoint=True):
            yield

    def clock_state(self) -> dict[str, Any]:
        """The clocks a checkpoint saves, so that a resumed launch continues them."""
        return self._clock.state_dict()

    def stop(self, state: Any, preempted: bool) -> None:
        """The loop is over: the training clock stops once the device is done, and MLPerf's clock with it."""
        self._clock.pause(wait_for=state)
        self._mlperf.run_stop(mlperf_log.ABORTED if preempted else None)

    def finish(self, final_step: int, *, preempted: bool, compile_sec: float,
               flops_per_device: float | None) -> dict[str, Any]:
        """The run's headline figures in `metrics.summary`'s schema, written to summary.json by process 0
        (`files` then names it, with the TensorBoard folder)."""
        self._clock.record(final_step)
        result = self._summary(final_step, preempted, compile_sec, flops_per_device)
        if self._write:
            self.files["summary"] = write_summary(self._workdir, result)
            if self._writers is not None and self._writers.tensorboard_dir:
                self.files["TensorBoard"] = self._writers.tensorboard_dir
        return result

    def _summary(self, final_step: int, preempted: bool, compile_sec: float,
                 flops_per_device: float | None) -> dict[str, Any]:
        plan, mesh = self._plan, self._mesh
        device = mesh.devices.flat[0]
        throughput = self._clock.throughput_summary(final_step)
        images_per_sec = throughput["images_per_sec"]
        throughput["images_per_sec_per_device"] = images_per_sec / mesh.size if images_per_sec else None
        # MFU from the steady-state mean step time (all timed seconds / timed steps), not a percentile.
        sec_per_step = (throughput["steady_state_sec"] / throughput["steady_state_steps"]
                        if images_per_sec else None)
        return build_summary(
            run={"devices": mesh.size, "device_kind": device.device_kind, "platform": device.platform,
                 "process_count": jax.process_count(), "global_batch_size": plan.global_batch_size,
                 "per_device_batch_size": plan.per_device_batch_size, "steps_per_epoch": plan.steps_per_epoch,
                 "start_step": self._start_step, "final_step": final_step, "total_steps": plan.total_steps,
                 "timing_warmup_steps": plan.timing_warmup_steps, "preempted": preempted},
            throughput=throughput,
            time=self._clock.time_summary(compile_sec),
            accuracy=self._clock.accuracy_summary(),
            utilisation=utilisation(flops_per_device, sec_per_step, mesh.size, device.device_kind),
            goodput=self._goodput.summary(),
            mlperf=self._mlperf.summary(),
            config=dict(self._settings.record))

    def close(self) -> None:
        """MLPerf's run_stop(aborted) if an error ended the run; the metric files closed."""
        self._mlperf.close()
        if self._writers is not None:
            self._writers.close()
