"""The planner's model (`planning/estimates.py`) and command (`python -m resnet_scaling.planner`): figures
worked out by hand from MLPerf's published epochs and the case study's published pod time; the command
compiling a TPU config itself is in tests/planning/test_compile.py."""

import json
import math
import subprocess
import sys

import pytest

from resnet_scaling import planner
from resnet_scaling.planning import estimates as planning
from resnet_scaling.planning import step_model

# The v2 Pod's compile report as `python -m resnet_scaling.compile --config=pod --json_out` writes it (the
# fields the planner reads), with round evaluation figures to work by hand.
POD = {"system": "pod", "model": "resnet50", "device_kind": "TPU v2", "num_chips": 256, "num_devices": 512,
       "num_hosts": 64, "topology": "v2:16x16", "global_batch_size": 32_768, "num_train_examples": 1_281_167,
       "flops_per_device": 1.54e12, "estimated_step_sec": 0.09685, "estimated_eval_step_sec": 0.03,
       "eval_steps_per_pass": 2, "num_epochs": 91.0, "eval_every_epochs": 4.0, "mlperf_mode": False,
       "compile_sec": 60.0}
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


# A fit for TPU v3's compiled steps (a, b, interval) to work by hand; TPU v2 borrows it.
V3_FIT = step_model.Calibration("TPU v3", "compiled", 1.4, 0.002, 0.1, ("p1", "p2", "p3"), (0.05, -0.1, 0.02))
FITS = {("TPU v3", "compiled"): V3_FIT}


def test_a_tpu_step_is_calibrated_borrowed_labelled_and_the_recipes_epochs_are_timed_by_hand():
    prediction = planning.predict(planning.system_from_report(POD), FITS,
                                  price=planning.Price(1.5, "an example"))
    # No published TPU v2 point: v3's fit, "uncalibrated", with twice its interval (at least 25%).
    step = 1.4 * 0.09685 + 0.002  # The fixture has no collectives.
    assert prediction.step_sec.basis == "uncalibrated"
    assert "TPU v3 (compiled)'s fit" in prediction.step_sec.note
    assert prediction.step_sec.value == pytest.approx(step)
    assert (prediction.step_low_sec, prediction.step_high_sec) == (pytest.approx(0.75 * step),
                                                                   pytest.approx(1.25 * step))
    assert prediction.raw_step_sec.value == pytest.approx(0.09685)
    assert prediction.raw_step_sec.basis == "compiled"
    # The recipe: 91 epochs = 3,557.9 steps, so 3,558; an evaluation every 4 epochs: ceil(91 / 4) = 23 of 2
    # steps, each 1.4 x 30 ms + 2 ms.
    clock = prediction.time_to_target
    assert clock.epochs.value == 91 and clock.epochs.basis == "recipe"
    assert clock.train_sec == pytest.approx(3558 * step)
    assert clock.eval_sec == pytest.approx(23 * 2 * (1.4 * 0.03 + 0.002))
    assert (clock.low_sec, clock.high_sec) == (pytest.approx(0.75 * clock.total_sec),
                                               pytest.approx(1.25 * clock.total_sec))
    # Cost: 256 chips at $1.50 an hour over the time to target and the 60 s compile billed before it.
    assert clock.cost_usd == pytest.approx(256 * 1.5 * (clock.total_sec + 60) / 3600)
    # The case study's clock (90 timed epochs, training only) for its comparisons: 3,519 steps.
    assert prediction.case_study_sec == pytest.approx(3519 * step)
    assert prediction.raw_time_to_target_sec == pytest.approx(3558 * 0.09685 + 23 * 2 * 0.03)
    assert prediction.images_per_sec == pytest.approx(32_768 / step)


def test_mlperf_mode_takes_mlperfs_reference_epochs_and_their_range():
    prediction = planning.predict(planning.system_from_report({**POD, "mlperf_mode": True}), FITS)
    # MLPerf's ten reference runs at 32,768 need 55-57 epochs, 56 without the extremes.
    clock, step = prediction.time_to_target, prediction.step_sec.value
    assert clock.epochs.value == 56.0 and clock.epochs.basis == "published"
    assert clock.train_sec == pytest.approx(math.ceil(56 * 1_281_167 / 32_768) * step)
    low_steps = math.ceil(55 * 1_281_167 / 32_768)
    assert clock.low_sec == pytest.approx(low_steps * 0.75 * step + 14 * 2 * 0.75 * (1.4 * 0.03 + 0.002))


