"""benchmarks/cpu_lowering.py, run as a user runs it: its own process, JAX's default CPU device."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_it_times_both_forms_of_every_strided_convolution_and_writes_json(tmp_path):
    out = tmp_path / "cpu_lowering.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/cpu_lowering.py", "--batch_size=1", "--repeats=2", "--calls=1",
         f"--json_out={out}"],
        cwd=REPO, env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    layers = json.loads(out.read_text())["layers"]
    assert [layer["layer"].split()[0] for layer in layers] == [
        "stem_conv", "stage2_block1/conv2", "stage3_block1/conv2", "stage4_block1/conv2"]
    for layer in layers:
        assert layer["max_relative_difference"] < 1e-4  # The same weight gradient in both forms.
        assert all(len(times) == 2 and min(times) > 0 for times in layer["ms_repeats"].values())
        assert layer["xla_over_patch"] > 0
    assert layers[0]["weights_only"]
    assert layers[0]["weight_grad_gflop"] == 2 * 112 * 112 * 7 * 7 * 3 * 64 / 1e9
    assert "| stem_conv 7x7/2 (weights only) | 1x224x224x3 |" in proc.stdout
