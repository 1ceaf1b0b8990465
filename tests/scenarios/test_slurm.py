"""The README's SLURM commands on a real one-node SLURM cluster (tests/slurm_cluster.py): `sbatch
launch/slurm_gpu.sbatch` with 2 CPU tasks of the demo, `scancel --signal=TERM`, the same command resumed,
`kill -9` of a task, and start-up mistakes. Skipped where SLURM is not installed; CI installs it.
"""

import contextlib
import errno
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from resnet_scaling import checkpointing
from resnet_scaling.job import distributed
from tests.helpers import launch_xla_flags
from tests.slurm_cluster import KILL_WAIT_SEC, slurm_cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "slurm_gpu.sbatch"
# The demo, smaller: the tiny model (what runs is the point, not what it learns), 512 images, batch 128
# (4 steps an epoch), 32 steps; the suite's compilation cache
# (conftest) instead of the workdir's, so that launches share what they compile.
NUM_STEPS = 32
DEMO_ARGS = ["--config.data.num_train_examples=512", "--config.data.num_eval_examples=200",
             "--config.eval.global_batch_size=200", "--config.training.num_epochs=8",
             "--config.eval.every_epochs=4", "--config.checkpoint.every_steps=8",
             "--config.training.log_every_steps=2", "--config.training.compilation_cache_dir=",
             "--config.model.name=resnet_tiny", "--config.model.num_filters=8"]
TASK_ENV = {"JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
            "XLA_FLAGS": launch_xla_flags(num_devices=1), "PYTHON": sys.executable}
HANG_SEC = 300  # Only a hang reaches this: a launch takes 20-60 s on 2 loaded cores.


@pytest.fixture(scope="module")
def slurm():
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    """Where the module's jobs find the demo's generated images (written by the first)."""
    return tmp_path_factory.mktemp("slurm-data")


