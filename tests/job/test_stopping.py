"""Stop at any moment: a Ctrl-C or a SIGTERM in each phase of the demo's command ends it within seconds,
in one line, without a traceback, leaving a workdir the same command resumes (job/stopping.py).

Each launch runs `python -m resnet_scaling.train --config=demo` on a small shapes dataset, with
`--verbosity=1` so that the log names each phase as it starts ("Phase: compiling the train step."). The
test waits for that line, freezes the process (SIGSTOP), sends the signal, lets it go on (SIGCONT) and times
the exit by polling the process, not by its log's clock.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import launch_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
# The bound: out within 10 s of the signal; a compile may not be interruptible sooner than 20 s
# (the stop is acted on by a thread of its own, so it is not waited for here either).
STOP_BOUND_SEC = 10.0
# After the time of day, or (--verbosity=1) absl's prefix.
STOP_LINE = re.compile(r"^(?:\d\d:\d\d:\d\d |I\d{4} .+?\] )Stopped \((SIGINT|SIGTERM)\) while (.+?): (.+)$",
                       re.M)
# 1,280 training images in batches of 128: 10 steps an epoch, 2 epochs, an evaluation after each. The tiny
# model: the phases are the point, not what the run learns, and each launch compiles in a moment.
SMALL_DEMO = ("--config.model.name=resnet_tiny", "--config.model.num_filters=8",
              "--config.data.num_train_examples=1280", "--config.data.num_eval_examples=400",
              "--config.eval.global_batch_size=200", "--config.training.num_epochs=2",
              "--config.eval.every_epochs=1", "--config.training.log_every_steps=5",
              "--config.training.tensorboard=false")


def _env() -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": launch_xla_flags(), "PYTHONUNBUFFERED": "1"}


def _train_command(workdir: pathlib.Path, cache_dir: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
            f"--config.data.cache_dir={cache_dir}", "--verbosity=1", *SMALL_DEMO]


class Launch:
    """A command run with its output in a file (the run never waits for the test to read a pipe)."""

    def __init__(self, command: list[str], log_path: pathlib.Path) -> None:
        self.log_path = log_path
        with open(log_path, "w") as out:
            self.proc = subprocess.Popen(command, env=_env(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, ready, what: str, timeout_sec: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_sec
        while not ready():
            assert self.proc.poll() is None, f"ended before {what}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} in {timeout_sec:.0f}s:\n{self.text()[-3000:]}"
            time.sleep(0.02)

    def signal_when(self, ready, what: str, sig: int) -> float:
        """Waits for `ready()`, freezes the process there, sends `sig`, lets it go on; returns how long it
        took to end after that (polled)."""
        self.wait_for(ready, what)
        self.proc.send_signal(signal.SIGSTOP)
        os.waitpid(self.proc.pid, os.WUNTRACED)  # Every thread has stopped.
        self.proc.send_signal(sig)
        self.proc.send_signal(signal.SIGCONT)
        sent = time.monotonic()
        try:
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return time.monotonic() - sent

    def finish(self) -> str:
        self.proc.wait(timeout=600)
        return self.text()


def _phase_started(launch: Launch, phase: str):
    return lambda: f"Phase: {phase}." in launch.text()


def _assert_one_stop_line(text: str, sig: int, doing: str) -> str:
    """The stop's one line (returned: what it says is safe), and no traceback."""
    lines = STOP_LINE.findall(text)
    assert len(lines) == 1, text[-3000:]
    assert lines[0][:2] == (signal.Signals(sig).name, doing), lines
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    return lines[0][2]


@pytest.fixture(scope="module")
def dataset_cache(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("dataset_cache")


@pytest.mark.slow
def test_a_stop_before_training_ends_at_once_in_one_line(tmp_path, dataset_cache):
    """Starting JAX (SIGTERM), writing the generated dataset (SIGINT), compiling (SIGTERM), setting up the
    input (SIGINT): each ends within the bound with its one line and status 0, leaves no lock and no
    half-written dataset, and the next launch starts as if nothing had happened."""
    workdir = tmp_path / "run"
    # JAX's imports (seconds), once the command line is read (a fraction of a second): the first phase.
    starting = Launch(_train_command(workdir, dataset_cache), tmp_path / "imports.log")
    phase = "starting JAX (and joining the job)"
    elapsed = starting.signal_when(_phase_started(starting, phase), "JAX's imports", signal.SIGTERM)
    text = starting.text()
    assert starting.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    assert "nothing was written" in _assert_one_stop_line(text, signal.SIGTERM, phase)
    assert "Devices:" not in text and not (workdir / "run.lock").exists(), text[-3000:]  # Stopped there.

    # The generated dataset, while its files are being written (their staging folder exists).
    writing = Launch(_train_command(workdir, dataset_cache), tmp_path / "dataset.log")
    elapsed = writing.signal_when(lambda: glob.glob(str(dataset_cache / ".incomplete-*")),
                                  "the dataset's staging folder", signal.SIGINT)
    text = writing.text()
    assert writing.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    safe = _assert_one_stop_line(text, signal.SIGINT, "writing the generated dataset")
    assert "nothing to save before the first step" in safe
    assert not glob.glob(str(dataset_cache / "shapes-*")), "a half-written dataset was left as complete"
    assert not (workdir / "run.lock").exists(), "the workdir's lock was not released"

    # Compiling the train step.
    compiling = Launch(_train_command(workdir, dataset_cache), tmp_path / "compile.log")
    elapsed = compiling.signal_when(_phase_started(compiling, "compiling the train step"), "the compile",
                                    signal.SIGTERM)
    text = compiling.text()
    assert compiling.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    _assert_one_stop_line(text, signal.SIGTERM, "compiling the train step")
    assert not (workdir / "run.lock").exists() and not (workdir / "checkpoints" / "1").exists()
    # This launch wrote the dataset whole, removing what the stopped one had begun.
    left = os.listdir(dataset_cache)
    assert len(left) == 1 and left[0].startswith("shapes-"), left

    # Setting up the input: TensorFlow's import points fd 2 elsewhere for a while (job/tf_import.py); the
    # line still reaches the console.
    setting_up = Launch(_train_command(workdir, dataset_cache), tmp_path / "setup.log")
    phase = "setting up the devices, the input and the model"
    elapsed = setting_up.signal_when(_phase_started(setting_up, phase), "the set-up", signal.SIGINT)
    assert setting_up.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, setting_up.text()[-3000:])
    _assert_one_stop_line(setting_up.text(), signal.SIGINT, phase)


