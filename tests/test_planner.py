"""The planner's model (`analysis/planning.py`) and command (`python -m resnet_scaling.planner`): figures
worked out by hand from MLPerf's published epochs and the case study's published pod time; the command
compiling a TPU config itself is in tests/test_compile.py."""

import json
import math
import subprocess
import sys

import pytest

from resnet_scaling import planner
from resnet_scaling.analysis import planning

# The v2 Pod's compile report as `python -m resnet_scaling.compile --config=pod --json_out` writes it (the
# fields the planner reads), with round evaluation figures to work by hand.
POD = {"system": "pod", "model": "resnet50", "device_kind": "TPU v2", "num_chips": 256, "num_hosts": 64,
       "global_batch_size": 32_768, "num_train_examples": 1_281_167, "estimated_step_sec": 0.09685,
       "estimated_eval_step_sec": 0.03, "eval_steps_per_pass": 2}
V2_8 = {**POD, "system": "v2-8", "num_chips": 4, "num_hosts": 1, "global_batch_size": 1024,
        "estimated_step_sec": 0.178}
# A run's summary.json on 8 GPUs: 64,000 images/sec at 4,096 a step; 10 evaluations in 20 s.
GPU_SUMMARY = {"run": {"devices": 8, "device_kind": "NVIDIA H200", "process_count": 1,
                       "global_batch_size": 4096},
               "throughput": {"images_per_sec": 64_000.0}, "time": {"eval_sec": 20.0},
               "accuracy": {"num_evals": 10},
               "config": {"system": {"name": "8x H200"}, "model": {"name": "resnet50", "num_filters": 64},
                          "data": {"num_train_examples": 1_281_167, "image_size": 224, "source": "tfds",
                                   "dataset": "imagenet2012"}}}
# The demo's run as its summary.json records it: another model, width, image size and dataset.
DEMO_SUMMARY = {**GPU_SUMMARY, "config": {
    "model": {"name": "resnet18", "num_filters": 16},
    "data": {"num_train_examples": 12_000, "image_size": 32, "source": "shapes", "dataset": "imagenet2012"}}}


def test_the_pods_uncompensated_time_and_cost_to_the_target_worked_out_by_hand():
    prediction = planning.predict(planning.system_from_report(POD), price=planning.Price(1.5, "an example"))
    # MLPerf's ten reference runs at 32,768 need 55-57 epochs, 56 without the extremes: 56 x 1,281,167 /
    # 32,768 = 2,189.45 steps, so 2,190 at 96.85 ms; ceil(56 / 4) = 14 evaluations of 2 x 30 ms.
    assert prediction.mlperf.epochs.value == 56.0 and prediction.mlperf.epochs.basis == "published"
    assert prediction.mlperf.train_sec == pytest.approx(2190 * 0.09685)
    assert prediction.mlperf.eval_sec == pytest.approx(14 * 0.06)
    assert prediction.mlperf.total_sec == pytest.approx(212.1015 + 0.84)
    assert prediction.mlperf.cost_usd == pytest.approx(256 * 212.9415 / 3600 * 1.5)
    # The case study's clock: 90 epochs = 3,518.83 steps, so 3,519, training only.
    assert prediction.case_study.total_sec == pytest.approx(3519 * 0.09685)
    assert prediction.case_study.eval_sec is None
    assert prediction.images_per_sec == pytest.approx(338_337.6, rel=1e-6)
    assert prediction.step_sec.basis == "compiled"
    assert prediction.factor is None and prediction.compensated_mlperf is None


def test_the_tpu_factor_gives_back_the_published_pod_time_and_scales_every_tpu_step():
    pod = planning.system_from_report(POD)
    factor = planning.tpu_factor(pod)
    # 7.9 minutes over 90 x 1,281,167 / 32,768 = 3,518.83 steps is 134.70 ms a step.
    assert factor.value == pytest.approx(474 / 3518.8303 / 0.09685, rel=1e-6)
    prediction = planning.predict(pod, factor)
    # The compensated case-study clock is the published 7.9 minutes, up to the last step's rounding.
    assert prediction.compensated_case_study.total_sec == pytest.approx(7.9 * 60, abs=0.2)
    assert prediction.compensated_mlperf.total_sec == pytest.approx(
        prediction.mlperf.total_sec * factor.value)
    assert prediction.compensated_images_per_sec == pytest.approx(32_768 * 3518.8303 / 474, rel=1e-6)
    with pytest.raises(ValueError, match="not the published"):
        planning.tpu_factor(planning.system_from_report(V2_8))


def test_scaling_efficiency_is_per_chip_throughput_over_the_smallest_system_of_the_kind():
    predictions = planning.with_scaling_efficiency(
        [planning.predict(planning.system_from_report(r)) for r in (POD, V2_8)])
    pod, v2_8 = predictions
    # 338,337.6 / 256 = 1,321.6 per chip against 1,024 / 0.178 / 4 = 1,438.2.
    assert pod.scaling_efficiency.value == pytest.approx((32_768 / 0.09685 / 256) / (1024 / 0.178 / 4))
    assert v2_8.scaling_efficiency.value == 1.0


