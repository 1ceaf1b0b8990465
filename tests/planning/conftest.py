"""Fixtures of the planning tests: the no-argument planner, run once per test session."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from filelock import FileLock

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shipped_plan(tmp_path_factory) -> dict:
    """`python -m resnet_scaling.planner --json_out=...` with no input (every shipped system), run once per
    test session and shared by the xdist workers through a file lock, as a user runs it (no test XLA flags,
    another working directory): {"returncode", "stdout", "stderr", "wall_sec", "plan": the JSON written}."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker has its own folder in the session's: meet in the session's.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = root / "shipped_plan", root / "shipped_plan" / "result.json"
    with FileLock(str(root / "shipped_plan.lock")):
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "resnet_scaling.planner",
                                     f"--json_out={folder / 'plan.json'}"], cwd=folder,
                                    env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                                    timeout=300)
            wall_sec = time.perf_counter() - start
            plan = json.loads((folder / "plan.json").read_text()) if result.returncode == 0 else None
            done.write_text(json.dumps({"returncode": result.returncode, "stdout": result.stdout,
                                        "stderr": result.stderr, "wall_sec": wall_sec, "plan": plan}))
    return json.loads(done.read_text())
