"""The planner's model (`planning/estimates.py`) and command (`python -m resnet_scaling.planner`): figures
worked out by hand from MLPerf's published epochs and the case study's published pod time; the command
compiling a TPU config itself is in tests/planning/test_compile.py."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from resnet_scaling import planner
from resnet_scaling.planning import estimates as planning
from resnet_scaling.planning import step_model

REPO = pathlib.Path(__file__).resolve().parents[2]

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


# A fit for TPU v3's compiled steps (a, b, interval) to work by hand; TPU v2 borrows it, at the interval
# whole-generation borrowing measured (here 40%, chosen).
V3_FIT = step_model.Calibration("TPU v3", "compiled", 1.4, 0.002, 0.1, ("p1", "p2", "p3"),
                                (0.05, -0.1, 0.02), borrow_interval=0.4,
                                borrow_basis="whole-generation borrowing missed by up to +40%")
FITS = {("TPU v3", "compiled"): V3_FIT}
POD_STEP = 0.13759  # 1.4 x 96.85 ms + 2 ms, by hand.
SETUP_SEC = planning.ASSUMED_SETUP_SEC  # The assumption every bill carries (not a formula of the library).


def test_a_tpu_step_is_calibrated_borrowed_labelled_and_the_recipes_epochs_are_timed_by_hand():
    prediction = planning.predict(planning.system_from_report(POD), FITS,
                                  price=planning.Price(1.5, "an example"))
    # No published TPU v2 point: v3's fit, "uncalibrated", at the measured borrowing miss (40%).
    assert prediction.step_sec.basis == "uncalibrated"
    assert "TPU v3 (compiled)'s fit; ±40%: whole-generation borrowing missed by up to +40%" in (
        prediction.step_sec.note)
    assert prediction.step_sec.value == pytest.approx(POD_STEP)
    assert (prediction.step_low_sec, prediction.step_high_sec) == (pytest.approx(0.6 * POD_STEP),
                                                                   pytest.approx(1.4 * POD_STEP))
    assert prediction.raw_step_sec.value == pytest.approx(0.09685)
    assert prediction.raw_step_sec.basis == "compiled"
    # The recipe: 91 epochs = 3,557.9 steps, so 3,558; an evaluation every 4 epochs: ceil(91 / 4) = 23 of 2
    # steps, each 1.4 x 30 ms + 2 ms = 44 ms.
    clock = prediction.time_to_target
    assert clock.epochs.value == 91 and clock.epochs.basis == "recipe"
    assert clock.train_sec == pytest.approx(3558 * POD_STEP)
    assert clock.eval_sec == pytest.approx(23 * 2 * 0.044)
    assert (clock.low_sec, clock.high_sec) == (pytest.approx(0.6 * clock.total_sec),
                                               pytest.approx(1.4 * clock.total_sec))
    # One bill: 256 chips at $1.50 an hour ($384) over the training, the evaluations and the set-up assumed
    # for every system (not the report's 60 s compile on the machine it was made on).
    bill = clock.bill
    assert (bill.accelerators_usd_per_hour, bill.hosts_usd_per_hour) == (384.0, 0.0)
    assert bill.setup.basis == "assumed" and bill.setup.value == SETUP_SEC
    assert bill.train_usd == pytest.approx(384 * 3558 * POD_STEP / 3600)
    assert bill.eval_usd == pytest.approx(384 * 23 * 2 * 0.044 / 3600)
    assert bill.setup_usd == pytest.approx(384 * SETUP_SEC / 3600)
    assert clock.cost_usd == pytest.approx(384 * (3558 * POD_STEP + 23 * 2 * 0.044 + SETUP_SEC) / 3600)
    # The case study's clock (90 timed epochs, training only) for its comparisons: 3,519 steps.
    assert prediction.case_study_sec == pytest.approx(3519 * POD_STEP)
    assert prediction.raw_time_to_target_sec == pytest.approx(3558 * 0.09685 + 23 * 2 * 0.03)
    assert prediction.images_per_sec == pytest.approx(32_768 / POD_STEP)


def test_mlperf_mode_takes_mlperfs_reference_epochs_and_their_range():
    prediction = planning.predict(planning.system_from_report({**POD, "mlperf_mode": True}), FITS)
    # MLPerf's ten reference runs at 32,768 need 55-57 epochs, 56 without the extremes.
    clock = prediction.time_to_target
    assert clock.epochs.value == 56.0 and clock.epochs.basis == "published"
    assert clock.train_sec == pytest.approx(math.ceil(56 * 1_281_167 / 32_768) * POD_STEP)
    low_steps = math.ceil(55 * 1_281_167 / 32_768)
    assert clock.low_sec == pytest.approx(low_steps * 0.6 * POD_STEP + 14 * 2 * 0.6 * 0.044)


def test_scaling_efficiency_is_the_step_without_collectives_over_the_step_whatever_else_is_listed():
    # The pod's gradients: 51 MB a device, 102 MB a chip, all-reduced over its 16x16 torus: 60 ring steps of
    # 1 us and 2 x 255/256 x 102 MB at the v2 link's assumed 62 GB/s.
    pod = {**POD, "collectives_by_group": [{"kind": "all-reduce", "group_size": 512, "count": 1,
                                            "num_bytes": 51e6}]}
    collectives = 60e-6 + 2 * 255 / 256 * 102e6 / 62e9
    systems = [planning.system_from_report(r) for r in (pod, V2_8)]
    both = planning.with_scaling_efficiency([planning.predict(s, FITS) for s in systems], FITS, systems)
    alone = planning.with_scaling_efficiency([planning.predict(systems[0], FITS)], FITS, systems[:1])
    assert both[0].scaling_efficiency.value == pytest.approx(POD_STEP / (POD_STEP + collectives))
    assert alone[0].scaling_efficiency.value == both[0].scaling_efficiency.value
    assert both[1].scaling_efficiency.value == pytest.approx(1.0)  # No collectives in the fixture.


def test_a_gpu_run_is_measured_from_its_summary_and_a_gpu_plan_is_the_roofline_of_a_reference():
    from resnet_scaling import config as config_lib
    from resnet_scaling.config import plan as plan_lib

    measured = planning.predict(planning.system_from_summary(GPU_SUMMARY), FITS)
    # The run's recipe (its summary's config has no training section: the case study's 91 epochs, an
    # evaluation every 4): 91 x 1,281,167 / 4,096 = 28,463.3 steps, so 28,464 at 4,096 / 64,000 = 64 ms;
    # ceil(91 / 4) = 23 evaluations at 2 s each (20 s over 10 in the run).
    assert measured.step_sec.basis == "measured" and measured.num_chips == 8
    assert measured.time_to_target.total_sec == pytest.approx(28_464 * 0.064 + 23 * 2.0)
    # A plan alone: the roofline of a reference TPU program's FLOPs and HBM bytes per image (here 128
    # images on one chip: 3.1e12 FLOPs, 40e9 bytes) times the GPU's 512 images, at an H200's 989 TFLOP/s and
    # 4.8 TB/s, plus the gradients' all-reduce over NVLink (2 x 7/8 x 51 MB at 450 GB/s, 14 ring steps of
    # 2 us); an H100 fit (a = 1.5, b = 1 ms) is borrowed: no published H200 point.
    reference = {**POD, "device_kind": "TPU v5 lite", "num_chips": 1, "num_devices": 1, "topology": "v5e:1x1",
                 "global_batch_size": 128, "eval_global_batch_size": 128, "flops_per_device": 3.1e12,
                 "bytes_accessed_per_device": 40e9, "estimated_step_sec": None, "eval_flops_per_device": 1e12,
                 "eval_bytes_accessed_per_device": 10e9,
                 "collectives_by_group": [{"kind": "all-reduce", "group_size": 1, "count": 1,
                                           "num_bytes": 51e6}]}
    config = config_lib.load_config("gpu_h200x8")
    plan = plan_lib.derive(config, 1_281_167, 8)
    system = planning.system_from_plan("8x H200", "NVIDIA H200", plan, planning.CASE_STUDY_RECIPE, reference)
    assert (system.num_chips, system.global_batch, system.chips_per_node) == (8, 4096, 8)
    h100 = step_model.Calibration("H100", "roofline", 1.5, 0.001, 0.1, ("a", "b", "c"), borrow_interval=0.3)
    predicted = planning.predict(system, {("H100", "roofline"): h100})
    roofline = 3.1e12 * 4 / 989e12 + 40e9 * 4 / 4.8e12
    collectives = 14 * 2e-6 + 2 * 7 / 8 * 51e6 / 450e9
    assert predicted.step_sec.value == pytest.approx(1.5 * roofline + 0.001 + collectives)
    assert predicted.step_sec.basis == "uncalibrated" and "no published H200 point" in predicted.step_sec.note
    assert predicted.step_high_sec == pytest.approx(1.3 * predicted.step_sec.value)
    assert predicted.raw_step_sec.basis == "roofline"
    assert predicted.raw_step_sec.value == pytest.approx(roofline + collectives)
    alone = planning.predict(planning.system_from_plan("8x H200", "NVIDIA H200", plan,
                                                       planning.CASE_STUDY_RECIPE), FITS)
    assert alone.step_sec.basis == "not predicted" and alone.time_to_target.total_sec is None


def test_host_cores_needed_divide_each_hosts_share_by_the_per_core_rate():
    rate = planning.Figure(1000.0, "given", "an example")
    prediction = planning.predict(planning.system_from_report(POD), FITS, input_images_per_sec_per_core=rate)
    # 32,768 images a 137.59 ms step over 64 hosts: 3,721 images/sec a host, 3.7 cores at 1,000 a core.
    assert prediction.host_cores_needed.value == pytest.approx(3.7212, abs=1e-4)


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
    bill = planning.predict(system, FITS, v100).time_to_target.bill
    # prices.json: a V100 $2.48 an hour, its n1-standard-64 VM $3.04 a node; 91 epochs of 2,496 images are
    # 46,710 steps of 0.3 s, no evaluation program, and the assumed set-up.
    assert (bill.accelerators_usd_per_hour, bill.hosts_usd_per_hour) == (pytest.approx(8 * 2.48), 3.04)
    assert bill.total_usd == pytest.approx((8 * 2.48 + 3.04) * (46_710 * 0.3 + SETUP_SEC) / 3600)


def test_a_price_is_found_by_device_kind_the_longest_name_first():
    prices = {"TPU v5": planning.Price(4.2, "a"), "TPU v5 lite": planning.Price(1.2, "b")}
    assert planning.price_for("TPU v5 lite", prices).usd_per_chip_hour == 1.2
    assert planning.price_for("TPU v5", prices).usd_per_chip_hour == 4.2
    assert planning.price_for("NVIDIA H200", prices) is None
    assert planning.price_for("Tesla V100-SXM2-16GB", planning.load_prices()).basis == "shipped"


@pytest.mark.parametrize("price, rate", [("pod=abc:x", "abc:x"), ("pod=1.2", "1.2"), ("=1.2:x", "0:x"),
                                         ("pod=-1:x", "-1:x"), ("pod=nan:x", "nan:x")])
def test_a_malformed_price_or_input_rate_is_refused(price, rate):
    with pytest.raises(ValueError, match="expected"):
        planner.parse_price(price)
    with pytest.raises(ValueError, match="expected"):
        planner.parse_input_rate(rate)
    assert planner.parse_price("pod=1.35:pricing page, 2026-12-02") == (
        "pod", planning.Price(1.35, "pricing page, 2026-12-02"))
    assert planner.parse_input_rate("1143:input_pipeline.py") == planning.Figure(1143, "given",
                                                                                  "input_pipeline.py")


def _planner(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "resnet_scaling.planner", *map(str, args)],
                          capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


def test_the_command_prints_rows_with_intervals_writes_json_and_a_chart(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "pod.json").write_text(json.dumps(POD))
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "summary.json").write_text(json.dumps(GPU_SUMMARY))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"H200": {"usd_per_chip_hour": 4.0, "source": "a test", "date": "2026-12"}}))
    result = _planner(tmp_path / "pod.json", tmp_path / "h200", "gpu_v100", "--price=pod=1.5:an example",
                      f"--prices={prices}", f"--json_out={tmp_path / 'plan.json'}",
                      f"--chart_out={tmp_path / 'plan.png'}")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in result.stdout.split("\n\n")[0].splitlines()
            if line.startswith("| ") and "---" not in line}
    written = {p["system"]: p for p in json.loads((tmp_path / "plan.json").read_text())["predictions"]}
    # The pod: the shipped TPU v3 fit, borrowed (no published TPU v2 point), with the interval and the raw
    # estimate in its note.
    assert rows["pod"][4] == "uncalibrated" and "ms (" in rows["pod"][3]
    assert "- pod: uncalibrated step, " in result.stdout and "whole-generation borrowing" in result.stdout
    assert "raw model 96.9 ms" in result.stdout
    # --price for one row: 256 chips at $1.50 = $384 an hour; each term of the bill in the JSON.
    bill = written["pod"]["time_to_target"]["bill"]
    assert bill["accelerators_usd_per_hour"] == 384.0 and bill["setup"]["basis"] == "assumed"
    assert bill["total_usd"] == pytest.approx(bill["train_usd"] + bill["eval_usd"] + bill["setup_usd"])
    # A measured GPU row at a --prices price: 8 H200s at $4, its step 64 ms, no interval.
    assert rows["8x H200"][3] == "64.0 ms" and rows["8x H200"][4] == "measured"
    assert written["8x H200"]["price"]["usd_per_chip_hour"] == 4.0
    # A GPU config: scaled from the shipped reference program, calibrated on NVIDIA's V100 results.
    assert rows["1x NVIDIA V100 (n1-standard-8)"][4] == "calibrated"
    assert written["1x NVIDIA V100 (n1-standard-8)"]["raw_step_sec"]["basis"] == "roofline"
    assert "n1-standard-8 $0.38/h a node" in result.stdout
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    refused = _planner(tmp_path / "pod.json", "--price=v100=3:x")
    assert refused.returncode == 1 and "error: --price names v100, which no input is for." in refused.stderr
    missing = _planner(tmp_path / "none.json", "no_such_config")
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith(f"no such file: {tmp_path / 'none.json'}")


BAD_REPORTS = {"null": "null", "a list": "[1, 2]", "not JSON": "{pod", "no fields": "{}",
               "0 chips": json.dumps({**POD, "num_chips": 0}),
               "-4 chips": json.dumps({**POD, "num_chips": -4}),
               "a batch of 0": json.dumps({**POD, "global_batch_size": 0}),
               "a summary of 0 devices": json.dumps({**GPU_SUMMARY,
                                                     "run": {**GPU_SUMMARY["run"], "devices": 0}}),
               "a summary's rate of -1": json.dumps({**GPU_SUMMARY, "throughput": {"images_per_sec": -1}}),
               "a summary without its time": json.dumps({"run": GPU_SUMMARY["run"], "throughput": {}})}
BAD_PRICES = {"a list": "[]", "null": "null", "a negative price": '{"TPU v2": {"usd_per_chip_hour": -3, '
              '"source": "x"}}', "a negative host VM": '{"V100": {"usd_per_chip_hour": 2, "source": "x", '
              '"host_vm": {"8": {"machine": "n1", "usd_per_hour": -1, "source": "x"}}}}',
              "no source": '{"TPU v2": {"usd_per_chip_hour": 3}}'}


@pytest.mark.parametrize("what", BAD_REPORTS)
def test_a_malformed_report_or_summary_is_a_value_error_naming_the_file_or_field(tmp_path, what):
    path = tmp_path / "input.json"
    path.write_text(BAD_REPORTS[what])
    with pytest.raises(ValueError, match=r"expected|not JSON|not a compile report|not a run's summary"):
        planner.load_system(str(path))


@pytest.mark.parametrize("what", BAD_PRICES)
def test_a_malformed_price_file_is_a_value_error(tmp_path, what):
    path = tmp_path / "prices.json"
    path.write_text(BAD_PRICES[what])
    with pytest.raises(ValueError, match=r"expected|below 0|needs usd_per_chip_hour"):
        planning.load_prices(path)


def test_bad_input_is_one_error_line_and_nothing_else(tmp_path):
    (tmp_path / "null.json").write_text("null")
    (tmp_path / "prices.json").write_text(BAD_PRICES["a negative price"])
    for args, expected in (([tmp_path / "null.json"], "expected a compile report or a run's summary.json"),
                           (["pod", f"--prices={tmp_path / 'prices.json'}"], "has a price below 0"),
                           (["--config=gpu_h100x8", "--config.mesh.num_devices=0"], "num_devices is 0")):
        result = _planner(*args)
        assert result.returncode == 1 and result.stdout == "", result.stdout
        lines = [line for line in result.stderr.splitlines() if " Recipe " not in line]
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr


def test_what_if_in_one_line_with_trains_overrides_writes_nothing(tmp_path):
    """64 H100s at 3,200 images a step, asked as train asks: 50 images a GPU, 8 nodes of 8."""
    result = _planner("--config=gpu_h100x8", "--config.mesh.num_devices=64",
                      "--config.training.global_batch_size=3200", cwd=tmp_path,
                      env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
    (what_if,) = [line for line in result.stdout.splitlines() if line.startswith("| what-if: gpu_h100x8")]
    cells = [c.strip() for c in what_if.strip("|").split("|")]
    assert cells[0] == "what-if: gpu_h100x8 with mesh.num_devices=64, training.global_batch_size=3200"
    assert cells[1] == "64 x NVIDIA H100 80GB HBM3" and cells[2] == "3,200" and cells[4] == "calibrated"
    assert "| to the target | fastest | cheapest |" in result.stdout  # Beside the shipped systems.


def test_chart_out_without_matplotlib_fails_before_anything_is_planned(tmp_path):
    fake = tmp_path / "no_matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}
    result = _planner("pod", f"--chart_out={tmp_path / 'plan.png'}", env=env)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == ("error: --chart_out needs matplotlib: "
                                     "pip install 'resnet_scaling[benchmarks]'")


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
