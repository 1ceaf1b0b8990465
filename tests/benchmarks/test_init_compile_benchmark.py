"""benchmarks/init_compile.py, run as a user runs it: its own process, JAX's default CPU device."""

import json
import os
import pathlib
import subprocess
import sys

from tests.helpers import users_compile
from tests.resnet_tiny_counts import resnet_tiny_sizes

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_it_times_both_compiles_of_the_initialiser_and_writes_json(tmp_path):
    out = tmp_path / "init_compile.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/init_compile.py", "--models=resnet_tiny", "--repeats=2",
         f"--json_out={out}"],
        cwd=REPO, env={**users_compile(dict(os.environ)), "XLA_FLAGS": ""}, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["models"]
    # The benchmark's resnet_tiny (16 filters, 10 classes): its parameters counted from the architecture.
    assert row["model"] == "resnet_tiny" and row["parameters"] == resnet_tiny_sizes(16, 10)[0]
    # Each repeat compiled afresh: a cached executable would come back in milliseconds.
    assert all(len(times) == 2 and min(times) > 0.05 for times in row["compile_sec_repeats"].values())
    assert row["max_relative_difference"] < 1e-6  # The same initial state, to rounding.
    assert "| resnet_tiny | " in proc.stdout