def _sbatch(slurm, data: pathlib.Path, workdir: pathlib.Path, output: pathlib.Path, *extra: str) -> str:
    """Submits launch/slurm_gpu.sbatch as the README does, 2 CPU tasks instead of 8 GPUs."""
    env = {**slurm.env, **TASK_ENV, "CONFIG": "demo", "WORKDIR": str(workdir),
           "EXTRA_ARGS": " ".join([f"--config.data.cache_dir={data}", *DEMO_ARGS])}
    result = subprocess.run(["sbatch", "--parsable", "--ntasks-per-node=2", "--gpus-per-node=0",
                             "--no-requeue", "-o", str(output), *extra, str(SCRIPT)],
                            env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return result.stdout.strip().split(";")[0]


def _wait(predicate, what: str, slurm, job: str, output: pathlib.Path, timeout_sec: float = HANG_SEC):
    deadline = time.monotonic() + timeout_sec
    while not predicate():
        if time.monotonic() > deadline:
            text = output.read_text() if output.exists() else ""
            pytest.fail(f"job {job}: no {what} within {timeout_sec} s; state {slurm.job_state(job)}:\n"
                        f"{text[-4000:]}")
        time.sleep(0.2)


def _text(path: pathlib.Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.slow
def test_a_preempted_sbatch_job_resumes_with_the_same_command_and_a_killed_task_ends_it_in_one_line(
        slurm, demo_data, tmp_path):
    """One workdir, two jobs of the same command (their launches are shared, as in
    tests/scenarios/test_multiprocess.py, which also runs a resumed job to its end): a SIGTERM, then a task
    killed."""
    workdir = tmp_path / "run"

    # Job 1: `scancel --signal=TERM` once it trains: a checkpoint at the step where both tasks stop.
    output = tmp_path / "preempted.out"
    job = _sbatch(slurm, demo_data, workdir, output)
    _wait(lambda: re.search(rf"\d\d:\d\d:\d\d step \d+/{NUM_STEPS}", _text(output)), "training step", slurm,
          job, output)
    subprocess.run(["scancel", "--signal=TERM", job], env=slurm.env, check=True)
    _wait(lambda: slurm.ended(job), "end after SIGTERM", slurm, job, output, timeout_sec=KILL_WAIT_SEC + 30)
    text = output.read_text()
    # Both tasks exit 0 (srun would say which did not, and the job would be FAILED), with no abort, at the
    # step the signal came in: the run stopped itself, it was not run to its end or killed.
    assert slurm.job_state(job) == ("COMPLETED", "0:0"), text[-4000:]
    assert not re.search(r"srun: error|Terminating process|Traceback|^error:", text, flags=re.M), text[-4000:]
    stopped = int(re.search(r"Preempted \(SIGTERM\) at step (\d+): checkpoint saved", text).group(1))
    assert stopped < NUM_STEPS and checkpointing.complete_steps(str(workdir))[-1] == stopped

    # Job 2: the same command resumes from that checkpoint; task 1 killed (SIGKILL) once it trains again
    # (tests/scenarios/test_multiprocess.py kills a process after a newer checkpoint, and resumes a job to its
    # end). srun --kill-on-bad-exit SIGTERMs the survivor: it must speak before KillWait's SIGKILL, once,
    # naming the dead task and the newest checkpoint complete on disk (the one the next launch resumes from).
    output = tmp_path / "killed.out"
    job = _sbatch(slurm, demo_data, workdir, output)
    resumed_and_trains = rf"Resumed from .* at step {stopped}\b.*\d\d:\d\d:\d\d step \d+/{NUM_STEPS}"
    _wait(lambda: re.search(resumed_and_trains, _text(output), flags=re.S), "training step after the resume",
          slurm, job, output)
    pid = slurm.task_pid(job, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: slurm.ended(job), "end after the kill", slurm, job, output,
          timeout_sec=KILL_WAIT_SEC + 30)
    text = output.read_text()
    assert re.search(rf"Resumed from .* at step {stopped}\b", text), text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-4000:]
    newest = checkpointing.complete_steps(str(workdir))[-1]
    assert re.match(r"error: process 1 of 2 stopped responding: no sign of life for 10 s \(while the job "
                    rf"was stopping\).* resume from the last complete checkpoint \(step {newest}\)\.$",
                    errors[0]), errors[0]
    # The survivor ended itself after its line: SLURM's SIGKILL after KillWait would say "task 0: Killed".
    assert "Terminating process" not in text and "task 0: Killed" not in text, text[-4000:]
    assert slurm.job_state(job)[0] == "FAILED"


def test_start_up_mistakes_end_in_one_line_within_seconds(slurm, tmp_path):
    command = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={tmp_path / 'w'}"]
    env = {**slurm.env, **TASK_ENV}
    # The trainer run in a 2-task allocation without srun: not a wait for a peer that never comes.
    result = subprocess.run(["salloc", "-n2", *command], env=env, capture_output=True, text=True,
                            timeout=HANG_SEC)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
    assert "srun did not start it" in errors[0] and "srun python -m resnet_scaling.train" in errors[0]

    # JAX's coordinator port for the job taken: process 0 says so, and the other task is not left waiting
    # out the initialisation timeout (300 s: the run is given half of it, a hang fails it).
    with coordinator_port_of_the_next_job_taken(env) as port:
        result = subprocess.run(["srun", "-n2", *command], env=env, capture_output=True, text=True,
                                timeout=distributed.DEFAULT_INITIALIZATION_TIMEOUT_SEC / 2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr[-3000:]
    assert "JAX_COORDINATOR_PORT" in errors[0] and f":{port}" in errors[0]


@contextlib.contextmanager
def coordinator_port_of_the_next_job_taken(env: dict[str, str]) -> Iterator[int]:
    """Listens on the coordinator port the next job will use (launch/slurm: 61440 + job id % 4096); yields
    it. A port someone else holds is skipped: a job that does nothing takes its id, and the next id's port
    is tried."""
    for _ in range(5):
        next_job = int(subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True, text=True)
                       .stdout.split("NEXT_JOB_ID")[1].split("=")[1].split()[0])
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("0.0.0.0", 61440 + next_job % 4096))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                subprocess.run(["srun", "-n1", "true"], env=env, check=True, capture_output=True)
                continue
            listener.listen()
            yield 61440 + next_job % 4096
            return
    raise RuntimeError("the coordinator ports of 5 job ids in a row are taken")
