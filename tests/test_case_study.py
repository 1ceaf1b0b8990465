"""benchmarks/case_study.py: the report and charts from fixture summaries, prices, the scaling predictor."""

import dataclasses
import importlib.util
import json
import pathlib
import sys

import pytest

from resnet_scaling import metrics
from resnet_scaling.analysis import planning

REPO = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("case_study", REPO / "benchmarks" / "case_study.py")
case_study = importlib.util.module_from_spec(spec)
sys.modules.setdefault("case_study", case_study)  # dataclasses look their module up while it loads.
spec.loader.exec_module(case_study)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _shipped_config(name):
    """The `config.to_dict()` a run of configs/NAME.py writes into its summary.json."""
    path = REPO / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_case_study_config_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().to_dict()


def _fixture_summary(devices, device_kind, images_per_sec, system_name="", config=None):
    """A summary.json of `config` (default: configs/pod.py, the case study's workload)."""
    config = dict(config or _shipped_config("pod"))
    config["system"] = {**config.get("system", {}), "name": system_name}
    return metrics.build_summary(
        run={"devices": devices, "device_kind": device_kind, "platform": "tpu", "process_count": 1,
             "global_batch_size": 128 * devices, "per_device_batch_size": 128, "steps_per_epoch": 10,
             "start_step": 0, "final_step": 20, "total_steps": 20, "timing_warmup_steps": 10,
             "preempted": False},
        throughput={"images_per_sec": images_per_sec, "images_per_sec_per_device": images_per_sec / devices,
                    "steady_state_steps": 10, "steady_state_sec": 1.0, "step_time_sec_p50": 0.1,
                    "step_time_sec_p90": 0.1, "step_time_sec_p99": 0.1, "input_wait_fraction": 0.0},
        time={"compile_sec": 1.0, "train_sec": 2.0, "eval_sec": 0.5, "checkpoint_sec": 0.0, "wall_sec": 3.0},
        accuracy=metrics.TimeToAccuracy().result(),
        utilisation={"flops_per_step": None, "flops_per_step_per_device": None,
                     "tflops_per_sec_per_device": None, "peak_tflops_per_device": None, "mfu": None},
        config=config)


def _with_data(config, **data):
    return {**config, "data": {**config["data"], **data}}


def _report(out):
    return json.loads((out / "case_study.json").read_text())


