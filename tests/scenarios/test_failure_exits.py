"""A save that fails in the background, through the command line: the run ends within a bound (orbax leaves
threads waiting on the failed save), names the save that failed and the last complete checkpoint in one
`error:` line, and keeps orbax's tracebacks off the console (whole in WORKDIR/logs/)."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from resnet_scaling.job import console
from tests.helpers import launch_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]


def _immutable(path: pathlib.Path, on: bool) -> bool:
    """`chattr +i` (root ignores permissions, not this); False where the file system has no such flag."""
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


def _committed(checkpoints: pathlib.Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").is_file())


def test_an_unwritable_checkpoint_folder_ends_the_run_within_the_bound_naming_the_failed_save(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _immutable(probe, True):
        pytest.skip("no chattr +i on this file system")
    _immutable(probe, False)

    overrides = {"schedule__name": "constant", "schedule__warmup_steps": 0, "data__source": "synthetic",
                 "data__num_eval_examples": 16, "training__num_train_steps": 100_000,
                 "training__log_every_steps": 1, "checkpoint__enabled": True, "checkpoint__every_steps": 5,
                 "checkpoint__async_save": True}
    config_file = tmp_path / "tiny_config.py"
    config_file.write_text("from tests.helpers import tiny_config\n\n\n"
                           f"def get_config():\n    return tiny_config(**{overrides!r})\n")
    env = {**os.environ, "XLA_FLAGS": launch_xla_flags(), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    workdir = tmp_path / "run"
    checkpoints = workdir / "checkpoints"
    log = tmp_path / "console.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "resnet_scaling.train", f"--config={config_file}",
                                 f"--workdir={workdir}"], env=env, cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT)
    frozen = False
    try:
        deadline = time.monotonic() + 300
        while not _committed(checkpoints):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        # Stopped while the folder turns unwritable, so that what was complete then is known.
        proc.send_signal(signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)
        complete_before = _committed(checkpoints)
        frozen = _immutable(checkpoints, True)
        assert frozen
        proc.send_signal(signal.SIGCONT)
        fault = time.monotonic()
        # The next save (at most 5 steps on) fails; the run then ends within the grace given other threads.
        returncode = proc.wait(timeout=console.EXIT_GRACE_SEC + 90)
        seconds_to_exit = time.monotonic() - fault
    finally:
        if frozen:
            _immutable(checkpoints, False)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert returncode == 1, text[-3000:]
    assert seconds_to_exit < console.EXIT_GRACE_SEC + 90
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    failed = int(re.search(r"Saving the checkpoint of step (\d+) failed: Operation not permitted",
                           errors[0]).group(1))
    last = int(re.search(r"The last complete checkpoint is step (\d+)", errors[0]).group(1))
    # The save after the last complete one (in flight or started after the folder froze: its commit, a
    # rename in checkpoints/, fails either way), not a later one that found it failed.
    assert failed == complete_before[-1] + 5, (failed, complete_before)
    assert last == _committed(checkpoints)[-1] and last in complete_before
    # orbax's tracebacks went to the log file, not the console.
    assert "Traceback" not in text, text[-3000:]
    logs = list((workdir / "logs").glob("*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text() and "PermissionError" in logs[0].read_text()
