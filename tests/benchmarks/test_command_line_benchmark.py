"""benchmarks/command_line.py: each command timed in a fresh process, and whether it imported JAX."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_it_times_each_command_and_says_which_imported_jax(tmp_path):
    out = tmp_path / "command_line.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "command_line.py"), "--repeats=1",
                           f"--json_out={out}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    commands = [key for key in runs if not key.endswith(": import jax")]
    assert len(commands) == 9 and all(key.startswith("this checkout: ") for key in runs), sorted(runs)
    # The reference imports JAX; no command does before answering (each child's own sys.modules).
    assert runs["this checkout: import jax"][0]["jax_imported"] is True
    assert not any(runs[key][0]["jax_imported"] for key in commands), runs
    assert all(runs[key][0]["seconds"] > 0 for key in runs)
    assert "| train --help | " in proc.stdout and "| no |" in proc.stdout and "| yes |" in proc.stdout
