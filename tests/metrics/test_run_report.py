"""`RunReport` as a unit: what the loop tells it, what it records, writes and logs (metrics/run_report.py).

Driven by hand, without a model: step metrics are arrays whose means are computed here with NumPy, and the
MLPerf log is read back as MLPerf's own `:::MLLOG` JSON lines.
"""

from __future__ import annotations

import json
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.metrics.goodput import GoodputRecorder
from resnet_scaling.metrics.run_report import RunReport
from resnet_scaling.training import sections
from tests.helpers import tiny_config

NUM_TRAIN_EXAMPLES = 64  # 4 steps of 16 images per epoch.


def _report(workdir, **overrides) -> RunReport:
    config = tiny_config(**{"training__num_train_steps": 8, "training__log_every_steps": 4,
                            "data__num_eval_examples": 16, **overrides})
    mesh = mesh_lib.create_mesh(1, jax.devices()[:1])
    plan = plan_lib.derive(config, NUM_TRAIN_EXAMPLES, num_devices=1)
    wall = time.time()
    goodput = GoodputRecorder(str(workdir), None, wall, write=True)
    schedule = plan_lib.loop_schedule(config, plan)
    return RunReport(str(workdir), sections.read(config).report, plan, schedule, mesh, goodput,
                     saved_clock=None, start_step=0, launch_start_wall=wall, write=True)


def _mlperf_events(workdir) -> list[dict]:
    lines = (workdir / "mlperf_log.txt").read_text().splitlines()
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in lines if ":::MLLOG " in line]


def _step(report: RunReport, step: int, loss: float, top1: float) -> None:
    report.before_step(step)
    report.after_step(step, {"loss": jnp.float32(loss), "top1": jnp.float32(top1), "top5": jnp.float32(1.0),
                             "learning_rate": jnp.float32(0.1)})


def test_a_log_point_records_the_means_of_its_steps(tmp_path):
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    losses, top1s = [2.0, 1.5, 1.25, 0.75], [0.1, 0.2, 0.4, 0.5]
    for step, (loss, top1) in enumerate(zip(losses, top1s, strict=True), start=1):
        _step(report, step, loss, top1)
    report.log_point(4)
    (record,) = report.train_history
    assert record["step"] == 4 and record["window_steps"] == 4
    assert record["loss"] == pytest.approx(np.mean(losses))
    assert record["top1"] == pytest.approx(np.mean(top1s))
    report.close()
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written] == [4] and written[0]["loss"] == pytest.approx(1.375)


def test_an_evaluation_is_recorded_written_and_logged(tmp_path, caplog):
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    _step(report, 1, 1.0, 0.5)
    metrics = {"eval_loss": 0.5, "eval_top1": 0.8, "eval_top5": 1.0, "eval_count": 16, "eval_sec": 0.25}
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        record, stops = report.evaluate(1, None, lambda state: metrics)
    assert record == {"step": 1, **metrics} and not stops
    assert report.eval_history == [record]
    assert "eval at step 1: loss 0.5000, top1 0.8000, top5 1.0000 over 16 images" in caplog.text
    report.close()


def test_an_abandoned_evaluation_records_nothing(tmp_path, caplog):
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    _step(report, 1, 1.0, 0.5)
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        assert report.evaluate(1, None, lambda state: None) == (None, False)
    assert report.eval_history == [] and "Evaluation after step 1 abandoned" in caplog.text
    report.close()


