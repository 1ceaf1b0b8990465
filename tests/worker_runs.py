"""Runs of tests/train_worker.py as real processes, and what a test reads of them while they run: the steps
logged, the checkpoints committed, a signal sent at a known step (shared by the checkpointing and the fault
tests)."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from tests.helpers import launch_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "train_worker.py"


def worker_command(workdir, overrides, **flags):
    command = [sys.executable, str(WORKER), f"--workdir={workdir}", f"--overrides={json.dumps(overrides)}"]
    return command + [f"--{k}={v}" if v != "" else f"--{k}" for k, v in flags.items()]


def worker_env():
    return {**os.environ, "XLA_FLAGS": launch_xla_flags(), "PYTHONUNBUFFERED": "1"}


def committed_steps(checkpoints: pathlib.Path) -> list[int]:
    """Steps whose checkpoint is complete on disk.

    orbax (0.12) writes a save into `<step>.orbax-checkpoint-tmp*`, writes `commit_success.txt` into it when
    every item is written, then renames it to `<step>`: a digit-named directory is a committed one.
    """
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").is_file())


def logged_steps(log: str) -> list[int]:
    """The steps a run logged, in order: the worker's lines ("step 5/60 (epoch ...") and the command
    line's (the time of day, then "step 5/60 (epoch ..."); a line still being written counts once its
    step number is complete."""
    return [int(step) for step in re.findall(r"^(?:\d\d:\d\d:\d\d )?step (\d+)/\d+ \(epoch", log, flags=re.M)]


def compile_sec(log: str) -> float:
    return float(re.search(r"Compiled the train step in ([0-9.]+)s", log).group(1))


def stop_process(proc: subprocess.Popen) -> bool:
    """SIGSTOPs `proc`; returns True once all its threads have stopped (waitpid reports the stop only
    then), False if it had ended."""
    proc.send_signal(signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)  # Reaped here: Popen cannot see it any more.
    return False


def run_and_signal(command, env, log_path, checkpoints, at_step, sig, newer_checkpoint_than=None):
    """Runs `command` and sends it `sig` at the first step it logs from `at_step` on (and, if asked, once a
    checkpoint newer than step `newer_checkpoint_than` is committed in `checkpoints`: saves are
    asynchronous, so a logged save step proves nothing).

    The test reads the run's log late when the machine is loaded, and the run goes on meanwhile. So the
    run is first stopped (SIGSTOP), what it had done is read while it stands still (the newest step it
    logged, the committed checkpoints), then `sig` is sent and the run continued (SIGCONT): bounds on what
    the run does after the signal count from that step, not from the line that triggered the signal.

    Returns:
      (returncode, log, the newest step logged when the signal was sent, or None if the run ended before
      it could be signalled, the steps committed then).
    """
    with open(log_path, "w") as out:  # A file, not a pipe: the run never waits for the test to read.
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    reached, committed = None, []
    deadline = time.monotonic() + 300  # Generous (a launch takes ~10-40 s): a run that hangs fails here.
    try:
        while proc.poll() is None:
            logged = logged_steps(log_path.read_text(errors="replace"))
            if logged and logged[-1] >= at_step and (
                    newer_checkpoint_than is None
                    or max(committed_steps(checkpoints), default=-1) > newer_checkpoint_than):
                if stop_process(proc):
                    reached = logged_steps(log_path.read_text(errors="replace"))[-1]
                    committed = committed_steps(checkpoints)
                    proc.send_signal(sig)
                    if sig != signal.SIGKILL:  # A stopped process dies of SIGKILL as it is.
                        proc.send_signal(signal.SIGCONT)
                break
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, log_path.read_text(errors="replace"), reached, committed

