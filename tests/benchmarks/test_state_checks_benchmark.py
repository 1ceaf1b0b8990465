"""benchmarks/state_checks.py: each check's first and later call, in a fresh process per checkout."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "state_checks.py"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_it_times_each_check_against_a_baseline_checkout_and_writes_json(tmp_path):
    out = tmp_path / "state_checks.json"
    proc = _run("--repeats=1", "--models=resnet_tiny", f"--baseline_checkout={REPO}", f"--json_out={out}",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_checkout = json.loads(out.read_text())["models"]["resnet_tiny"]
    assert set(by_checkout) == {"now", "baseline"}
    for figures in by_checkout.values():
        assert set(figures["checks"]) == {"health", "all_finite", "fingerprint"}
        # The first call compiles its program (no persistent cache); a later one only runs it.
        checks = figures["checks"].values()
        assert all(0 < check["later_call_sec"] < check["first_call_sec"] for check in checks)
    assert "| resnet_tiny | " in proc.stdout and "| health |" in proc.stdout

    mistyped = _run("--models=resnet51", cwd=tmp_path)
    assert mistyped.returncode == 2 and "no such model resnet51" in mistyped.stderr.strip().splitlines()[-1]


def test_with_a_gpu_card_it_compiles_each_check_for_that_card_without_a_gpu(tmp_path):
    from resnet_scaling.job import native_noise

    if not native_noise.cuda_plugin_installed():
        pytest.skip("ahead-of-time GPU compilation needs JAX's CUDA plugin: pip install -e '.[gpu_compile]'")
    out = tmp_path / "state_checks_gpu.json"
    proc = _run("--repeats=1", "--models=resnet_tiny", "--gpu=Tesla V100-SXM2-16GB", f"--json_out={out}",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["gpu"] == "Tesla V100-SXM2-16GB"
    checks = result["models"]["resnet_tiny"]["now"]["checks"]
    assert set(checks) == {"health", "all_finite", "fingerprint"}
    assert all(check["compile_sec"] > 0 for check in checks.values())
    assert "compile for a Tesla V100-SXM2-16GB, now (s)" in proc.stdout
