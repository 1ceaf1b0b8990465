"""`train_and_evaluate(config, workdir)`: the training loop over what `training_setup.setup` builds.

The loop (`_train`) works with six collaborators: the batches, the compiled train step, the run's report
(clock, records, goodput, metric files, MLPerf log: `metrics/run_report.py`), the step hooks (a profile
window, the bound on steps in flight), the checkpoints (the checkpointer with its divergence and preemption
guards) and the schedule (`plan.LoopSchedule`: when to log, evaluate, save and stop).

The only module that decides who writes: process 0 logs and writes metric files; every process trains.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from resnet_scaling import checkpointing
from resnet_scaling import data as data_lib
from resnet_scaling import metrics as metrics_lib
from resnet_scaling.checkpointing import divergence, preemption
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.config import recipes
from resnet_scaling.job import console, stopping
from resnet_scaling.job import workdir as workdir_lib
from resnet_scaling.job.errors import RunError
from resnet_scaling.metrics import compiled as compiled_lib
from resnet_scaling.metrics import profiling, run_report
from resnet_scaling.metrics import summary as summary_lib
from resnet_scaling.training import sections as sections_lib
from resnet_scaling.training import steps, training_setup

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


@dataclasses.dataclass(repr=False)
class TrainResult:
    """What a run leaves behind; `print(result)` shows the run's closing headline, not its arrays.

    Attributes:
      train_history: one record per log point (step, loss, top1, top5, images_per_sec, ...).
      eval_history: one record per evaluation (step, eval_loss, eval_top1, eval_top5, eval_count).
      start_step: the step the run started from (> 0 when it resumed from a checkpoint).
      preempted: whether it stopped early on SIGTERM after saving a checkpoint.
      summary: the headline figures (`metrics.summary`'s schema), as in summary.json.
      files: name -> path of what the run wrote (summary, checkpoints, exported weights; process 0).
    """

    state: steps.TrainState
    plan: plan_lib.TrainingPlan
    train_history: list[dict[str, float]]
    eval_history: list[dict[str, float]]
    compile_sec: float
    start_step: int = 0
    preempted: bool = False
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, str] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        final = self.eval_history[-1]["eval_top1"] if self.eval_history else None
        return (f"TrainResult(step {int(self.state.step)} of {self.plan.total_steps}, final top-1 "
                f"{'n/a' if final is None else f'{100 * final:.2f}%'}, {len(self.train_history)} training "
                f"and {len(self.eval_history)} evaluation records; print() it for the headline)")

    def __str__(self) -> str:
        try:
            lines = summary_lib.headline(self.summary, self.files)
        except (KeyError, TypeError):  # No summary (a result made by hand): the one-line form.
            lines = [repr(self)]
        records = (f"  records: {len(self.train_history)} training (.train_history), "
                   f"{len(self.eval_history)} evaluation (.eval_history); also .state, .plan")
        return "\n".join([*lines, records])


def evaluate(eval_step_fn: Any, state: steps.TrainState, source: data_lib.DataSource, *,
             abandon: Callable[[], bool] | None = None) -> dict[str, float] | None:
    """Runs one exact pass over the evaluation split; sums stay on the device until the end.

    Args:
      abandon: asked before each batch; True ends the pass early (a stop came in), returning None. Every
        process must get the same answers (a single process's run only).
    """
    totals = None
    with contextlib.closing(source.eval_batches()) as batches:
        for batch in batches:
            if abandon is not None and abandon():
                return None
            sums = eval_step_fn(state, batch)
            totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    if totals is None:
        raise ValueError("The evaluation split is empty.")
    return metrics_lib.summarize_eval(jax.device_get(totals))


def timed_evaluate(eval_step_fn: Any, state: steps.TrainState, source: data_lib.DataSource, *,
                   abandon: Callable[[], bool] | None = None) -> dict[str, float] | None:
    """`evaluate`'s metrics and its wall time, `eval_sec` (kept out of `evaluate`, whose result every
    process agrees on); None if it was abandoned."""
    start = time.perf_counter()
    metrics = evaluate(eval_step_fn, state, source, abandon=abandon)
    return None if metrics is None else {**metrics, "eval_sec": time.perf_counter() - start}


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
    resolution = recipes.resolve(config)  # The commands' configs come resolved; research code's may not.
    recipes.log_resolution(resolution)
    config = resolution.config
    # The cheap checks first, in about a second: the slow set-up (devices, data, compilation) comes after.
    workdir_lib.check_writable(workdir)
    saved = checkpointing.latest_saved_meta(workdir) if config.checkpoint.enabled else None
    if saved is not None:
        checkpointing.check_compatible(saved["config"], sections_lib.record(config),
                                       str(workdir_lib.as_path(workdir) / "checkpoints"))
    # What a stop before the first step leaves (`stopping`): the newest checkpoint, untouched.
    stopping.set_safe(f"its checkpoint of step {saved['step']} is intact; rerun the same command to resume"
                      if saved is not None else
                      "nothing to save before the first step; rerun the same command to start")
    with _locked_workdir(workdir):
        try:
            return _train(functools.partial(training_setup.setup, config, devices=devices, arrays=arrays),
                          workdir, launch_start_wall)
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
        with stopping.on_stop(lock.release) if lock is not None else contextlib.nullcontext():
            yield
    finally:
        if lock is not None:
            lock.release()


def _train(build: Callable[[], training_setup.TrainingSetup], workdir: str,
           launch_start_wall: float) -> TrainResult:
    """Sets the launch up (`build()`: the run's `setup`), then trains its steps, evaluating, saving and
    stopping as the schedule says."""
    with stopping.phase("setting up the run"):  # The phases inside say more.
        launch = _launch(build, workdir, launch_start_wall)
        if isinstance(launch, TrainResult):
            return launch  # The workdir's run had already finished.
        schedule, report, state, start_step = launch.schedule, launch.report, launch.state, launch.start_step
        batches, batch, train_step = launch.batches, launch.first_batch, launch.train_step
        parts = launch.run.sections
        checkpoints = _Checkpoints(launch.checkpointer, state, start_step, launch.log,
                                   export=parts.checkpoint.export,
                                   max_param_norm_growth=parts.loop.max_param_norm_growth)
        hooks = _step_hooks(parts.loop.profile_steps, workdir, write=launch.is_writer)
    report.start(launch.compile_sec)
    preempted = stopped = False  # stopped: MLPerf mode, an evaluation reached MLPerf's target.
    files: dict[str, str] = {}  # What process 0 wrote, named in the headline.
    # From here a stop keeps what was trained: the loop saves at the next step and ends.
    with stopping.phase("training", then="saving a checkpoint after the current step, then stopping"):
        try:
            if launch.evaluation_pending:  # A stop abandoned the evaluation of the checkpoint's step.
                _, stopped = _evaluate(start_step, state, launch, checkpoints)
            if batches is None and not stopped:  # MLPerf mode: no training data before run_start.
                batches = launch.train_batches()
            last_step = start_step if stopped else report.last_step  # stopped: MLPerf's target, reached.
            for step in range(start_step + 1, last_step + 1):  # `step` counts the steps done after it.
                if batch is None or step > start_step + 1:
                    batch = report.next_batch(batches, step)
                report.before_step(step)
                for hook in hooks:
                    hook.before_step(step)
                state, outputs = train_step(state, batch)
                for hook in reversed(hooks):
                    hook.after_step(step, state, outputs)
                report.after_step(step, outputs)
                if schedule.is_log_step(step, report.sec_since_line()):
                    checkpoints.check(report.fetch())  # A diverged run or a failed save ends here.
                    report.log_point(step)
                eval_metrics = None
                if schedule.is_eval_step(step):
                    eval_metrics, stopped = _evaluate(step, state, launch, checkpoints)
                preempted = checkpoints.preempted(step)
                if schedule.is_save_step(step, preempted=preempted, stopped=stopped):
                    _save(step, state, eval_metrics, report, checkpoints,
                          evaluation_pending=schedule.is_eval_step(step) and eval_metrics is None)
                if preempted:
                    checkpoints.log_preempted(step)
                if preempted or stopped:
                    break
            report.stop(state, preempted)
            with stopping.phase("exporting the final parameters", then="finishing the export, then stopping"):
                checkpoints.export(state, ran_a_step=int(state.step) > start_step, preempted=preempted)
            summary = report.finish(int(state.step), preempted=preempted, compile_sec=launch.compile_sec,
                                    flops_per_device=compiled_lib.flops_per_device(train_step))
            if launch.is_writer:
                files = {**report.files, **checkpoints.paths(preempted)}
                _log_headline(summary, files)
        finally:
            for hook in reversed(hooks):
                hook.close()
            report.close()  # The MLPerf log's run_stop(aborted) if an error ended the run.
            checkpoints.close_watcher()
            if batches is not None:
                batches.close()  # Ends the input pipeline now, not when the garbage collector frees it.
            checkpoints.close()  # Waits for saves under way: nothing started is lost.
    return TrainResult(state=state, plan=launch.run.plan, train_history=report.train_history,
                       eval_history=report.eval_history, compile_sec=launch.compile_sec,
                       start_step=start_step, preempted=preempted, summary=summary, files=files)


def _evaluate(step: int, state: steps.TrainState, launch: _Launch, checkpoints: _Checkpoints
              ) -> tuple[dict[str, float] | None, bool]:
    """The loop's evaluation after `step` (`RunReport.evaluate`), abandoned if a stop comes in."""
    with stopping.phase(f"evaluating after step {step}", then=checkpoints.on_stop_in_evaluation):
        return launch.report.evaluate(
            step, state, functools.partial(launch.evaluate, abandon=checkpoints.stop_requested))


def _save(step: int, state: steps.TrainState, eval_metrics: dict[str, float] | None,
          report: run_report.RunReport, checkpoints: _Checkpoints, *, evaluation_pending: bool) -> None:
    """Saves `state` after `step`, off the training clock; a stop meanwhile lets the save finish."""
    with (stopping.phase(f"saving the checkpoint of step {step}", then="finishing the save, then stopping"),
          report.checkpointing(step, state)):
        checkpoints.save(step, state, report.fetch(), report.clock_state, eval_metrics,
                         evaluation_pending=evaluation_pending)


@dataclasses.dataclass
class _Launch:
    """What `_launch` sets up for the loop (see `_train`)."""

    run: training_setup.TrainingSetup
    is_writer: bool  # Process 0: logs at INFO and writes the metric files.
    log: Callable[..., None]
    state: steps.TrainState
    start_step: int
    schedule: plan_lib.LoopSchedule
    report: run_report.RunReport
    checkpointer: checkpointing.Checkpointer | None
    train_step: Any
    compile_sec: float
    batches: Iterator[Any] | None  # None in MLPerf mode until run_start (`train_batches`).
    first_batch: Any
    evaluation_pending: bool  # The restored checkpoint's evaluation was abandoned: make it first.

    def train_batches(self) -> Iterator[Any]:
        """The training batches from the start step on."""
        return self.run.source.train_batches(start_step=self.start_step)

    def evaluate(self, state: steps.TrainState, *, abandon: Callable[[], bool] | None = None
                 ) -> dict[str, float] | None:
        """One exact evaluation of `state`, with its `eval_sec`; None if `abandon()` ended it early."""
        return timed_evaluate(self.run.eval_step, state, self.run.source, abandon=abandon)


def _launch(build: Callable[[], training_setup.TrainingSetup], workdir: str,
            launch_start_wall: float) -> _Launch | TrainResult:
    """The launch's set-up (`build()`: mesh, data, state), the state restored from the newest checkpoint,
    its report and its compiled step; or the finished run's result, where the workdir's run had reached
    its last step."""
    is_writer = jax.process_index() == 0
    # On record from the launch's first moment: one that dies in its set-up still counts in goodput.
    goodput = metrics_lib.GoodputRecorder(workdir, None, launch_start_wall, write=is_writer)
    try:
        with stopping.phase("setting up the devices, the input and the model"):
            run = build()
    except RunError:
        goodput.forget()  # A refused config or dataset: not a launch of the run.
        raise
    plan, source, parts = run.plan, run.source, run.sections
    log = logger.info if is_writer else logger.debug
    _log_setup(log, run)
    checkpointer = (checkpointing.Checkpointer(workdir, parts.checkpoint, parts.record,
                                               class_names=source.class_names)
                    if parts.checkpoint.enabled else None)
    with stopping.phase("restoring the newest checkpoint"):
        state, saved_meta = _restore(checkpointer, run.state, plan, log)
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
        _write_config(workdir, parts.record)
        # Beside the checkpoints, which then need no copy each: the best weights' predictions are named too.
        checkpointing.write_class_names(workdir, source.class_names)
        if saved_meta:
            _record_changes_on_resume(workdir, saved_meta, parts.record, start_step)
    schedule = run.schedule
    report = run_report.RunReport(workdir, parts.report, plan, schedule, run.mesh, goodput,
                                  saved_clock=saved_meta.get("clock") if saved_meta else None,
                                  start_step=start_step, launch_start_wall=launch_start_wall, write=is_writer)
    # MLPerf mode: no training data before run_start; the step compiles on the batch's shapes.
    with stopping.phase("reading the first batch"):
        batches = None if parts.report.mlperf.enabled else source.train_batches(start_step=start_step)
        batch = None if batches is None else next(batches)
    with stopping.phase("compiling the train step"):
        train_step, compile_sec = run.compile_train_step(state, batch)
    _log_compiled(log, train_step, compile_sec)
    return _Launch(run=run, is_writer=is_writer, log=log, state=state, start_step=start_step,
                   schedule=schedule, report=report, checkpointer=checkpointer, train_step=train_step,
                   compile_sec=compile_sec, batches=batches, first_batch=batch,
                   evaluation_pending=bool(saved_meta and saved_meta.get("evaluation_pending")))


class _Checkpoints:
    """The checkpointer (None: checkpoints off) with the guards it acts on: no diverged state is saved or
    kept (`divergence.py`), and a preemption is saved and stopped at on every process (`preemption.py`)."""

    def __init__(self, checkpointer: checkpointing.Checkpointer | None, state: steps.TrainState,
                 start_step: int, log: Callable[..., None], *, export: bool,
                 max_param_norm_growth: float) -> None:
        self._checkpointer, self._log, self._export = checkpointer, log, export
        self._watcher = preemption.PreemptionWatcher()
        self._guard = divergence.DivergenceGuard(state, start_step, max_param_norm_growth, checkpointer)

    def check(self, losses: list[dict[str, float]]) -> None:
        """At a log point: `DivergenceError` at a non-finite loss, `CheckpointSaveError` if a background
        save failed (so that a run never trains on for hours believing it is checkpointed)."""
        self._guard.check_losses(losses)
        if self._checkpointer is not None:
            self._checkpointer.check_saves()

    @property
    def on_stop_in_evaluation(self) -> str:
        """What a stop during an evaluation in the loop does."""
        return ("abandoning the evaluation, saving a checkpoint, then stopping" if jax.process_count() == 1
                else "finishing the evaluation (every process runs it), saving a checkpoint, then stopping")

    def stop_requested(self) -> bool:
        """Whether an evaluation should be abandoned: a stop came in (a single process's run only: the
        processes of a job evaluate in step)."""
        return self._watcher.stop_requested()

    def preempted(self, step: int) -> bool:
        """Whether every process saves and stops after `step` (a SIGTERM or Ctrl-C came in)."""
        return self._watcher.reached(step)

    def log_preempted(self, step: int) -> None:
        """Says where the preempted run stopped and how to resume it."""
        self._log("Preempted (%s) at step %d: %s. Run the same command to resume.", self._watcher.signal_name,
                  step, f"checkpoint saved in {self._checkpointer.directory}" if self._checkpointer else
                  "checkpoints are off (config.checkpoint.enabled), nothing was saved")

    def save(self, step: int, state: steps.TrainState, losses: list[dict[str, float]],
             clock: Callable[[], dict[str, Any]], eval_metrics: dict[str, float] | None, *,
             evaluation_pending: bool) -> None:
        """Saves `state` after `step` with `clock()` and the step's evaluation (`evaluation_pending`: it
        was abandoned), once the steps' `losses` and the state itself show that it has not diverged."""
        self._guard.check_losses(losses)
        self._guard.check_state(step, state)
        self._checkpointer.save(step, state, clock(), eval_metrics, evaluation_pending=evaluation_pending)

    def export(self, state: steps.TrainState, *, ran_a_step: bool, preempted: bool) -> None:
        """The final parameters to export/ (`checkpoint.export`); a launch that ran no step keeps an existing
        export (its config.json would record unused settings)."""
        checkpointer = self._checkpointer
        if (checkpointer is not None and not preempted and self._export
                and (ran_a_step or not checkpointer.has_export())):
            self._log("Exported the final parameters to %s.", checkpointer.export(state))

    def paths(self, preempted: bool) -> dict[str, str]:
        """Where the checkpoints and weights are, for the closing headline (waits for saves under way)."""
        if self._checkpointer is None:
            return {}
        return self._checkpointer.paths(exported=not preempted and self._export)

    def close_watcher(self) -> None:
        """SIGTERM and Ctrl-C act as before the run."""
        self._watcher.close()

    def close(self) -> None:
        """Waits for saves under way: nothing started is lost."""
        if self._checkpointer is not None:
            self._checkpointer.close()


def _step_hooks(profile_steps: tuple[int, int], workdir: str, *, write: bool) -> tuple[StepHook, ...]:
    """The hooks around each step's dispatch: a profile window (process 0), the bound on steps in flight."""
    return (profiling.StepWindowProfiler(profile_steps,
                                         str(workdir_lib.as_path(workdir) / "tensorboard"), enabled=write),
            StepsInFlight(MAX_STEPS_AHEAD))


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
    summary_path = workdir_lib.as_path(workdir) / summary_lib.SUMMARY_FILENAME
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


def _restore(checkpointer: checkpointing.Checkpointer | None, state: steps.TrainState,
             plan: plan_lib.TrainingPlan, log: Callable[..., None]) -> tuple[steps.TrainState, Any]:
    """The newest checkpoint's state and its record (step, config, clocks), or `state` and None."""
    restored = checkpointer.restore_latest(_abstract(state)) if checkpointer is not None else None
    if restored is None:
        return state, None
    state, meta = restored
    log("Resumed from %s at step %d (epoch %.2f).", checkpointer.directory, int(state.step),
        plan.epoch_length.epochs(int(state.step)))
    return state, meta


def _log_compiled(log: Callable[..., None], compiled: Any, compile_sec: float) -> None:
    memory = compiled_lib.memory_per_device(compiled)
    cache = jax.config.jax_compilation_cache_dir  # Set by the command line (train.py), after validation.
    log("Compiled the train step in %.1fs%s%s.", compile_sec,
        "" if memory is None else f", {memory['total'] / 2**20:.0f} MiB per device",
        f"; compilation cache {cache}" if cache else "")


def _record_changes_on_resume(workdir: str, saved_meta: dict[str, Any], run_config: Mapping[str, Any],
                              step: int) -> None:
    """Logs the settings that differ from the checkpoint's run, and appends them to config_changes.jsonl."""
    changes = checkpointing.changed_on_resume(saved_meta["run_config"], run_config)
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


def _write_config(workdir: str, run_config: Mapping[str, Any]) -> None:
    """WORKDIR/config.json: the config of the run's latest launch (the console shows it only when asked)."""
    workdir_lib.write_text_atomically(workdir_lib.as_path(workdir) / "config.json",
                                      json.dumps(run_config, indent=2) + "\n")


def _abstract(state: steps.TrainState) -> Any:
    """The state's shapes, dtypes and shardings: what a checkpoint is restored into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _log_headline(summary: dict[str, Any], paths: dict[str, str]) -> None:
    """Process 0's closing headline, naming where everything is."""
    for line in summary_lib.headline(summary, paths):
        logger.info("%s", line)


def _log_setup(log: Callable[..., None], run: training_setup.TrainingSetup) -> None:
    plan, mesh, model = run.plan, run.mesh, run.sections.model
    device = mesh.devices.flat[0]
    processes = jax.process_count()
    log("Devices: %d x %s in %d process%s; mesh axes %s.", mesh.size, device.device_kind, processes,
        "" if processes == 1 else "es", dict(mesh.shape))
    log("Batch: %d global, %d per device; %d steps (%d per epoch, %.2f epochs); learning rate %.4g at its "
        "peak after %d warm-up steps.", plan.global_batch_size, plan.per_device_batch_size, plan.total_steps,
        plan.steps_per_epoch, plan.epoch_length.epochs(plan.total_steps), plan.peak_learning_rate,
        plan.warmup_steps)
    log("Timing: images/sec and time to accuracy are measured after step %d (training.timing_warmup_*).",
        plan.timing_warmup_steps)
    eval_batch = plan.batch.eval_global_batch_size
    configured = run.sections.record["eval"]["global_batch_size"]
    log("Evaluation: %d images in %d step(s) of %d%s.", plan.num_eval_examples, plan.eval_steps, eval_batch,
        "" if eval_batch == configured else f" (eval.global_batch_size {configured}, fitted to the set)")
    log("Model: %s, %s parameters, compute dtype %s.", model.name, f"{run.num_params:,}", model.compute_dtype)


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