def test_report_and_charts_from_fixture_summaries(tmp_path):
    small = tmp_path / "v2_8.json"
    small.write_text(json.dumps(_fixture_summary(8, "TPU v2", 3800.0, "Cloud TPU v2-8")))
    big = tmp_path / "v2_32"
    big.mkdir()
    (big / "summary.json").write_text(json.dumps(_fixture_summary(32, "TPU v2", 14440.0)))
    out = tmp_path / "report"
    text = case_study.main(["--summaries", str(small), str(big), "--out_dir", str(out)])

    rows = {r["system"]: r for r in _report(out)["case_study"]}
    assert {r["source"] for r in rows.values()} == {"published", "measured"}
    v2_8, v2_32 = rows["Cloud TPU v2-8"], rows["32x TPU v2"]
    assert v2_8["chips"] == 4 and v2_32["chips"] == 16  # Two JAX devices (cores) per v2 chip.
    assert v2_32["scaling_efficiency"] == pytest.approx((14440 / 16) / (3800 / 4))
    assert v2_8["minutes_90_epochs"] == pytest.approx(90 * 1_281_167 / 3800 / 60)
    assert v2_8["cost_usd"] == pytest.approx(4 * 1.50 * v2_8["minutes_90_epochs"] / 60)
    assert "| Cloud TPU v2-8 | measured | 4 | 3,800 (measured) |" in text
    assert "| 1x V100 (n1-standard-8) | published |" in text
    assert "assumed" in text  # The price table says its prices are assumed.
    for name in ("speedup.png", "cost.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert not (out / "other_workloads.png").exists()
    assert (out / "case_study.md").read_text() == text


def test_workload_of_reads_the_run_config():
    assert planning.workload_of(_shipped_config("pod")).mismatches == ()
    versioned = _with_data(_shipped_config("pod"), dataset="imagenet2012:5.1.0")
    assert planning.workload_of(versioned).mismatches == ()
    demo = planning.workload_of(_shipped_config("demo"))
    assert demo.label == "resnet18 (16 filters), shapes, 32 px" and not demo.synthetic
    assert [m.split(" is ")[0] for m in demo.mismatches] == [
        "model.name", "model.num_filters", "data.image_size", "data.source"]
    other_tfds = planning.workload_of(_with_data(_shipped_config("pod"), dataset="imagenette"))
    assert other_tfds.mismatches == ("data.dataset is 'imagenette', not 'imagenet2012'",)
    synthetic = planning.workload_of(_with_data(_shipped_config("pod"), source="synthetic"))
    assert synthetic.mismatches == () and synthetic.synthetic
    assert "synthetic data" in synthetic.label
    folders = planning.workload_of(_with_data(_shipped_config("pod"), source="folders"))
    assert "class folders" in folders.mismatches[0]
    assert all("not recorded" in m for m in planning.workload_of({}).mismatches)  # An older summary.


def test_other_workloads_are_refused_by_default(tmp_path, capsys):
    demo = tmp_path / "demo.json"
    demo.write_text(json.dumps(_fixture_summary(1, "cpu", 1281.0, config=_shipped_config("demo"))))
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_info:
        case_study.main(["--summaries", str(demo), "--out_dir", str(out)])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    for why in ("not the case study's workload", "model.name is 'resnet18'", "model.num_filters is 16",
                "data.image_size is 32", "data.source is 'shapes'", "--allow_other_workloads", str(demo)):
        assert why in message
    assert not out.exists()  # Refused before anything is written.

    small = tmp_path / "r50_32px.json"  # The right model at another image size is another workload too.
    small.write_text(json.dumps(_fixture_summary(8, "TPU v2", 9000.0, config=_with_data(
        _shipped_config("pod"), image_size=32))))
    with pytest.raises(planning.WorkloadError, match="data.image_size is 32, not 224"):
        case_study.load_measured([str(small)], allow_other_workloads=False)


def test_other_workloads_go_to_a_separate_labelled_section(tmp_path):
    demo = tmp_path / "demo.json"
    demo.write_text(json.dumps(_fixture_summary(1, "cpu", 1281.0, config=_shipped_config("demo"))))
    v2_8 = tmp_path / "v2_8.json"
    v2_8.write_text(json.dumps(_fixture_summary(8, "TPU v2", 3800.0, "Cloud TPU v2-8")))
    out = tmp_path / "report"
    text = case_study.main(["--summaries", str(demo), str(v2_8), "--out_dir", str(out),
                            "--allow_other_workloads"])

    report = _report(out)
    assert [r["system"] for r in report["other_workloads"]] == ["1x cpu"]
    assert report["other_workloads"][0]["workload"] == "resnet18 (16 filters), shapes, 32 px"
    assert "1x cpu" not in {r["system"] for r in report["case_study"]}
    assert "1x cpu" not in {c["system"] for c in report["predictor"]["comparisons"]}
    case_part, other_part = text.split("## Other workloads")
    assert "1x cpu" not in case_part and "Cloud TPU v2-8" in case_part
    assert "not comparable" in other_part
    assert "| 1x cpu | resnet18 (16 filters), shapes, 32 px | measured | 1 | 1,281.0 |" in other_part
    assert (out / "other_workloads.png").read_bytes()[:8] == PNG_MAGIC

    # A later run without other workloads leaves no stale chart behind.
    case_study.main(["--summaries", str(v2_8), "--out_dir", str(out)])
    assert not (out / "other_workloads.png").exists()


def test_synthetic_resnet50_is_shown_and_labelled(tmp_path):
    synthetic = tmp_path / "synthetic.json"
    config = _with_data(_shipped_config("pod"), source="synthetic")
    synthetic.write_text(json.dumps(_fixture_summary(8, "TPU v2", 4000.0, "v2-8 synthetic", config)))
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_fixture_summary(32, "TPU v2", 14440.0, "v2-32 imagenet")))
    out = tmp_path / "report"
    text = case_study.main(["--summaries", str(synthetic), str(real), "--out_dir", str(out)])
    rows = {r["system"]: r for r in _report(out)["case_study"]}
    assert rows["v2-8 synthetic"]["source"] == "measured (synthetic data)"
    assert "| v2-8 synthetic | measured (synthetic data) | 4 |" in text
    # No input pipeline: real runs' efficiencies are not taken against the synthetic one.
    assert rows["v2-32 imagenet"]["scaling_efficiency"] is None
    assert rows["Cloud TPU v2 Pod (v2-512)"]["reference"] == "v2-32 imagenet"


def test_published_rows_reproduce_the_case_study():
    rows = {r["system"]: r for r in case_study.table_rows(case_study.PUBLISHED, case_study.PRICES)}
    v100, v100x8, pod = (rows[s.name] for s in case_study.PUBLISHED)
    assert pod["minutes_90_epochs"] == pytest.approx(7.9)
    assert pod["speedup_over_1x_v100"] == pytest.approx(197.5, abs=0.5)  # "about 200x" (26 h / 7.9 min).
    assert v100x8["minutes_90_epochs"] / pod["minutes_90_epochs"] == pytest.approx(27)
    # "nearly 40% lower cost" with the assumed prices: ~$51 for the pod against ~$81 for 8 V100s.
    assert pod["cost_usd"] == pytest.approx(384 * 7.9 / 60, rel=1e-3)
    assert v100x8["cost_usd"] == pytest.approx((8 * 2.48 + 3.04) * 27 * 7.9 / 60, rel=1e-3)
    assert 0.35 < 1 - pod["cost_usd"] / v100x8["cost_usd"] < 0.40
    assert v100["scaling_efficiency"] is None
    assert v100x8["scaling_efficiency"] == pytest.approx(0.914, abs=0.01)