def test_scaling_efficiency_is_per_chip_throughput_over_the_smallest_system_of_the_kind():
    predictions = planning.with_scaling_efficiency(
        [planning.predict(planning.system_from_report(r), FITS) for r in (POD, V2_8)])
    pod, v2_8 = predictions
    pod_step, v2_8_step = 1.4 * 0.09685 + 0.002, 1.4 * 0.178 + 0.002
    assert pod.scaling_efficiency.value == pytest.approx((32_768 / pod_step / 256) / (1024 / v2_8_step / 4))
    assert v2_8.scaling_efficiency.value == 1.0


def test_a_gpu_run_is_measured_from_its_summary_and_a_gpu_config_is_the_roofline_of_a_reference():
    from resnet_scaling import config as config_lib

    measured = planning.predict(planning.system_from_summary(GPU_SUMMARY), FITS)
    # The run's recipe (its summary's config has no training section: the case study's 91 epochs, an
    # evaluation every 4): 91 x 1,281,167 / 4,096 = 28,463.3 steps, so 28,464 at 4,096 / 64,000 = 64 ms;
    # ceil(91 / 4) = 23 evaluations at 2 s each (20 s over 10 in the run).
    assert measured.step_sec.basis == "measured" and measured.num_chips == 8
    assert measured.time_to_target.total_sec == pytest.approx(28_464 * 0.064 + 23 * 2.0)
    # A config alone: the roofline of a reference TPU program's FLOPs and HBM bytes per image (here 128
    # images on one chip: 3.1e12 FLOPs, 40e9 bytes) times the GPU's 512 images, at an H200's 989 TFLOP/s and
    # 4.8 TB/s, plus the gradients' all-reduce over NVLink (2 x 7/8 x 51 MB at 450 GB/s, 14 ring steps of
    # 2 us); an H100 fit (a = 1.5, b = 1 ms) is borrowed: no published H200 point.
    reference = {**POD, "device_kind": "TPU v5 lite", "num_chips": 1, "num_devices": 1, "topology": "v5e:1x1",
                 "global_batch_size": 128, "eval_global_batch_size": 128, "flops_per_device": 3.1e12,
                 "bytes_accessed_per_device": 40e9, "estimated_step_sec": None, "eval_flops_per_device": 1e12,
                 "eval_bytes_accessed_per_device": 10e9,
                 "collectives_by_group": [{"kind": "all-reduce", "group_size": 1, "count": 1,
                                           "num_bytes": 51e6}]}
    system = planning.system_from_config(config_lib.load_config("gpu_h200x8"), reference)
    h100 = step_model.Calibration("H100", "roofline", 1.5, 0.001, 0.1, ("a", "b", "c"))
    predicted = planning.predict(system, {("H100", "roofline"): h100})
    roofline = 3.1e12 * 4 / 989e12 + 40e9 * 4 / 4.8e12
    collectives = 14 * 2e-6 + 2 * 7 / 8 * 51e6 / 450e9
    assert predicted.step_sec.value == pytest.approx(1.5 * roofline + 0.001 + collectives)
    assert predicted.step_sec.basis == "uncalibrated" and "no published H200 point" in predicted.step_sec.note
    assert predicted.raw_step_sec.basis == "roofline"
    assert predicted.raw_step_sec.value == pytest.approx(roofline + collectives)
    alone = planning.predict(planning.system_from_config(config_lib.load_config("gpu_h200x8")), FITS)
    assert alone.step_sec.basis == "not predicted" and alone.time_to_target.total_sec is None


def test_host_cores_needed_divide_each_hosts_share_by_the_per_core_rate():
    rate = planning.Figure(1000.0, "given", "an example")
    prediction = planning.predict(planning.system_from_report(POD), FITS, input_images_per_sec_per_core=rate)
    assert prediction.host_cores_needed.value == pytest.approx(32_768 / (1.4 * 0.09685 + 0.002) / 64 / 1000)


