"""`train_and_evaluate(config, workdir)`: wires config -> mesh -> data -> model -> step -> metrics.

The only module that decides who writes: process 0 logs and writes metric files; every process trains.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from resnet_scaling import checkpointing, models, optim, steps
from resnet_scaling import config as config_lib
from resnet_scaling import data as data_lib
from resnet_scaling import mesh as mesh_lib
from resnet_scaling import metrics as metrics_lib

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    """What a run leaves behind.

    Attributes:
      state: the final train state (replicated on the mesh).
      plan: the derived sizes and durations of the run.
      train_history: one record per log point (step, loss, top1, top5, images_per_sec, ...).
      eval_history: one record per evaluation (step, eval_loss, eval_top1, eval_top5, eval_count).
      compile_sec: time to compile the train step.
      start_step: the step the run started from (> 0 when it resumed from a checkpoint).
      preempted: whether it stopped early on SIGTERM after saving a checkpoint.
      summary: the headline figures (`metrics.summary`'s schema), as process 0 writes to summary.json.
    """

    state: steps.TrainState
    plan: config_lib.TrainingPlan
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

    Returns:
      A `TrainResult` with the final state and the logged metrics.
    """
    config_lib.validate(config)
    mesh = mesh_lib.create_mesh(config.mesh.num_devices, devices)
    config_lib.validate(config, mesh.size)
    is_writer = jax.process_index() == 0
    log = logger.info if is_writer else logger.debug
    device = mesh.devices.flat[0]
    log("Mesh: %d devices (%s, %s) over %d process(es), axes %s.", mesh.size, device.platform,
        device.device_kind, jax.process_count(), dict(mesh.shape))

    source = data_lib.create_data_source(config, mesh, arrays)
    plan = config_lib.derive(config, source.num_train_examples, mesh.size)
    log("Batch: %d global, %d per device; %d steps (%d per epoch, %.2f epochs), %d warm-up; peak LR %.4g.",
        plan.global_batch_size, plan.per_device_batch_size, plan.total_steps, plan.steps_per_epoch,
        plan.total_steps / plan.steps_per_epoch, plan.warmup_steps, plan.peak_learning_rate)

    model = models.model_from_config(config, num_devices=mesh.size)  # Resolves bn_group_size=0.
    learning_rate_fn = optim.create_learning_rate_schedule(config, plan)
    tx = optim.create_optimizer(config, learning_rate_fn)
    state = steps.create_train_state(jax.random.key(config.seed), model, tx, config.data.image_size, mesh,
                                     optim.create_dynamic_scale(config))
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    log("Model: %s, %s parameters, compute dtype %s.", config.model.name, f"{num_params:,}",
        config.model.compute_dtype)
    step_config = steps.StepConfig.from_config(config)
    eval_step_fn = steps.jit_eval_step(state, mesh, step_config)

    checkpointer = checkpointing.Checkpointer(workdir, config) if config.checkpoint.enabled else None
    # The clocks, saved in every checkpoint so that the totals survive restarts. wall_sec is the training
    # loop's wall time (MLPerf's clock); steady_state and time_to_accuracy hold their trackers' state.
    clock: dict[str, Any] = {"train_sec": 0.0, "eval_sec": 0.0, "checkpoint_sec": 0.0, "wall_sec": 0.0}
    if checkpointer is not None:
        abstract_state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        restored = checkpointer.restore_latest(abstract_state)
        if restored is not None:
            state, meta = restored
            clock.update(meta.get("clock", {}))
            log("Resumed from %s at step %d (epoch %.2f).", checkpointer.directory, int(state.step),
                int(state.step) / plan.steps_per_epoch)
    start_step = int(state.step)

    batches = source.train_batches(start_step=start_step)
    batch = next(batches)
    start = time.perf_counter()
    train_step_fn = steps.jit_train_step(state, mesh, learning_rate_fn, step_config).lower(
        state, batch).compile()
    compile_sec = time.perf_counter() - start
    log("Compiled the train step in %.1fs%s.", compile_sec, _memory_note(train_step_fn))
    flops_per_device = metrics_lib.flops_per_device(train_step_fn)

    writers = (metrics_lib.MetricWriters(workdir, tensorboard=config.training.tensorboard)
               if is_writer else None)
    watcher = checkpointing.PreemptionWatcher()
    buffer = metrics_lib.MetricsBuffer()
    timer = metrics_lib.ThroughputTimer(plan.global_batch_size, total_sec=clock["train_sec"])
    steady = metrics_lib.SteadyStateThroughput(plan.global_batch_size, plan.timing_warmup_steps)
    steady.load_state_dict(clock.get("steady_state"))
    time_to_accuracy = metrics_lib.TimeToAccuracy(config.eval.target_top1)
    time_to_accuracy.load_state_dict(clock.get("time_to_accuracy"))
    interval_first_step = start_step + 1  # First step of the current log interval.
    train_history: list[dict[str, float]] = []
    eval_history: list[dict[str, float]] = []
    last_saved_step = start_step if start_step > 0 else None  # The newest checkpoint on disk.
    preempted = False

    loop_start, wall_sec_before = time.perf_counter(), clock["wall_sec"]

    def wall_sec() -> float:  # MLPerf's clock: the training loop's wall time over every run of it.
        return wall_sec_before + time.perf_counter() - loop_start

    def save(step: int) -> None:
        # A checkpoint must never hold a diverged state: check the steps since the last fetch first.
        _raise_if_non_finite(buffer.fetch(), last_saved_step)
        save_start = time.perf_counter()
        clock.update(train_sec=timer.total_sec, wall_sec=wall_sec(), steady_state=steady.state_dict(),
                     time_to_accuracy=time_to_accuracy.state_dict())
        checkpointer.save(step, state, dict(clock))
        clock["checkpoint_sec"] += time.perf_counter() - save_start

    timer.start()
    try:
        for step in range(start_step + 1, plan.total_steps + 1):  # `step` counts the steps done after it.
            if step > start_step + 1:
                input_start = time.perf_counter()
                batch = next(batches)
                steady.add_input_wait(step, time.perf_counter() - input_start)
            state, step_metrics = train_step_fn(state, batch)
            buffer.append(step, step_metrics)
            timer.count()
            if step == plan.timing_warmup_steps:
                # The timed region starts when the warm-up's last step is done: one sync, once per run.
                jax.block_until_ready(step_metrics)
                steady.end_warmup(timer.read_total_sec())
            last = step == plan.total_steps
            if _due(step, config.training.log_every_steps, last):
                new_records = buffer.fetch()
                _raise_if_non_finite(new_records, last_saved_step)
                record = {"step": step, "epoch": step / plan.steps_per_epoch, **buffer.mean(),
                          **timer.read_and_reset()}
                steady.add_interval(interval_first_step, step, record.get("sec_per_step"))
                interval_first_step = step + 1
                train_history.append(record)
                if is_writer:
                    eta = (plan.total_steps - step) * record.get("sec_per_step", 0.0)
                    logger.info(
                        "step %d/%d (epoch %.2f): loss %.4f, top1 %.3f, top5 %.3f, lr %.4g, "
                        "%.1f images/sec, ETA %s", step, plan.total_steps, record["epoch"],
                        record["loss"], record["top1"], record["top5"], record["learning_rate"],
                        record.get("images_per_sec", float("nan")), metrics_lib.format_duration(eta))
                    writers.write(step, record)
            if _due(step, plan.eval_every_steps, last):
                timer.pause()  # Evaluation stays off the training clock.
                eval_start = time.perf_counter()
                eval_metrics = {"step": step, **evaluate(eval_step_fn, state, source),
                                "eval_sec": time.perf_counter() - eval_start}
                clock["eval_sec"] += eval_metrics["eval_sec"]
                eval_history.append(eval_metrics)
                if time_to_accuracy.update(step, step / plan.steps_per_epoch, eval_metrics["eval_top1"],
                                           steady.timed_sec(timer.total_sec), wall_sec()):
                    log("Reached the target top-1 %.4f at step %d (epoch %.2f): %.1fs timed, %.1fs wall.",
                        config.eval.target_top1, step, step / plan.steps_per_epoch,
                        steady.timed_sec(timer.total_sec), wall_sec())
                if is_writer:
                    logger.info("eval at step %d: loss %.4f, top1 %.4f, top5 %.4f over %d images (%.1fs)",
                                step, eval_metrics["eval_loss"], eval_metrics["eval_top1"],
                                eval_metrics["eval_top5"], eval_metrics["eval_count"],
                                eval_metrics["eval_sec"])
                    writers.write(step, eval_metrics)
                if checkpointer is not None:
                    checkpointer.save_best(step, state, eval_metrics)
                timer.start()
            preempted = watcher.reached(step)
            if checkpointer is not None and (_due(step, plan.checkpoint_every_steps, last) or preempted):
                timer.pause()  # Checkpointing stays off the training clock too.
                save(step)
                last_saved_step = step
                timer.start()
            if preempted:
                log("Preempted (SIGTERM) at step %d: %s. Run the same command to resume.", step,
                    f"checkpoint saved in {checkpointer.directory}" if checkpointer else
                    "checkpoints are off (config.checkpoint.enabled), nothing was saved")
                break
        timer.pause()
        if checkpointer is not None and not preempted and config.checkpoint.export:
            log("Exported the final parameters to %s.", checkpointer.export(state))
        clock.update(train_sec=timer.total_sec, wall_sec=wall_sec())
        summary = _summary(config, plan, mesh, int(state.step), start_step, preempted, compile_sec, clock,
                           steady, time_to_accuracy, flops_per_device)
        if is_writer:
            log("Summary written to %s.", metrics_lib.write_summary(workdir, summary))
    finally:
        watcher.close()
        if checkpointer is not None:
            checkpointer.close()  # Waits for saves under way: nothing started is lost.
        if writers is not None:
            writers.close()
    return TrainResult(state=state, plan=plan, train_history=train_history, eval_history=eval_history,
                       compile_sec=compile_sec, start_step=start_step, preempted=preempted, summary=summary)


def _summary(config: ml_collections.ConfigDict, plan: config_lib.TrainingPlan, mesh: jax.sharding.Mesh,
             final_step: int, start_step: int, preempted: bool, compile_sec: float, clock: dict[str, Any],
             steady: metrics_lib.SteadyStateThroughput, time_to_accuracy: metrics_lib.TimeToAccuracy,
             flops_per_device: float | None) -> dict[str, Any]:
    """The run's headline figures in `metrics.summary`'s schema."""
    device = mesh.devices.flat[0]
    throughput = steady.summary(final_step, clock["train_sec"])
    images_per_sec = throughput["images_per_sec"]
    throughput["images_per_sec_per_device"] = images_per_sec / mesh.size if images_per_sec else None
    # MFU from the steady-state mean step time (all timed seconds / timed steps), not a percentile.
    sec_per_step = (throughput["steady_state_sec"] / throughput["steady_state_steps"]
                    if images_per_sec else None)
    return metrics_lib.build_summary(
        run={"devices": mesh.size, "device_kind": device.device_kind, "platform": device.platform,
             "process_count": jax.process_count(), "global_batch_size": plan.global_batch_size,
             "per_device_batch_size": plan.per_device_batch_size, "steps_per_epoch": plan.steps_per_epoch,
             "start_step": start_step, "final_step": final_step, "total_steps": plan.total_steps,
             "timing_warmup_steps": plan.timing_warmup_steps, "preempted": preempted},
        throughput=throughput,
        time={"compile_sec": compile_sec, **{k: float(clock[k]) for k in
                                             ("train_sec", "eval_sec", "checkpoint_sec", "wall_sec")}},
        accuracy=time_to_accuracy.result(),
        utilisation=metrics_lib.utilisation(flops_per_device, sec_per_step, mesh.size, device.device_kind),
        config=config.to_dict())


def _due(step: int, every_steps: int, last: bool) -> bool:
    """Whether a periodic action (log, evaluate, save) runs after `step`: every N steps and at the end."""
    return last or (every_steps > 0 and step % every_steps == 0)


def _raise_if_non_finite(records: list[dict[str, float]], last_good_checkpoint: int | None) -> None:
    bad_step = metrics_lib.first_non_finite_step(records)
    if bad_step is None:
        return
    loss = next(r["loss"] for r in records if r["step"] == bad_step)
    kept = ("" if last_good_checkpoint is None else
            f" The last checkpoint (step {last_good_checkpoint}) was written before it and is intact.")
    raise FloatingPointError(
        f"Training loss is {loss} at step {bad_step}: lower the learning rate, lengthen the warm-up or "
        f"use float32/bfloat16 compute.{kept}")


def _memory_note(compiled: Any) -> str:
    """", N MiB per device (arguments, outputs, temporaries)" where the backend reports it."""
    try:
        m = compiled.memory_analysis()
        total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    except Exception:  # noqa: BLE001 - not every backend implements memory analysis.
        return ""
    return f", {total / 2**20:.0f} MiB per device (arguments, outputs, temporaries)"
