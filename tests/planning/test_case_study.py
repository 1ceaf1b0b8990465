"""benchmarks/case_study.py: the report and charts from fixture summaries, prices, the scaling predictor."""

import dataclasses
import importlib.util
import json
import pathlib

import pytest

from resnet_scaling import metrics
from resnet_scaling.planning import estimates as planning
from tests.helpers import load_benchmark

REPO = pathlib.Path(__file__).resolve().parents[2]
case_study = load_benchmark("case_study")

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
    assert pod["speedup_over_1x_v100"] == pytest.approx(197.5, abs=0.5)  # "about 200x" (26 h / 7.9 min).
    assert v100x8["minutes_90_epochs"] / pod["minutes_90_epochs"] == pytest.approx(27)
    # "nearly 40% lower cost" with the assumed prices: ~$51 for the pod against ~$81 for 8 V100s.
    assert pod["cost_usd"] == pytest.approx(384 * 7.9 / 60, rel=1e-3)
    assert v100x8["cost_usd"] == pytest.approx((8 * 2.48 + 3.04) * 27 * 7.9 / 60, rel=1e-3)
    assert 0.35 < 1 - pod["cost_usd"] / v100x8["cost_usd"] < 0.40
    assert v100["scaling_efficiency"] is None
    assert v100x8["scaling_efficiency"] == pytest.approx(0.914, abs=0.01)


def test_an_edited_price_table_changes_the_cost(tmp_path):
    prices = tmp_path / "prices.json"  # The planner's shape (planning/prices.json).
    prices.write_text(json.dumps({"TPU v2": {"usd_per_chip_hour": 3.0, "source": "mine"}}))
    table = case_study.load_prices(str(prices))
    pod, v100 = case_study.PUBLISHED[2], case_study.PUBLISHED[0]
    default_cost = case_study.cost_per_run(pod, case_study.PRICES)
    assert case_study.cost_per_run(pod, table) == pytest.approx(2 * default_cost)
    assert table["accelerators"]["TPU v2"] == (3.0, "given: mine")
    # Kinds the file lacks keep the shipped prices, as the planner's --prices.
    assert case_study.cost_per_run(v100, table) == case_study.cost_per_run(v100, case_study.PRICES)


def test_the_report_reads_the_planners_price_table_but_for_the_case_studys_pod():
    shipped = planning.load_prices()
    accelerators, vms = case_study.PRICES["accelerators"], case_study.PRICES["vms"]
    assert accelerators["V100"][0] == shipped["V100"].usd_per_chip_hour
    assert {machine: usd for machine, (usd, _) in vms.items()} == {
        h.machine: h.usd_per_hour for h in shipped["V100"].host_vm.values()}
    # The pod's $384/h (the case study's "nearly 40% lower"), apart from a v2 device's shipped price.
    assert accelerators["TPU v2"] == (1.50, "assumed: full v2 Pod $384/h (docs/case_study.md) / 256 chips")
    assert shipped["TPU v2"].usd_per_chip_hour != 1.50


def _predictions(v100_step, v100x8_step, pod_step):
    """Planner predictions with the given steps (as if measured), for the case study's three systems."""
    def one(name, kind, chips, batch, step):
        system = planning.System(name, kind, chips, 1, batch, planning.CASE_STUDY_RECIPE,
                                 measured_step_sec=planning.Figure(step, "measured", "a test's"))
        return planning.predict(system, {})
    return [one("1x V100", "Tesla V100-SXM2-16GB", 1, 312, v100_step),
            one("8x V100", "Tesla V100-SXM2-16GB", 8, 2496, v100x8_step),
            one("Cloud TPU v2 Pod (v2-512)", "TPU v2", 256, 32_768, pod_step)]


