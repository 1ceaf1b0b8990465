"""benchmarks/planner_checks.py: MLPerf result logs read by hand-made examples, the published results file
against its source's own scores, and a prediction's errors worked out by hand."""

import importlib.util
import json
import math
import pathlib
import sys

import pytest

from resnet_scaling.analysis import planning

REPO = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("planner_checks", REPO / "benchmarks" / "planner_checks.py")
planner_checks = importlib.util.module_from_spec(spec)
sys.modules.setdefault("planner_checks", planner_checks)
spec.loader.exec_module(planner_checks)

# An MLPerf v0.6 result file's lines, as the TPU submissions wrote them (values made up).
RESULT = """\
:::MLL 0.0 submission_platform: {"value": "tpu-v3-32", "metadata": {"lineno": 0, "file": "N/A"}}
:::MLL 1000.0 init_start: {"value": null, "metadata": {"lineno": 602, "file": "resnet_main.py"}}
:::MLL 1000.5 global_batch_size: {"value": 4096, "metadata": {"lineno": 608, "file": "resnet_main.py"}}
:::MLL 1005.0 model_bn_span: {"value": 128, "metadata": {"lineno": 406, "file": "resnet_main.py"}}
I0521 06:34:05 unrelated log line
:::MLL 1080.0 run_start: {"value": null, "metadata": {"lineno": 681, "file": "resnet_main.py"}}
:::MLL 1250.0 eval_accuracy: {"value": 0.5, "metadata": {"epoch_num": 4, "lineno": 481, "file": "x.py"}}
:::MLL 1420.0 eval_accuracy: {"value": 0.7601, "metadata": {"epoch_num": 8, "lineno": 481, "file": "x.py"}}
:::MLL 1420.25 run_stop: {"value": null, "metadata": {"status": "success", "lineno": 488, "file": "x.py"}}
"""


def test_a_result_file_gives_mlperfs_clock_the_epochs_and_the_batch():
    result = planner_checks.parse_mlperf_result(RESULT)
    assert result == {"run_sec": 340.25, "epochs": 8, "top1": 0.7601, "status": "success",
                      "global_batch": 4096, "bn_span": 128, "platform": "tpu-v3-32"}
    with pytest.raises(ValueError, match="run_stop"):
        planner_checks.parse_mlperf_result(RESULT.replace("run_stop", "other"))


def test_mllogs_json_lines_read_the_same():
    """mllog's format (MLPerf v0.7 on): one JSON object a line, times in milliseconds."""
    lines = []
    for line in RESULT.splitlines():
        if line.startswith(":::MLL "):
            _, stamp, rest = line.split(" ", 2)
            key, _, body = rest.partition(": ")
            lines.append(":::MLLOG " + json.dumps({"namespace": "", "time_ms": int(float(stamp) * 1000),
                                                   "key": key, **json.loads(body)}))
    assert planner_checks.parse_mlperf_result("\n".join(lines)) == planner_checks.parse_mlperf_result(RESULT)


def test_the_score_drops_the_fastest_and_the_slowest_of_five():
    assert planner_checks.olympic_mean([5.0, 1.0, 3.0, 2.0, 4.0]) == 3.0


def test_the_published_results_are_mlperfs_own_scores():
    """MLPerf's published scores, re-derived from the logs: Google's v0.6 ResNet-50 on a TPU v3-2048 in 1.28
    minutes (Google Cloud blog, July 2019) and v0.7's JAX run on a TPU v3-8192 in 0.472 minutes (MLPerf v0.7
    results, as docs/case_study.md cites them); every score is its five runs'."""
    entries = {e["name"]: e for e in json.loads(planner_checks.PUBLISHED.read_text())}
    assert len(entries) == 9
    assert entries["MLPerf v0.6, Google, tpu-v3-2048"]["score_minutes"] == pytest.approx(1.28, abs=0.005)
    assert entries["MLPerf v0.7, Google, tpu-v3-8192-JAX"]["score_minutes"] == pytest.approx(0.472, abs=5e-4)
    for e in entries.values():
        assert e["score_minutes"] == pytest.approx(planner_checks.olympic_mean(e["minutes"]), abs=1e-3)
        cores = int(e["name"].split("tpu-")[1].split("-")[1])
        assert e["num_chips"] * 2 == cores  # A slice is named by its cores: 2 per v3 or v4 chip.
        assert math.prod(map(int, e["topology"].split(":")[1].split("x"))) == e["num_chips"]


def test_compile_flags_put_the_submissions_system_into_the_pod_config():
    entry = {"name": "MLPerf v0.6, Google, tpu-v3-32", "device_kind": "TPU v3", "num_chips": 16,
             "topology": "v3:4x4", "global_batch": 4096, "bn_span": 128}
    assert planner_checks.compile_args(entry) == [
        "--config=pod", "--config.system.topology=v3:4x4", "--config.system.device_kind=TPU v3",
        "--config.mesh.num_devices=-1", "--config.training.global_batch_size=4096",
        "--config.eval.global_batch_size=4096", "--config.model.bn_group_size=128",
        "--config.system.name=MLPerf v0.6, Google, tpu-v3-32"]


def test_a_checks_errors_worked_out_by_hand():
    entry = {"name": "x", "num_chips": 16, "global_batch": 4096, "epochs": [60, 60, 64, 60, 60],
             "minutes": [42.0, 42.0, 45.0, 42.0, 42.0], "score_minutes": 42.0, "source": "s"}
    report = {"system": "x", "device_kind": "TPU v3", "num_chips": 16, "global_batch_size": 4096,
              "num_train_examples": 1_281_167, "estimated_step_sec": 0.1, "estimated_eval_step_sec": 0.02,
              "eval_steps_per_pass": 13}
    factor = planning.Figure(1.5, "derived", "example")
    out = planner_checks.check(entry, report, factor)
    # The runs' median 60 epochs: ceil(60 x 1,281,167 / 4,096) = 18,768 steps of 0.1 s, and 15
    # evaluations of 13 x 0.02 s: 1,880.7 s, 31.35 s an epoch against the published 42 x 60 / 60 = 42.
    own_sec = 18_768 * 0.1 + 15 * 13 * 0.02
    assert out["published_sec_per_epoch"] == pytest.approx(42.0)
    assert out["uncompensated"]["sec_per_epoch"] == pytest.approx(own_sec / 60)
    assert out["uncompensated"]["sec_per_epoch_error"] == pytest.approx(own_sec / 60 / 42 - 1)
    assert out["compensated"]["minutes_own_epochs"] == pytest.approx(own_sec * 1.5 / 60)
    # MLPerf's reference runs need 39.875 epochs at 4,096: 12,473 steps and 10 evaluations.
    assert out["rcp_epochs"] == 39.875
    rcp_min = (12_473 * 0.1 + 10 * 13 * 0.02) * 1.5 / 60
    assert out["compensated"]["minutes_rcp_epochs"] == pytest.approx(rcp_min)
    assert out["compensated"]["minutes_rcp_epochs_error"] == pytest.approx(rcp_min / 42 - 1)