def test_an_error_ends_the_mlperf_log_with_run_stop_aborted(tmp_path):
    """The loop's `finally` closes the report without `stop` when an exception ends the run."""
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    _step(report, 1, 1.0, 0.5)
    report.close()
    stops = [e for e in _mlperf_events(tmp_path) if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted"


def test_a_finished_run_stops_the_mlperf_log_once_and_closing_adds_nothing(tmp_path):
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    for step in range(1, 5):
        _step(report, step, 1.0, 0.5)
    report.log_point(4)
    report.stop(None, preempted=False)
    summary = report.finish(4, preempted=False, compile_sec=1.0, flops_per_device=None)
    report.close()
    keys = [e["key"] for e in _mlperf_events(tmp_path)]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1
    assert summary["run"]["final_step"] == 4 and summary["run"]["preempted"] is False
    assert json.loads((tmp_path / "summary.json").read_text())["run"]["final_step"] == 4


def test_a_preempted_stop_ends_the_mlperf_log_aborted_once_and_closing_adds_nothing(tmp_path):
    report = _report(tmp_path)
    report.start(compile_sec=1.0)
    for step in (1, 2):
        _step(report, step, 1.0, 0.5)
    report.stop(None, preempted=True)
    report.close()
    events = _mlperf_events(tmp_path)
    stops = [e for e in events if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted"
    assert events.index(stops[0]) > [e["key"] for e in events].index("run_start")


def test_an_mlperf_mode_evaluation_at_the_target_stops_the_run_and_the_log_ends_in_success(tmp_path):
    # 64 images at 16 a step: an epoch is 4 steps, so MLPerf's evaluation every epoch comes after step 4.
    report = _report(tmp_path, mlperf__enabled=True, mlperf__eval_every_epochs=1)
    report.start(compile_sec=1.0)
    for step in range(1, 5):
        _step(report, step, 1.0, 0.5)
    below = {"eval_loss": 1.0, "eval_top1": 0.5, "eval_top5": 0.9, "eval_count": 16, "eval_sec": 0.1}
    assert report.evaluate(4, None, lambda state: below)[1] is False  # Under MLPerf's 0.759: it goes on.
    for step in range(5, 9):
        _step(report, step, 1.0, 0.5)
    at_target = {**below, "eval_top1": 0.8125}  # 13 of 16.
    record, stops = report.evaluate(8, None, lambda state: at_target)
    assert stops and record["eval_top1"] == 0.8125
    report.stop(None, preempted=False)
    report.close()
    events = _mlperf_events(tmp_path)
    accuracies = [(e["value"], e["metadata"]["epoch_num"]) for e in events if e["key"] == "eval_accuracy"]
    assert accuracies == [(0.5, 1.0), (0.8125, 2.0)]  # Epochs by images seen: 4 and 8 steps x 16 / 64.
    (stop,) = [e for e in events if e["key"] == "run_stop"]
    assert stop["metadata"]["status"] == "success"


def test_an_exception_that_ends_a_training_run_ends_its_mlperf_log_with_run_stop_aborted(tmp_path,
                                                                                        monkeypatch):
    """The loop's `finally` closes the report: a run ended by an error (here its input, at the 3rd batch)
    leaves a complete MLPerf log, started once and stopped once as aborted, and the error itself."""
    import dataclasses

    from resnet_scaling.training import trainer, training_setup
    from tests.helpers import random_arrays

    class InputBroke(RuntimeError):
        pass

    class BreaksAtTheThirdBatch:
        def __init__(self, source):
            self._source = source

        def __getattr__(self, name):
            return getattr(self._source, name)

        def train_batches(self, start_step: int = 0):
            for count, batch in enumerate(self._source.train_batches(start_step=start_step), start=1):
                if count == 3:
                    raise InputBroke("the input broke")
                yield batch

    real_setup = training_setup.setup
    monkeypatch.setattr(training_setup, "setup", lambda *args, **kwargs: dataclasses.replace(
        run := real_setup(*args, **kwargs), source=BreaksAtTheThirdBatch(run.source)))
    with pytest.raises(InputBroke):
        trainer.train_and_evaluate(tiny_config(training__num_train_steps=8), str(tmp_path),
                                   arrays=random_arrays())
    events = _mlperf_events(tmp_path)
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1
    (stop,) = [e for e in events if e["key"] == "run_stop"]
    assert stop["metadata"]["status"] == "aborted" and keys.index("run_stop") > keys.index("run_start")
    assert not (tmp_path / "summary.json").exists()  # The run did not finish.