def test_an_edited_price_table_changes_the_cost(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"accelerators": {"TPU v2": [3.0, "mine"]}, "vms": {}}))
    table = case_study.load_prices(str(prices))
    pod = case_study.PUBLISHED[2]
    default_cost = case_study.cost_per_run(pod, case_study.PRICES)
    assert case_study.cost_per_run(pod, table) == pytest.approx(2 * default_cost)
    assert case_study.cost_per_run(case_study.PUBLISHED[0], table) is None  # No V100 price: no cost.


def test_ring_allreduce_model():
    link = case_study.Interconnect("test", bandwidth_bytes_per_sec=1e9, latency_sec=0.0)
    assert case_study.allreduce_sec(1e9, 1, link) == 0.0
    assert case_study.allreduce_sec(1e9, 4, link) == pytest.approx(2 * 3 / 4)  # 2 (N-1)/N B / bw.
    torus = dataclasses.replace(link, topology="torus2d")
    # 4x4 torus: the x rings move 2*3/4 of the bytes, then the y rings 2*3/4 of a quarter of them.
    assert case_study.allreduce_sec(1e9, 16, torus) == pytest.approx(1.5 + 1.5 / 4)
    p = case_study.predict(one_chip_step_sec=1.0, gradient_bytes=1e9, num_chips=4, link=link)
    assert p["step_sec"] == pytest.approx(2.5) and p["speedup"] == pytest.approx(4 / 2.5)


def _published_comparisons():
    rows = case_study.table_rows(case_study.PUBLISHED, case_study.PRICES)
    curves = case_study.build_curves(case_study.PUBLISHED[0])
    return {c["system"]: c for c in case_study.compare(rows, curves, case_study.PUBLISHED[0].images_per_sec)}


def test_predictor_compared_with_the_case_study():
    """The V100 curve from the one-V100 row and nominal NVLink; the TPU v2 curve from the planner: the v2
    configs' compiled steps (benchmarks/results/compile/), uncompensated."""
    reports = [json.loads(path.read_text()) for path in case_study.V2_COMPILE_REPORTS]
    v100_curve, tpu_curve = case_study.build_curves(case_study.PUBLISHED[0])
    # Each point by hand from its report: images/sec = global batch / libtpu's step estimate.
    assert dict(tpu_curve.points) == pytest.approx(
        {r["num_chips"]: r["global_batch_size"] / r["estimated_step_sec"] for r in reports})
    assert tpu_curve.chip_counts() == [4, 16, 64, 128, 256]
    assert "libtpu's estimate" in tpu_curve.chip_basis

    by_system = _published_comparisons()
    assert case_study.PUBLISHED[0].name not in by_system  # The V100 curve's input is not compared with it.
    gpus, pod = by_system["8x V100 (n1-standard-64)"], by_system["Cloud TPU v2 Pod (v2-512)"]
    # Worked out by hand from the published figures alone: one V100 took 26 h and the pod 7.9 min, 27x
    # faster than 8 V100s, so 8 V100s took 213.3 min: a speedup of 1560 / 213.3 = 7.31, 91.4% of 8.
    assert gpus["row_scaling_efficiency"] == pytest.approx(26 * 60 / (27 * 7.9) / 8, rel=1e-9)
    # The V100 curve by hand: 1,281,167 x 90 images in 26 h is 1,231.8 images/sec, so a step of 312
    # images takes 253.3 ms; a ring all-reduce of float32 gradients of 25,557,032 parameters over 8 GPUs
    # at a nominal 130 GB/s, 5 us per hop, takes 2 x 7/8 x 102.2 MB / 130 GB/s + 14 x 5 us = 1.446 ms.
    v100_rate = 1_281_167 * 90 / (26 * 3600)
    step_sec = 312 / v100_rate
    allreduce_sec = 2 * 7 / 8 * 4 * 25_557_032 / 130e9 + 14 * 5e-6
    assert gpus["predicted_scaling_efficiency"] == pytest.approx(step_sec / (step_sec + allreduce_sec),
                                                                 rel=1e-9)
    assert gpus["predicted_speedup"] == pytest.approx(8 * step_sec / (step_sec + allreduce_sec), rel=1e-9)
    # The model has no host or input-pipeline limits: ~99% efficiency for 8 V100s where the published
    # figures imply ~91%, so it predicts ~8.8% more speedup than published. That is reported, not hidden.
    published_8x = 26 * 60 / (27 * 7.9)
    assert gpus["gap"] == pytest.approx(8 * step_sec / (step_sec + allreduce_sec) / published_8x - 1)
    # The pod by hand from its compile report: its compiled images/sec over one V100's, against 26 h / 7.9
    # min; libtpu's estimate is faster than the published pod, so the gap is positive.
    pod_report = next(r for r in reports if r["num_chips"] == 256)
    predicted = pod_report["global_batch_size"] / pod_report["estimated_step_sec"] / v100_rate
    assert pod["predicted_speedup"] == pytest.approx(predicted)
    assert pod["gap"] == pytest.approx(predicted / (26 * 60 / 7.9) - 1) and pod["gap"] > 0