def test_a_gpu_run_is_measured_from_its_summary_and_a_gpu_config_alone_is_not_predicted():
    from resnet_scaling import config as config_lib

    measured = planning.predict(planning.system_from_summary(GPU_SUMMARY))
    # 39.875 epochs at 4,096 (MLPerf's RCP) = 12,472.3 steps, so 12,473 at 4,096 / 64,000 = 64 ms;
    # ceil(39.875 / 4) = 10 evaluations at 2 s each (20 s over 10 in the run).
    assert measured.step_sec.basis == "measured" and measured.num_chips == 8
    assert measured.mlperf.total_sec == pytest.approx(12_473 * 0.064 + 10 * 2.0)
    alone = planning.predict(planning.system_from_config(config_lib.load_config("gpu_h200x8")))
    assert alone.step_sec.basis == "not predicted" and "summary.json" in alone.step_sec.note
    assert alone.mlperf.total_sec is None and alone.mlperf.epochs.value > 0


def test_host_cores_needed_divide_each_hosts_share_by_the_per_core_rate():
    rate = planning.Figure(1000.0, "given", "an example")
    prediction = planning.predict(planning.system_from_report(POD), input_images_per_sec_per_core=rate)
    assert prediction.host_cores_needed.value == pytest.approx(32_768 / 0.09685 / 64 / 1000)


def test_a_price_is_found_by_device_kind_the_longest_name_first():
    prices = {"TPU v5": planning.Price(4.2, "a"), "TPU v5 lite": planning.Price(1.2, "b")}
    assert planning.price_for("TPU v5 lite", prices).usd_per_chip_hour == 1.2
    assert planning.price_for("TPU v5", prices).usd_per_chip_hour == 4.2
    assert planning.price_for("NVIDIA H200", prices) is None
    assert planning.price_for("Tesla V100-SXM2-16GB", planning.ASSUMED_PRICES).basis == "assumed"


@pytest.mark.parametrize("price, rate", [("pod=abc:x", "abc:x"), ("pod=1.2", "1.2"), ("=1.2:x", "0:x"),
                                         ("pod=-1:x", "-1:x")])
def test_a_malformed_price_or_input_rate_is_refused(price, rate):
    with pytest.raises(ValueError, match="expected"):
        planner.parse_price(price)
    with pytest.raises(ValueError, match="expected"):
        planner.parse_input_rate(rate)
    assert planner.parse_price("pod=1.35:pricing page, 2026-12-02") == (
        "pod", planning.Price(1.35, "pricing page, 2026-12-02"))
    assert planner.parse_input_rate("1143:input_pipeline.py") == planning.Figure(1143, "given",
                                                                                  "input_pipeline.py")


def test_the_command_prints_compensated_rows_writes_json_and_a_chart(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "pod.json").write_text(json.dumps(POD))
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "summary.json").write_text(json.dumps(GPU_SUMMARY))
    result = subprocess.run(
        [sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"), str(tmp_path / "h200"),
         "gpu_v100", "--price=pod=1.5:an example", f"--json_out={tmp_path / 'plan.json'}",
         f"--chart_out={tmp_path / 'plan.png'}"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    # Uncompensated -> compensated: 96.85 ms -> 134.70 ms a step; 212.94 s -> 296.2 s on MLPerf's clock.
    assert rows["pod"][3] == "96.85 ms → 134.70 ms (compiled)"
    assert rows["pod"][6] == "5m41s → 7m54s"  # The case study's clock: 340.8 s, then the published 7.9 min.
    assert rows["pod"][8] == "3m33s → 4m56s"
    assert rows["8x H200"][3] == "64.00 ms (measured)"  # No factor for GPUs.
    # No price for an H200 (the only prices are the case study's): the note says how to give one.
    assert "- 8x H200: no price for NVIDIA H200; give one as --price='8x H200=USD_PER_CHIP_HOUR:SOURCE, " \
        "DATE' or in a --prices file." in result.stdout
    assert rows["8x H200"][8] == "13m38s"
    v100 = rows["1x NVIDIA V100 (n1-standard-8)"]
    assert v100[3] == "not predicted" and v100[8] == "-" and v100[9] == "-"
    assert "- 1x NVIDIA V100 (n1-standard-8): not predicted (no GPU compiler runs" in result.stdout
    assert "TPU factor: x1.391" in result.stdout
    written = json.loads((tmp_path / "plan.json").read_text())
    pod = written["predictions"][0]
    assert pod["mlperf"]["epochs"]["basis"] == "published" and pod["step_sec"]["basis"] == "compiled"
    assert pod["compensated_mlperf"]["cost_usd"] == pytest.approx(256 * 212.9415 * 1.390850 / 3600 * 1.5,
                                                                   rel=1e-4)
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    refused = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"),
                              "--price=v100=3:x"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "error: --price names v100, which no input is for." in refused.stderr
    missing = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "none.json"),
                              "no_such_config"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith(f"no such file: {tmp_path / 'none.json'}")
    assert math.isfinite(written["tpu_factor"]["value"])


def test_a_summary_of_another_workload_is_refused_in_one_line_naming_what_differs(tmp_path):
    """The demo's summary.json (ResNet-18 at a quarter width, 32 px, generated shapes) once gave an MLPerf
    clock for ImageNet; a summary without its config (an older run) cannot show it is ResNet-50 either."""
    with pytest.raises(planning.WorkloadError, match="model.name is 'resnet18', not 'resnet50'"):
        planning.system_from_summary(DEMO_SUMMARY)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "summary.json").write_text(json.dumps(DEMO_SUMMARY))
    result = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "demo")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"error: {tmp_path / 'demo'}: not the workload the planner plans "
                                    "(ResNet-50 v1.5 (64 filters), imagenet2012, 224 px): model.name is "
                                    "'resnet18', not 'resnet50'; model.num_filters is 16"), result.stderr
    assert "data.image_size is 32, not 224" in result.stderr and "data.source is 'shapes'" in result.stderr
