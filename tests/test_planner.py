"""The planner's model (`analysis/planning.py`) and command (`python -m resnet_scaling.planner`): figures
worked out by hand from MLPerf's published epochs; the command on a real compile report is in
tests/test_compile.py."""

import json
import subprocess
import sys

import pytest

from resnet_scaling import planner
from resnet_scaling.analysis import planning

# The v2 Pod's compile report as `python -m resnet_scaling.compile --config=pod --json_out` writes it
# (the fields the planner reads; the step time measured on 2026-12-02, benchmarks/README.md).
POD = {"system": "pod", "model": "resnet50", "device_kind": "TPU v2", "num_chips": 256,
       "global_batch_size": 32_768, "num_train_examples": 1_281_167, "estimated_step_sec": 0.09685}


def test_the_pods_time_and_cost_to_the_target_worked_out_by_hand():
    prediction = planning.predict(POD, planning.Price(1.5, "an example price"))
    # MLPerf's ten reference runs at 32,768 need 55-57 epochs, 56 without the extremes: 56 x 1,281,167 /
    # 32,768 = 2,189.45 steps, so 2,190, at 96.85 ms each.
    assert prediction.epochs == 56.0 and prediction.steps == 2190
    assert prediction.train_sec == pytest.approx(212.1015)
    assert prediction.images_per_sec == pytest.approx(338_337.6, rel=1e-6)
    assert prediction.cost_usd == pytest.approx(256 * 212.1015 / 3600 * 1.5)
    assert prediction.epochs_source == "published: MLPerf's reference runs, the RCP at 32768"
    assert prediction.step_source == "compiled: libtpu's estimate"
    assert prediction.price_source == "given: an example price"


def test_without_a_compiler_estimate_or_a_price_those_figures_are_not_predicted():
    prediction = planning.predict({**POD, "estimated_step_sec": None})
    assert (prediction.step_sec, prediction.images_per_sec, prediction.train_sec, prediction.cost_usd) == (
        None, None, None, None)
    assert prediction.step_source == "not predicted: no compiler estimate"


@pytest.mark.parametrize("text, message", [
    ("pod=abc:x", "expected"), ("pod=1.2", "expected"), ("=1.2:x", "expected"), ("pod=-1:x", "expected")])
def test_a_malformed_price_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        planner.parse_price(text)
    assert planner.parse_price("pod=1.35:pricing page, 2026-12-02") == (
        "pod", planning.Price(1.35, "pricing page, 2026-12-02"))


def test_the_command_prints_a_row_per_report_and_writes_json(tmp_path):
    (tmp_path / "pod.json").write_text(json.dumps(POD))
    result = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"),
                             "--price=pod=1.5:an example", f"--json_out={tmp_path / 'plan.json'}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| pod | 256 x TPU v2 | 32,768 | 56.0 | 96.85 ms | 338,338 | 3m32s | $22.62 |" in result.stdout
    (written,) = json.loads((tmp_path / "plan.json").read_text())
    assert written["steps"] == 2190
    refused = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"),
                              "--price=v100=3:x"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "error: --price names v100, which no report is for." in refused.stderr
