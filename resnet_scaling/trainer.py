"""`train_and_evaluate(config, workdir)`: the training loop over what `training_setup.setup` builds.

The only module that decides who writes: process 0 logs and writes metric files; every process trains.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from resnet_scaling import checkpointing, console, steps, training_setup
from resnet_scaling import data as data_lib
from resnet_scaling import metrics as metrics_lib
from resnet_scaling import plan as plan_lib
from resnet_scaling import workdir as workdir_lib
from resnet_scaling.analysis import compiled as compiled_lib
from resnet_scaling.checkpointing import divergence, preemption
from resnet_scaling.errors import RunError
from resnet_scaling.metrics import mlperf_log, profiling
from resnet_scaling.metrics.summary import SUMMARY_FILENAME
from resnet_scaling.resilience import distributed

logger = logging.getLogger(__name__)

# Steps the host may dispatch ahead of the devices (see `StepsInFlight`).
MAX_STEPS_AHEAD = 2


class StepHook(Protocol):
    """What runs around every train step's dispatch: `before_step` in the hooks' order, `after_step` (with
    the new state and the step's outputs, not yet computed) and `close` (at the end, or on an error) in
    the reverse order, so that the hooks nest. A subclass overrides only what it needs."""

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int, state: Any, outputs: Any) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass
class TrainResult:
    """What a run leaves behind.

    Attributes:
      train_history: one record per log point (step, loss, top1, top5, images_per_sec, ...).
      eval_history: one record per evaluation (step, eval_loss, eval_top1, eval_top5, eval_count).
      start_step: the step the run started from (> 0 when it resumed from a checkpoint).
      preempted: whether it stopped early on SIGTERM after saving a checkpoint.
      summary: the headline figures (`metrics.summary`'s schema), as in summary.json.
    """

    state: steps.TrainState
    plan: plan_lib.TrainingPlan
    train_history: list[dict[str, float]]
    eval_history: list[dict[str, float]]
    compile_sec: float
    start_step: int = 0
    preempted: bool = False
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)


def evaluate(eval_step_fn: Any, state: steps.TrainState, source: data_lib.DataSource) -> dict[str, float]:
    """Runs one exact pass over the evaluation split; sums stay on the device until the end."""
    totals = None
    for batch in source.eval_batches():
        sums = eval_step_fn(state, batch)
        totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    if totals is None:
        raise ValueError("The evaluation split is empty.")
    return metrics_lib.summarize_eval(jax.device_get(totals))


def timed_evaluate(eval_step_fn: Any, state: steps.TrainState, source: data_lib.DataSource
                   ) -> dict[str, float]:
    """`evaluate`'s metrics and its wall time, `eval_sec` (kept out of `evaluate`, whose result every
    process agrees on)."""
    start = time.perf_counter()
    metrics = evaluate(eval_step_fn, state, source)
    return {**metrics, "eval_sec": time.perf_counter() - start}


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    devices: list[jax.Device] | None = None,
) -> TrainResult:
    """Trains and evaluates a ResNet as `config` describes, resuming from `workdir` if it holds a checkpoint.

    Args:
      config: a config from `configs/` or `config.get_base_config()`; validated here.
      workdir: where checkpoints (every process) and metric files (process 0) go.
      arrays: `(train_images, train_labels, eval_images, eval_labels)` NumPy arrays for
        `config.data.source == "arrays"`; images uint8 NHWC, labels integers.
      devices: devices for the mesh (default: all of the job's).

    Raises:
      RunError: what a user can fix (`errors.py`). A full or read-only disk is a `WorkdirError` or a
        `CheckpointSaveError`, naming the cause and the last complete checkpoint.
    """
    launch_start_wall = time.time()  # Goodput counts this launch's set-up as initialisation.
    console.show_progress()
    # The cheap checks first, in about a second: the slow set-up (devices, data, compilation) comes after.
    workdir_lib.check_writable(workdir)
    if config.checkpoint.enabled and (saved := checkpointing.latest_saved_meta(workdir)) is not None:
        checkpointing.check_compatible(saved["config"], config,
                                       str(workdir_lib.as_path(workdir) / "checkpoints"))
    with _locked_workdir(workdir):
        try:
            return _train(config, workdir, arrays, devices, launch_start_wall)
        except Exception as e:
            # Any write may be the first to meet a full disk; orbax wraps the OSError in a ValueError.
            if isinstance(e, RunError) or not workdir_lib.is_storage_full(e):
                raise
            last = max(checkpointing.complete_steps(workdir), default=None)
            raise workdir_lib.WorkdirError(
                f"Writing to the workdir {workdir} failed: {workdir_lib.describe_os_error(e)}. "
                f"{checkpointing.where_to_resume(last, str(workdir_lib.as_path(workdir) / 'checkpoints'))}"
            ) from e


@contextlib.contextmanager
def _locked_workdir(workdir: str) -> Iterator[None]:
    """Process 0 holds the workdir's lock for the block; every process learns whether it got it."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = workdir_lib.WorkdirLock(workdir)
            lock.acquire()
        except workdir_lib.WorkdirError as e:
            lock, error = None, e
    if jax.process_count() > 1:
        locked = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
        if not locked and error is None:
            error = workdir_lib.WorkdirError(f"Process 0 could not lock the workdir {workdir}: see its log.")
    if error is not None:
        raise error
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _train(config: ml_collections.ConfigDict, workdir: str,
           arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
           devices: list[jax.Device] | None, launch_start_wall: float) -> TrainResult:
    is_writer = jax.process_index() == 0
    # On record from the launch's first moment: one that dies in its set-up still counts in goodput.
    goodput = metrics_lib.GoodputRecorder(workdir, None, launch_start_wall, write=is_writer)
    try:
        run = training_setup.setup(config, devices=devices, arrays=arrays)
    except RunError:
        goodput.forget()  # A refused config or dataset: not a launch of the run.
        raise
    plan, source, state = run.plan, run.source, run.state
    log = logger.info if is_writer else logger.debug
    _log_setup(log, run)
    checkpointer = (checkpointing.Checkpointer(workdir, config, class_names=source.class_names)
                    if config.checkpoint.enabled else None)
    state, saved_meta = _restore(checkpointer, state, plan, log)
    start_step = int(state.step)
    if start_step >= plan.total_steps and checkpointer is not None:
        try:
            finished = _already_finished(workdir, run, state, checkpointer, log)
        except RunError:
            goodput.forget()
            raise
        if finished is not None:
            goodput.forget()
            return finished
    if is_writer:  # After the checks above: config.json never records settings that trained no step.
        _write_config(workdir, config)
        # Beside the checkpoints, which then need no copy each: the best weights' predictions are named too.
        checkpointing.write_class_names(workdir, source.class_names)
    saved_clock = saved_meta.get("clock") if saved_meta else None
    if is_writer and saved_meta:
        _record_changes_on_resume(workdir, saved_meta, config, start_step)
    clock = metrics_lib.RunClock(plan.global_batch_size, plan.timing_warmup_steps, config.eval.target_top1,
                                 saved_clock, launch_start_wall, goodput)
    goodput.started(start_step)

    mlperf_mode = bool(config.mlperf.enabled)
    mlperf, schedule, last_step = _open_mlperf_log(run, workdir, clock, start_step, launch_start_wall, log,
                                                   write=is_writer)
    # MLPerf: no training data before run_start; the step compiles on the batch's shapes.
    batches = None if mlperf_mode else source.train_batches(start_step=start_step)
    batch = None if batches is None else next(batches)
    train_step_fn, compile_sec = run.compile_train_step(state, batch)
    _log_compiled(log, train_step_fn, compile_sec)
    result = TrainResult(state=state, plan=plan, train_history=[], eval_history=[], compile_sec=compile_sec,
                         start_step=start_step)
    records = _Records(result, clock, metrics_lib.MetricWriters(
        workdir, tensorboard=config.training.tensorboard, config_text=str(config), resume_step=start_step)
        if is_writer else None)
    watcher = preemption.PreemptionWatcher()
    hooks: tuple[StepHook, ...] = (
        records,
        mlperf,
        profiling.StepWindowProfiler(config.training.profile_steps,
                                     str(workdir_lib.as_path(workdir) / "tensorboard"), enabled=is_writer),
        StepsInFlight(MAX_STEPS_AHEAD))
    guard = divergence.DivergenceGuard(state, start_step, config.training.max_param_norm_growth, checkpointer)
    mlperf.run_start()
    clock.start(compile_sec)
    stopped = False  # MLPerf mode: an evaluation reached MLPerf's target.
    try:
        if batches is None:
            batches = source.train_batches(start_step=start_step)
        for step in range(start_step + 1, last_step + 1):  # `step` counts the steps done after it.
            if batch is None or step > start_step + 1:
                batch = clock.next_batch(batches, step)
            for hook in hooks:
                hook.before_step(step)
            state, step_metrics = train_step_fn(state, batch)
            for hook in reversed(hooks):
                hook.after_step(step, state, step_metrics)
            clock.step_dispatched(step, step_metrics)
            last = step == plan.total_steps
            eval_due = schedule.due(step)
            # MLPerf mode may stop at any evaluation: its steps are log points too.
            if _due(step, plan.log_every_steps, last) or (mlperf_mode and eval_due):
                guard.check_losses(records.fetch())
                if checkpointer is not None:
                    checkpointer.check_saves()  # A failed background save ends the run now, not later.
                # For the peer watchdog's message if a process is lost.
                distributed.report_progress(step, checkpointer.committed_step() if checkpointer else None)
                records.log_point(step)
            eval_metrics = None
            if eval_due:
                with clock.paused(wait_for=state, step=step):  # Evaluation stays off the training clock.
                    eval_metrics, stopped = _evaluate_and_track(run, state, step, clock, mlperf, log)
                    records.evaluation(step, eval_metrics)
            result.preempted = watcher.reached(step)
            # Every evaluated state is saved with its metrics: the best evaluation's checkpoint is kept.
            save_due = (_due(step, plan.checkpoint_every_steps, last) or result.preempted or stopped
                        or (eval_due and config.checkpoint.keep_best))
            if checkpointer is not None and save_due:
                with clock.paused(wait_for=state, step=step, checkpoint=True):  # Off the training clock too.
                    # A checkpoint never holds a diverged state.
                    guard.check_losses(records.fetch())
                    guard.check_state(step, state)
                    checkpointer.save(step, state, clock.state_dict(), eval_metrics)
            if result.preempted:
                log("Preempted (%s) at step %d: %s. Run the same command to resume.", watcher.signal_name,
                    step,
                    f"checkpoint saved in {checkpointer.directory}" if checkpointer else
                    "checkpoints are off (config.checkpoint.enabled), nothing was saved")
                break
            if stopped:
                break
        clock.pause(wait_for=state)
        mlperf.run_stop(mlperf_log.ABORTED if result.preempted else None)
        # A launch that ran no step keeps an existing export (its config.json would record unused settings).
        ran_a_step = int(state.step) > start_step
        if (checkpointer is not None and not result.preempted and config.checkpoint.export
                and (ran_a_step or not checkpointer.has_export())):
            log("Exported the final parameters to %s.", checkpointer.export(state))
        result.state = state
        clock.record(int(state.step))
        result.summary = _summary(run, clock, goodput, result, compiled_lib.flops_per_device(train_step_fn),
                                  mlperf.summary())
        if is_writer:
            _write_summary_and_headline(workdir, result, records.tensorboard_dir, checkpointer)
    finally:
        for hook in reversed(hooks):
            hook.close()  # The MLPerf log's run_stop(aborted) if an error ended the run.
        watcher.close()
        if batches is not None:
            batches.close()  # Ends the input pipeline now, not when the garbage collector frees it.
        if checkpointer is not None:
            checkpointer.close()  # Waits for saves under way: nothing started is lost.
    return result


def _already_finished(workdir: str, run: training_setup.TrainingSetup, state: steps.TrainState,
                      checkpointer: checkpointing.Checkpointer, log: Callable[..., None]
                      ) -> TrainResult | None:
    """A checkpoint past this run's last step is refused (a run cannot train backwards); one at it gives the
    finished run's result from its summary.json, or None when that cannot be read (the run then writes it)."""
    step, total = int(state.step), run.plan.total_steps
    if step > total:
        checkpointer.close()
        raise plan_lib.ConfigError(
            f"The newest checkpoint in {checkpointer.directory} is at step {step}, past this run's {total} "
            f"steps (training.num_train_steps, num_examples or num_epochs): ask for at least {step} steps to "
            "go on from it, or use another --workdir.")
    summary_path = workdir_lib.as_path(workdir) / SUMMARY_FILENAME
    summary = workdir_lib.read_json(summary_path, "the run writes it again.")
    usable = isinstance(summary, dict) and (summary.get("run") or {}).get("final_step") == total
    if jax.process_count() > 1:  # Every process takes the same way out: process 0's.
        usable = bool(multihost_utils.broadcast_one_to_all(np.int32(usable)))
    if not usable:
        return None
    checkpointer.close()
    log("Nothing to train: this workdir's run finished at step %d of %d. Its summary (%s) is left as it "
        "was; use another --workdir, or more steps, to train again.", step, total, summary_path)
    return TrainResult(state=state, plan=run.plan, train_history=[], eval_history=[], compile_sec=0.0,
                       start_step=step, summary=summary if isinstance(summary, dict) else {})


def _open_mlperf_log(run: training_setup.TrainingSetup, workdir: str, clock: metrics_lib.RunClock,
                     start_step: int, launch_start_wall: float, log: Callable[..., None], *, write: bool
                     ) -> tuple[mlperf_log.MLPerfLog, mlperf_log.EvalSchedule, int]:
    """The launch's MLPerf log (init events logged), the evaluation schedule and the last step to train."""
    config, plan = run.config, run.plan
    last_step = plan.total_steps
    if config.mlperf.enabled and clock.mlperf_stop_step is not None:
        log("This MLPerf-mode run reached MLPerf's target top-1 at step %d and stopped: nothing to train.",
            clock.mlperf_stop_step)
        last_step = start_step
    schedule = mlperf_log.eval_schedule(config, plan)
    # A launch with nothing left to train adds nothing to the MLPerf log.
    mlperf = mlperf_log.MLPerfLog(workdir, config, plan, schedule, write=write and start_step < last_step,
                                  start_step=start_step)
    device = run.mesh.devices.flat[0]
    mlperf.init_start(config, f"{run.mesh.size}x{device.device_kind}", launch_start_wall)
    if config.mlperf.enabled:
        log("MLPerf mode: evaluations after steps %s (every %d epochs by images seen), a stop at the first "
            "at or above top-1 %.3f; MLPerf log %s.",
            ", ".join(map(str, schedule.steps[:3])) + (", ..." if len(schedule.steps) > 3 else ""),
            config.mlperf.eval_every_epochs, config.mlperf.target_top1, mlperf.path)
    return mlperf, schedule, last_step


def _restore(checkpointer: checkpointing.Checkpointer | None, state: steps.TrainState,
             plan: plan_lib.TrainingPlan, log: Callable[..., None]) -> tuple[steps.TrainState, Any]:
    """The newest checkpoint's state and its record (step, config, clocks), or `state` and None."""
    restored = checkpointer.restore_latest(_abstract(state)) if checkpointer is not None else None
    if restored is None:
        return state, None
    state, meta = restored
    log("Resumed from %s at step %d (epoch %.2f).", checkpointer.directory, int(state.step),
        plan.epochs_at(int(state.step)))
    return state, meta


def _log_compiled(log: Callable[..., None], compiled: Any, compile_sec: float) -> None:
    memory = compiled_lib.memory_per_device(compiled)
    cache = jax.config.jax_compilation_cache_dir  # Set by the command line (train.py), after validation.
    log("Compiled the train step in %.1fs%s%s.", compile_sec,
        "" if memory is None else f", {memory['total'] / 2**20:.0f} MiB per device",
        f"; compilation cache {cache}" if cache else "")


def _write_summary_and_headline(workdir: str, result: TrainResult, tensorboard_dir: str | None,
                                checkpointer: checkpointing.Checkpointer | None) -> None:
    """Process 0's end of a run: summary.json, then the closing headline naming where everything is."""
    paths = {"summary": metrics_lib.write_summary(workdir, result.summary)}
    if tensorboard_dir:
        paths["TensorBoard"] = tensorboard_dir
    if checkpointer is not None:
        config = result.summary["config"]
        paths.update(checkpointer.paths(exported=not result.preempted and config["checkpoint"]["export"]))
    for line in console.headline(result.summary, paths):
        logger.info("%s", line)


def _record_changes_on_resume(workdir: str, saved_meta: dict[str, Any], config: ml_collections.ConfigDict,
                              step: int) -> None:
    """Logs the settings that differ from the checkpoint's run, and appends them to config_changes.jsonl."""
    if "run_config" not in saved_meta:  # Checkpoints of earlier versions record only the shapes' fields.
        return
    changes = checkpointing.changed_on_resume(saved_meta["run_config"], config)
    if not changes:
        return
    logger.warning("Resuming at step %d with changed settings: %s.", step,
                   "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    path = workdir_lib.as_path(workdir) / "config_changes.jsonl"
    try:
        previous = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        workdir_lib.set_aside(path, f"cannot be read ({workdir_lib.describe_os_error(e)})",
                              "the changes are recorded in a new one.")
        previous = ""
    record = {"step": step, "time": time.time(), "changes": changes}
    path.write_text(previous + json.dumps(record) + "\n")


def _write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    """WORKDIR/config.json: the config of the run's latest launch (the console shows it only when asked)."""
    workdir_lib.write_text_atomically(workdir_lib.as_path(workdir) / "config.json",
                                      config.to_json_best_effort(indent=2) + "\n")


def _abstract(state: steps.TrainState) -> Any:
    """The state's shapes, dtypes and shardings: what a checkpoint is restored into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _log_setup(log: Callable[..., None], run: training_setup.TrainingSetup) -> None:
    plan, mesh, config = run.plan, run.mesh, run.config
    device = mesh.devices.flat[0]
    processes = jax.process_count()
    log("Devices: %d x %s in %d process%s; mesh axes %s.", mesh.size, device.device_kind, processes,
        "" if processes == 1 else "es", dict(mesh.shape))
    log("Batch: %d global, %d per device; %d steps (%d per epoch, %.2f epochs); learning rate %.4g at its "
        "peak after %d warm-up steps.", plan.global_batch_size, plan.per_device_batch_size, plan.total_steps,
        plan.steps_per_epoch, plan.epochs_at(plan.total_steps), plan.peak_learning_rate, plan.warmup_steps)
    log("Timing: images/sec and time to accuracy are measured after step %d (training.timing_warmup_*).",
        plan.timing_warmup_steps)
    log("Model: %s, %s parameters, compute dtype %s.", config.model.name, f"{run.num_params:,}",
        config.model.compute_dtype)


class _Records(StepHook):
    """A step hook: each step's metrics kept on the device until a log point; a record per log point and
    per evaluation, kept in the result and, with `writers` (process 0), logged and written."""

    def __init__(self, result: TrainResult, clock: metrics_lib.RunClock,
                 writers: metrics_lib.MetricWriters | None) -> None:
        self._result, self._clock, self._writers = result, clock, writers
        self._buffer = metrics_lib.MetricsBuffer()
        self._interval_first_step = result.start_step + 1
        self.tensorboard_dir = writers.tensorboard_dir if writers is not None else None

    def after_step(self, step: int, state: Any, outputs: Any) -> None:
        self._buffer.append(step, outputs)

    def fetch(self) -> list[dict[str, float]]:
        """The steps' metrics not fetched yet (blocks until computed): for the divergence checks."""
        return self._buffer.fetch()

    def log_point(self, step: int) -> None:
        """Closes the log interval ending at `step`: its means and timing, as a record."""
        plan = self._result.plan
        record = {"step": step, "epoch": plan.epochs_at(step), **self._buffer.mean(),
                  **self._clock.end_interval(self._interval_first_step, step)}
        self._interval_first_step = step + 1
        self._result.train_history.append(record)
        if self._writers is not None:
            eta = (plan.total_steps - step) * record.get("sec_per_step", 0.0)
            logger.info("step %d/%d (epoch %.2f): loss %.4f, top1 %.3f, top5 %.3f, lr %.4g, %.1f images/sec, "
                        "ETA %s", step, plan.total_steps, record["epoch"], record["loss"], record["top1"],
                        record["top5"], record["learning_rate"], record.get("images_per_sec", float("nan")),
                        metrics_lib.format_duration(eta))
            self._writers.write(step, record)

    def evaluation(self, step: int, eval_metrics: dict[str, float]) -> None:
        self._result.eval_history.append(eval_metrics)
        if self._writers is not None:
            self._writers.write(step, eval_metrics)

    def close(self) -> None:
        if self._writers is not None:
            self._writers.close()


def _evaluate_and_track(run: training_setup.TrainingSetup, state: steps.TrainState, step: int,
                        clock: metrics_lib.RunClock, mlperf: mlperf_log.MLPerfLog, log: Callable[..., None]
                        ) -> tuple[dict[str, float], bool]:
    """One exact evaluation after `step`, logged, in the MLPerf log and on the clock; and whether the run
    stops there (MLPerf mode, at its target)."""
    plan, config, target = run.plan, run.config, run.config.eval.target_top1
    mlperf.eval_start(step)
    eval_metrics = {"step": step, **timed_evaluate(run.eval_step, state, run.source)}
    epoch = plan.epochs_at(step)
    top1 = eval_metrics["eval_top1"]
    if clock.evaluated(step, epoch, top1):
        log("Reached the target top-1 %.4f at step %d (epoch %.2f): %.1fs timed, %.1fs wall.", target, step,
            epoch, clock.timed_sec(), clock.wall_sec())
    log("eval at step %d: loss %.4f, top1 %.4f, top5 %.4f over %d images (%.1fs)", step,
        eval_metrics["eval_loss"], eval_metrics["eval_top1"], eval_metrics["eval_top5"],
        eval_metrics["eval_count"], eval_metrics["eval_sec"])
    stops = bool(mlperf.eval_stop(step, top1) and config.mlperf.enabled)
    if stops:
        clock.mlperf_stop_step = step
        log("Reached MLPerf's target top-1 %.4f at epoch %.3f by images seen: the run stops (MLPerf mode).",
            config.mlperf.target_top1, mlperf.epoch_num(step))
    return eval_metrics, stops


def _summary(run: training_setup.TrainingSetup, clock: metrics_lib.RunClock,
             goodput: metrics_lib.GoodputRecorder, result: TrainResult,
             flops_per_device: float | None, mlperf: dict[str, Any]) -> dict[str, Any]:
    """The run's headline figures in `metrics.summary`'s schema."""
    plan, mesh = run.plan, run.mesh
    device = mesh.devices.flat[0]
    final_step = int(result.state.step)
    throughput = clock.throughput_summary(final_step)
    images_per_sec = throughput["images_per_sec"]
    throughput["images_per_sec_per_device"] = images_per_sec / mesh.size if images_per_sec else None
    # MFU from the steady-state mean step time (all timed seconds / timed steps), not a percentile.
    sec_per_step = (throughput["steady_state_sec"] / throughput["steady_state_steps"]
                    if images_per_sec else None)
    return metrics_lib.build_summary(
        run={"devices": mesh.size, "device_kind": device.device_kind, "platform": device.platform,
             "process_count": jax.process_count(), "global_batch_size": plan.global_batch_size,
             "per_device_batch_size": plan.per_device_batch_size, "steps_per_epoch": plan.steps_per_epoch,
             "start_step": result.start_step, "final_step": final_step, "total_steps": plan.total_steps,
             "timing_warmup_steps": plan.timing_warmup_steps, "preempted": result.preempted},
        throughput=throughput,
        time=clock.time_summary(result.compile_sec),
        accuracy=clock.accuracy_summary(),
        utilisation=metrics_lib.utilisation(flops_per_device, sec_per_step, mesh.size, device.device_kind),
        goodput=goodput.summary(),
        mlperf=mlperf,
        config=run.config.to_dict())


def _due(step: int, every_steps: int, last: bool) -> bool:
    """Whether a periodic action (log, evaluate, save) runs after `step`: every N steps and at the end."""
    return last or (every_steps > 0 and step % every_steps == 0)


class StepsInFlight(StepHook):
    """A step hook that, after step k is dispatched, blocks until step k-`max_steps_ahead` is done: the
    devices stay fed, and a SIGTERM is acted on within about N+1 step times, not a whole log interval."""

    def __init__(self, max_steps_ahead: int) -> None:
        self._max_steps_ahead = max_steps_ahead
        self._in_flight: collections.deque[Any] = collections.deque()

    def after_step(self, step: int, state: Any, outputs: Any) -> None:
        self._in_flight.append(outputs)
        if len(self._in_flight) > self._max_steps_ahead:
            jax.block_until_ready(self._in_flight.popleft())

    def close(self) -> None:
        self._in_flight.clear()