@pytest.mark.slow
def test_a_stop_in_each_later_phase_keeps_the_work_and_resumes(tmp_path, dataset_cache):
    """An evaluation is abandoned, the step saved, and the resumed run makes that evaluation first; a
    restore ends at once naming the intact checkpoint; a save and the export are finished, not lost; the
    evaluate command ends in one line, writing nothing."""
    workdir = tmp_path / "run"

    def command():
        return _train_command(workdir, dataset_cache)

    # 1. The evaluation after step 10 (the first epoch's): abandoned, step 10 saved.
    evaluating = Launch(command(), tmp_path / "evaluate.log")
    elapsed = evaluating.signal_when(_phase_started(evaluating, "evaluating after step 10"), "the evaluation",
                                     signal.SIGINT)
    text = evaluating.text()
    assert evaluating.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    assert "Evaluation after step 10 abandoned" in text and "eval at step 10:" not in text, text[-3000:]
    assert re.search(r"Preempted \(SIGINT\) at step 10: checkpoint saved", text), text[-3000:]
    assert "Traceback" not in text

    # 2. Restoring that checkpoint: ends at once, naming it.
    restoring = Launch(command(), tmp_path / "restore.log")
    elapsed = restoring.signal_when(_phase_started(restoring, "restoring the newest checkpoint"),
                                    "the restore", signal.SIGTERM)
    text = restoring.text()
    assert restoring.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    safe = _assert_one_stop_line(text, signal.SIGTERM, "restoring the newest checkpoint")
    assert safe.startswith("its checkpoint of step 10 is intact"), safe
    assert not (workdir / "run.lock").exists()

    # 3. Resumed: the abandoned evaluation first; a SIGTERM during the last step's save lets it (and the
    # export) finish: the run ends done.
    resumed = Launch(command(), tmp_path / "resume.log")
    elapsed = resumed.signal_when(_phase_started(resumed, "saving the checkpoint of step 20"), "the save",
                                  signal.SIGTERM)
    text = resumed.text()
    assert resumed.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    assert "SIGTERM while saving the checkpoint of step 20: finishing the save, then stopping" in text
    resumed_at = text.index("Resumed from")
    assert text.index("eval at step 10:") > resumed_at, text[-3000:]
    assert "Done: step 20 of 20" in text and (workdir / "export").is_dir(), text[-3000:]
    assert (workdir / "checkpoints" / "20" / "commit_success.txt").exists(), "the save in progress was lost"

    # 4. The evaluate command: one line, nothing written.
    evaluate = Launch([sys.executable, "-m", "resnet_scaling.evaluate", f"--workdir={workdir}",
                       "--verbosity=1"], tmp_path / "evaluate_command.log")
    elapsed = evaluate.signal_when(_phase_started(evaluate, "evaluating the export weights"),
                                   "the evaluation", signal.SIGINT)
    text = evaluate.text()
    assert evaluate.proc.returncode == 0 and elapsed < STOP_BOUND_SEC, (elapsed, text[-3000:])
    safe = _assert_one_stop_line(text, signal.SIGINT, "evaluating the export weights")
    assert "nothing was written" in safe
    assert not list(workdir.glob("eval_export_*.json"))


_SECOND_CTRL_C = """
import sys, time
from resnet_scaling.job import stopping
stop = stopping.StopSignals.install()
with stop.phase("saving a checkpoint", then="finishing the save, then stopping"):
    print("ready", flush=True)
    time.sleep(60)
print("not stopped", flush=True)
"""


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """In a phase that keeps work, the first Ctrl-C lets it finish; a second one (a second later) ends the
    process at once with status 130 and its line."""
    script = tmp_path / "second_ctrl_c.py"
    script.write_text(_SECOND_CTRL_C)
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)  # Not the same key press delivered twice (stopping.SECOND_CTRL_C_AFTER_SEC).
        assert proc.poll() is None, "the first Ctrl-C ended a phase that keeps work"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=STOP_BOUND_SEC)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "not stopped" not in out, (proc.returncode, err)
    assert "SIGINT while saving a checkpoint: finishing the save, then stopping" in err, err
    assert "Stopped at once (a second Ctrl-C) while saving a checkpoint" in err, err
    assert "Traceback" not in err, err