def test_predicted_curve_does_not_move_with_the_published_pod(tmp_path, monkeypatch):
    case_study.main(["--out_dir", str(tmp_path / "a")])
    pod = case_study.PUBLISHED[2]
    faster_pod = dataclasses.replace(pod, images_per_sec=case_study._from_minutes(5.0),
                                     published_minutes=5.0)
    monkeypatch.setattr(case_study, "PUBLISHED", (*case_study.PUBLISHED[:2], faster_pod))
    case_study.main(["--out_dir", str(tmp_path / "b")])

    before, after = _report(tmp_path / "a")["predictor"], _report(tmp_path / "b")["predictor"]
    assert after["curves"] == before["curves"]
    compared = [{c["system"]: c for c in r["comparisons"]}[pod.name] for r in (before, after)]
    assert compared[0]["predicted_speedup"] == compared[1]["predicted_speedup"]
    assert compared[1]["row_speedup"] == pytest.approx(compared[0]["row_speedup"] * 7.9 / 5.0)
    # A measured one-chip rate does move it, and says so.
    _, tpu_curve = case_study.build_curves(case_study.PUBLISHED[0], tpu_chip_images_per_sec=900.0)
    assert tpu_curve.chip_images_per_sec == 900.0 and "measured" in tpu_curve.chip_basis


def test_markdown_says_what_is_derived_and_assumed(tmp_path):
    text = case_study.main(["--out_dir", str(tmp_path)])
    main_table = text.split("## Scaling predictor")[0]
    table = {line.split(" | ")[0][2:]: line for line in main_table.splitlines() if line.startswith("| ")}
    assert "| 1,232 (derived) | 26.0 h (published) |" in table["1x V100 (n1-standard-8)"]
    assert "| 9,010 (derived) | 3.6 h (derived) |" in table["8x V100 (n1-standard-64)"]
    assert "| 243,260 (derived) | 7.9 min (published) |" in table["Cloud TPU v2 Pod (v2-512)"]
    assert "speedup over 1x V100 (derived)" in text and "cost per run (assumed prices)" in text
    assert "time derived: 27 x 7.9 min = 213 min" in text
    assert "libtpu's estimate of each v2 config's compiled step (uncompensated)" in text
    assert "not bounds either way" in text
    assert text.count("| assumed: ") == len(case_study.PRICES["accelerators"]) + len(case_study.PRICES["vms"])


def _compile_report(path, num_chips, batch, step_sec):
    path.write_text(json.dumps({"system": path.stem, "model": "resnet50", "device_kind": "TPU v2",
                                "num_chips": num_chips, "global_batch_size": batch,
                                "num_train_examples": 1_281_167, "estimated_step_sec": step_sec}))
    return str(path)


def test_predicted_vs_published_disagreement_is_reported(tmp_path):
    # Fixed compile reports (a v2-8 at 178 ms a step of 1,024, the pod at 96.85 ms a step of 32,768), so
    # that the expected figures do not move when benchmarks/results/ is regenerated.
    reports = [_compile_report(tmp_path / "v2_8.json", 4, 1024, 0.178),
               _compile_report(tmp_path / "pod.json", 256, 32_768, 0.09685)]
    text = case_study.main(["--out_dir", str(tmp_path), "--compile_reports", *reports])
    assert "| 8x V100 (n1-standard-64) | published | 8 | 7.95x | 7.31x | +8.8% | 99% | 91% |" in text
    # By hand: 32,768 / 0.09685 = 338,338 images/sec over one V100's 1,231.9 = 274.65x against 197.47x
    # (+39.1%); per chip 1,321.6 against the v2-8's 1,024 / 0.178 / 4 = 1,438.2 (92%).
    assert "| Cloud TPU v2 Pod (v2-512) | published | 256 | 274.65x | 197.47x | +39.1% | 92% | — |" in text
    gpus = next(line for line in text.splitlines() if line.startswith("- 8x V100 (n1-standard-64): pred"))
    assert "disagree" in gpus and "7.95x" in gpus and "7.31x" in gpus and "+8.8%" in gpus
    assert "- Pod over 8x V100: predicted 34.5x, published 27.0x." in text