def test_the_case_studys_claims_come_from_the_planner_beside_the_published_figures():
    # Steps chosen so that 90 epochs take: 1x V100 ceil(90 x 1,281,167 / 312) = 369,568 steps x 0.25 s =
    # 1,539.9 min; 8x V100 46,196 steps x 0.27 s = 207.9 min; the pod 3,519 steps x 0.14 s = 8.211 min.
    claims = {c["comparison"]: c for c in case_study.case_study_comparisons(
        _predictions(0.25, 0.27, 0.14), case_study.PRICES)}
    v100, v100x8, pod = 369_568 * 0.25 / 60, 46_196 * 0.27 / 60, 3519 * 0.14 / 60
    assert claims["1x V100, 90 epochs (minutes)"]["planner"] == pytest.approx(v100)
    assert claims["1x V100, 90 epochs (minutes)"]["published"] == pytest.approx(26 * 60)
    assert claims["1x V100, 90 epochs (minutes)"]["error"] == pytest.approx(v100 / (26 * 60) - 1)
    assert claims["8x V100, 90 epochs (minutes)"]["published"] == pytest.approx(27 * 7.9)
    assert claims["TPU v2 Pod, 90 epochs (minutes)"]["error"] == pytest.approx(pod / 7.9 - 1)
    assert claims["pod over 1x V100 (speedup)"]["planner"] == pytest.approx(v100 / pod)
    assert claims["pod over 1x V100 (speedup)"]["published"] == pytest.approx(26 * 60 / 7.9)
    assert claims["pod over 8x V100 (speedup)"]["published"] == pytest.approx(27)
    # Costs at the case study's assumed prices: the pod at 256 x $1.50, 8 V100s at 8 x $2.48 + $3.04 (VM).
    saving = 1 - (256 * 1.50 * pod) / ((8 * 2.48 + 3.04) * v100x8)
    assert claims["pod's cost below 8x V100's (fraction)"]["planner"] == pytest.approx(saving)
    published_saving = 1 - (384 * 7.9) / ((8 * 2.48 + 3.04) * 27 * 7.9)
    assert claims["pod's cost below 8x V100's (fraction)"]["published"] == pytest.approx(published_saving)
    assert claims["pod's cost below 8x V100's (fraction)"]["error"] == pytest.approx(
        saving - published_saving)


def test_the_curves_are_the_planner_commands_own_figures(shipped_plan):
    """benchmarks/case_study.py takes its curves from the planner: the systems and chips the command plans
    for those configs (one run of it, shared by the session), each rate inside its own interval."""
    assert shipped_plan["returncode"] == 0, shipped_plan["stderr"][-2000:]
    planned = {p["system"]: p for p in shipped_plan["plan"]["predictions"]}
    curves = case_study.planner_curves(case_study.planner_predictions())
    assert [c.accelerator for c in curves] == ["V100", "TPU v2"]
    for curve in curves:
        for system, (chips, rate, low, high) in zip(curve.systems, curve.points, strict=True):
            assert planned[system]["num_chips"] == chips
            assert low < rate < high
    # The TPU v2 configs shipped: v2-8, v2-32, v2-128, v2-256 and the pod (v2-512): 4 to 256 chips.
    assert dict((n, r) for n, r, *_ in curves[1].points).keys() == {4, 16, 64, 128, 256}


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


def test_markdown_says_what_is_derived_and_assumed(tmp_path):
    text = case_study.main(["--out_dir", str(tmp_path)])
    main_table = text.split("## The case study's comparisons, from the planner")[0]
    table = {line.split(" | ")[0][2:]: line for line in main_table.splitlines() if line.startswith("| ")}
    assert "| 1,232 (derived) | 26.0 h (published) |" in table["1x V100 (n1-standard-8)"]
    assert "| 9,010 (derived) | 3.6 h (derived) |" in table["8x V100 (n1-standard-64)"]
    assert "| 243,260 (derived) | 7.9 min (published) |" in table["Cloud TPU v2 Pod (v2-512)"]
    assert "speedup over 1x V100 (derived)" in text and "cost per run (prices below)" in text
    assert "time derived: 27 x 7.9 min = 213 min" in text
    assert "- TPU v2, the planner: uncalibrated: libtpu's estimate x" in text
    assert "no published TPU v2 point, TPU v3 (compiled)'s fit" in text
    # Each price says its basis: the pod's assumed, the others the planner's shipped table with its date.
    assert text.count("| assumed: ") == 1
    prices = case_study.PRICES
    assert text.count("| shipped (") == len(prices["accelerators"]) + len(prices["vms"]) - 1


def test_predicted_vs_published_disagreement_is_reported(tmp_path, monkeypatch):
    # Fixed planner predictions (steps as if measured), so that the expected figures do not move when the
    # calibration or the shipped reports are regenerated.
    monkeypatch.setattr(case_study, "planner_predictions", lambda: _predictions(0.25, 0.27, 0.14))
    text = case_study.main(["--out_dir", str(tmp_path)])
    # By hand: the planner's 1x V100 is 312 / 0.25 = 1,248 images/sec; its 8x V100 2,496 / 0.27 = 9,244.4
    # (7.41x, 92.6% of 8), against the table's 7.31x; the pod 32,768 / 0.14 = 234,057 (187.55x) against
    # 197.47x. The planner's pod takes 8.21 minutes for 90 epochs: +4% against 7.9.
    assert ("| 8x V100 (n1-standard-64) | published | 8 | 9,244 (9,244-9,244) | 7.41x | 7.31x | +1.3% | "
            "93% |") in text
    assert ("| Cloud TPU v2 Pod (v2-512) | published | 256 | 234,057 (234,057-234,057) | 187.55x | "
            "197.47x | -5.0% |") in text
    assert "| TPU v2 Pod, 90 epochs (minutes) | 8.2 min | 7.9 min (published: 7.9 min) | +4% |" in text
    assert (tmp_path / "planner.png").read_bytes()[:8] == PNG_MAGIC
