"""benchmarks/gpu_check.py's control flow on a CPU: stages in their own processes, an injected failure and
an injected out-of-memory recorded while the check goes on, TensorFlow's absence skipped with a reason, the
JSON written under $OUT by the shell wrapper."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.resnet_tiny_counts import resnet_tiny_sizes, resnet_tiny_train_flops_per_image

REPO = Path(__file__).resolve().parents[2]
STATUSES = {"ok", "error", "timeout", "skipped"}


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # The stages' processes compile fast.
    import gpu_check

    return gpu_check


def _check_stage_records(report, stages):
    assert list(report["stages"]) == list(stages)
    for name, record in report["stages"].items():
        assert record["status"] in STATUSES, (name, record)
        if record["status"] == "ok":
            assert record["result"], name
        elif record["status"] == "skipped":
            assert record["reason"], name
        else:
            assert record["error"], name


def test_smoke_run_records_every_stage_with_figures_or_a_reason(gpu_check, tmp_path):
    start = time.perf_counter()
    assert gpu_check.main(["--smoke", f"--out={tmp_path / 'out'}", f"--scratch_dir={tmp_path / 'scratch'}",
                           "--batch_size=4", "--ladder=8,16", "--simulate_oom_at_batch=8",
                           "--fail_stage=environment", "--pretend_no_tensorflow"]) == 0
    wall_sec = time.perf_counter() - start  # This test's clock, apart from the check's.
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["schema_version"] == gpu_check.SCHEMA_VERSION and report["finished"]
    assert {"command", "host", "xla_flags", "summary", "stages", "total_budget_sec"} <= set(report)
    assert report["xla_flags"]["backend_detected"] == "cpu" and "xla_flags" in report["xla_flags"]
    _check_stage_records(report, gpu_check.STAGES)
    stages = report["stages"]

    # A stage that raises is recorded, and the stages after it still run.
    assert stages["environment"]["status"] == "error"
    assert "injected failure" in stages["environment"]["error"]

    bf16 = stages["train_step_bf16"]["result"]
    assert bf16["config"]["dtype"] == "bfloat16" and bf16["config"]["batch_size"] == 4
    # Each timed window (one step of 4 images in the smoke run) lies within this test's wall time.
    assert bf16["images_per_sec_median"] >= 4 / wall_sec and 0 < bf16["compile_sec"] < wall_sec
    # The smoke model: resnet_tiny of the base config's width (64) and classes (1,000) on 32-pixel images,
    # 4 a step: at least its convolutions' and classifier's multiply-adds counted by hand, at most those
    # with the padding's taps (the CPU forms multiply its zeros), 15% more elementwise work and 10 FLOPs a
    # parameter for the update (the bounds of tests/metrics/test_metrics.py).
    fewest = resnet_tiny_train_flops_per_image(64, 1000, 32)
    most = 1.15 * resnet_tiny_train_flops_per_image(64, 1000, 32, count_padding=True)
    num_params = resnet_tiny_sizes(64, 1000)[0]
    assert 4 * fewest <= bf16["flops_per_step"] <= 4 * most + 10 * num_params, bf16["flops_per_step"]
    assert len(bf16["images_per_sec_repeats"]) == 2
    assert {"argument_bytes", "temp_bytes", "total_bytes", "peak_bytes_in_use"} <= set(bf16["memory"])
    assert set(bf16["utilisation"]) >= {"mfu", "peak_tflops_per_device", "tflops_per_sec_per_device"}
    assert bf16["utilisation"]["mfu"] is None  # No published peak for a CPU.
    assert bf16["jax_events"]["run_traces"] == 0 and bf16["jax_events"]["run_compiles"] == 0

    fp16 = stages["train_step_fp16_v100"]["result"]
    assert fp16["compute_dtype"] == "float16" and fp16["config_file"].endswith("gpu_v100.py")
    assert fp16["loss_scale_sane"] is True and 1 <= fp16["loss_scale"] <= fp16["initial_loss_scale"]
    assert fp16["images_per_sec_median"] >= 4 / wall_sec

    for name in ("demo", "input_pipeline"):
        assert stages[name]["status"] == "skipped" and "TensorFlow is not installed" in stages[name]["reason"]

    # The ladder stops at the first out-of-memory; the batch above it is not tried.
    ladder = stages["bf16_batch_ladder"]["result"]
    rungs = [(r["batch_size"], r["status"]) for r in ladder["rungs"]]
    assert rungs == [(8, "out_of_memory"), (16, "not_run")]
    assert "RESOURCE_EXHAUSTED" in ladder["rungs"][0]["error"]
    assert ladder["stopped_because"] == "batch 8 ran out of memory"

    summary = report["summary"]
    assert summary["largest_batch_that_fits"] == 4 and summary["largest_batch_is_a_lower_bound"] is False
    assert summary["bf16_images_per_sec"] == bf16["images_per_sec_median"] and summary["warnings"] == []
    assert summary["fp16_v100_loss_scale_sane"] is True and summary["demo_final_top1"] is None
    assert summary["stage_status"] == {name: stages[name]["status"] for name in gpu_check.STAGES}
    assert "injected failure" in (tmp_path / "out" / "gpu_check.log").read_text()


def test_wrapper_writes_under_OUT_and_the_setup_imports_no_tensorflow(tmp_path):
    script = REPO / "benchmarks" / "gpu_check.sh"
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "GPU_CHECK_WHEELS": str(tmp_path / "no_wheels")}
    subprocess.run(["bash", str(script), "--smoke", "--stages=environment", f"--out={tmp_path / 'not_used'}",
                    f"--scratch_dir={tmp_path / 'scratch'}"], env=env, check=True, timeout=300,
                   capture_output=True)
    assert not (tmp_path / "not_used").exists()  # $OUT wins over --out.
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    environment = report["stages"]["environment"]
    assert environment["status"] == "ok", environment
    assert environment["result"]["tensorflow_imported_by_training_setup"] is False
    assert environment["result"]["jax"] and environment["result"]["matmul_bf16_tflops"] > 0
    others = [r for name, r in report["stages"].items() if name != "environment"]
    assert others and all(r["reason"] == "not selected (--stages)" for r in others)


def test_a_stage_past_its_budget_is_stopped(gpu_check, tmp_path):
    # The child would sleep 10 minutes: returning at all, timed out, within the test's 5-minute guard
    # shows it was stopped, however loaded the machine (a 60 s sleep against a 30 s bound left 2x).
    start = time.monotonic()
    returncode, timed_out = gpu_check.run_command([sys.executable, "-c", "import time; time.sleep(600)"],
                                                  dict(os.environ), 1.0, tmp_path / "log")
    assert timed_out and returncode != 0 and time.monotonic() - start < 300


def test_the_v100_stage_sets_the_real_step_beside_the_shipped_report_compiled_without_a_gpu(gpu_check):
    """On a GPU, the float16 stage reads gpu_v100's shipped report (current for the config as shipped) and
    puts the real step's memory and time beside it: 1.5 x the report's memory measured, at a step of twice
    the report's FLOPs-at-peak floor."""
    from resnet_scaling import config as config_lib

    report = gpu_check._shipped_report("gpu_v100", config_lib.load_config("gpu_v100"))
    assert report is not None and report["platform"] == "gpu"
    assert report["device_kind"].startswith("Tesla V100")
    total, floor = report["memory_bytes"]["total"], report["flop_floor_sec"]
    figures = {"memory": {"total_bytes": total, "peak_bytes_in_use": int(1.5 * total)},
               "sec_per_step_median": 2 * floor}
    compared = gpu_check._against_aot(report, figures)
    assert compared["real_over_aot"] == 1.0 and compared["peak_over_aot"] == pytest.approx(1.5)
    assert compared["step_over_flop_floor"] == pytest.approx(2.0)
