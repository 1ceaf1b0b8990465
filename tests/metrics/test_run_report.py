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