def test_the_shipped_price_file_is_dated_and_sourced_and_bills_a_v100s_vm_per_node():
    prices = planning.load_prices()
    for kind in ("TPU v2", "TPU v3", "TPU v4", "TPU v5 lite", "TPU v5", "TPU v6 lite", "V100", "A100", "H100",
                 "H200"):
        price = planning.price_for(kind, prices)
        assert price.usd_per_chip_hour > 0 and price.source and price.date and price.basis == "shipped", kind
    v100 = planning.price_for("Tesla V100-SXM2-16GB", prices)
    assert v100.host_for(8).machine == "n1-standard-64" and v100.host_for(1).machine == "n1-standard-8"
    system = planning.System("8x V100", "Tesla V100-SXM2-16GB", 8, 1, 2496, planning.CASE_STUDY_RECIPE,
                             measured_step_sec=planning.Figure(0.3, "measured"), chips_per_node=8)
    clock = planning.predict(system, FITS, v100).time_to_target
    assert clock.cost_usd == pytest.approx((8 * v100.usd_per_chip_hour + v100.host_for(8).usd_per_hour)
                                           * clock.total_sec / 3600)


def test_a_price_is_found_by_device_kind_the_longest_name_first():
    prices = {"TPU v5": planning.Price(4.2, "a"), "TPU v5 lite": planning.Price(1.2, "b")}
    assert planning.price_for("TPU v5 lite", prices).usd_per_chip_hour == 1.2
    assert planning.price_for("TPU v5", prices).usd_per_chip_hour == 4.2
    assert planning.price_for("NVIDIA H200", prices) is None
    assert planning.price_for("Tesla V100-SXM2-16GB", planning.load_prices()).basis == "shipped"


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


def test_the_command_prints_rows_with_intervals_writes_json_and_a_chart(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "pod.json").write_text(json.dumps(POD))
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "summary.json").write_text(json.dumps(GPU_SUMMARY))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"H200": {"usd_per_chip_hour": 4.0, "source": "a test", "date": "2026-12"}}))
    result = subprocess.run(
        [sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"), str(tmp_path / "h200"),
         "gpu_v100", "--price=pod=1.5:an example", f"--prices={prices}",
         f"--json_out={tmp_path / 'plan.json'}", f"--chart_out={tmp_path / 'plan.png'}"],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    written = {p["system"]: p for p in json.loads((tmp_path / "plan.json").read_text())["predictions"]}
    fits = step_model.load_calibrations()
    # The pod: the shipped TPU v3 fit, borrowed (no published TPU v2 point), the raw estimate beside it.
    v3 = fits[("TPU v3", "compiled")]
    step = v3.a * 0.09685 + v3.b_sec
    assert written["pod"]["step_sec"]["value"] == pytest.approx(step)
    assert rows["pod"][4] == "uncalibrated" and rows["pod"][5] == "96.9 ms (compiled)"
    assert rows["pod"][3] == f"{step * 1e3:.1f} ms ({step * (1 - max(2 * v3.interval, 0.25)) * 1e3:.1f} ms-" \
        f"{step * (1 + max(2 * v3.interval, 0.25)) * 1e3:.1f} ms)"
    # --price for one row; the pod's 256 chips at $1.50 over its time and the 60 s compile.
    total = written["pod"]["time_to_target"]["total_sec"]
    assert written["pod"]["time_to_target"]["cost_usd"] == pytest.approx(256 * 1.5 * (total + 60) / 3600)
    # A measured GPU row at a --prices price: 8 H200s at $4, its step 64 ms, no interval.
    assert rows["8x H200"][3] == "64.0 ms" and rows["8x H200"][4] == "measured"
    assert written["8x H200"]["price"]["usd_per_chip_hour"] == 4.0
    # A GPU config: scaled from the shipped reference program, calibrated on NVIDIA's V100 results.
    v100 = rows["1x NVIDIA V100 (n1-standard-8)"]
    assert v100[4] == "calibrated" and v100[5].endswith("(roofline)")
    assert "- Host VM for Tesla V100-SXM2-16GB (n1-standard-8, one per node): $0.38 an hour" in result.stdout
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    refused = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "pod.json"),
                              "--price=v100=3:x"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "error: --price names v100, which no input is for." in refused.stderr
    missing = subprocess.run([sys.executable, "-m", "resnet_scaling.planner", str(tmp_path / "none.json"),
                              "no_such_config"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith(f"no such file: {tmp_path / 'none.json'}")


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
