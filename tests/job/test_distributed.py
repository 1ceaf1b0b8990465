"""Multi-process start-up (`resnet_scaling/job/distributed.py`) and the local launcher (`launch/local.py`).

The end-to-end test runs real processes on 127.0.0.1 (CPU devices, gloo collectives) through
tests/multihost_worker.py.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax._src.clusters import ClusterEnv

from resnet_scaling.job import distributed
from tests.helpers import held_port, launch_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "local.py"
WORKER = REPO / "tests" / "multihost_worker.py"


def _launcher():
    spec = importlib.util.spec_from_file_location("_local_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_env(**extra):
    """The test session's environment without its forced 8 devices, plus `extra`."""
    env = {**os.environ, "XLA_FLAGS": launch_xla_flags(), "PYTHONPATH": str(REPO)}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- detect


@pytest.mark.parametrize("env", [{}, {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"},
                                 {"TPU_WORKER_HOSTNAMES": "10.0.0.2"},
                                 {"RESNET_SCALING_NUM_PROCESSES": "1"},
                                 {"TPU_WORKER_HOSTNAMES": "a,b", "RESNET_SCALING_DISTRIBUTED": "off"}])
def test_single_process_jobs_do_not_initialize(env):
    assert distributed.detect(env=env) is None
    assert distributed.maybe_initialize(env=env) is None
    assert jax.process_count() == 1


def test_explicit_flags_win_over_the_environment():
    env = {"RESNET_SCALING_COORDINATOR": "10.0.0.9:1", "RESNET_SCALING_NUM_PROCESSES": "8",
           "RESNET_SCALING_PROCESS_ID": "5"}
    assert distributed.detect(env=env) == distributed.DistributedSettings(
        "10.0.0.9:1", 8, 5, "explicit coordinator settings")
    settings = distributed.detect("host:1234", 2, 1, env=env)
    assert (settings.coordinator_address, settings.num_processes, settings.process_id) == ("host:1234", 2, 1)


def test_jax_environment_variables_are_understood():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert distributed.detect(env=env).process_id == 3


@pytest.mark.parametrize("env, reason", [
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3"}, "Cloud TPU pod slice with 4 workers"),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1"}, "Cloud TPU multislice job"),
    ({"RESNET_SCALING_DISTRIBUTED": "auto"}, "RESNET_SCALING_DISTRIBUTED=auto"),
])
def test_clusters_are_left_to_jax_auto_detection(env, reason):
    assert distributed.detect(env=env) == distributed.DistributedSettings(None, None, None, reason)


@pytest.mark.parametrize("nodes", ["gpu017", "gpu017,login2", "gpu[017-018]", "gpu[017,020-030],x[1-2]",
                                   "a-b[1-2]"])
@pytest.mark.parametrize("port", [None, "7000"])
def test_an_srun_task_joins_the_coordinator_jax_would_pick(monkeypatch, nodes, port):
    """The address is made explicit (for the log and process 0's port check); the oracle is JAX's own
    SLURM detection on the same variables."""
    env = {"SLURM_JOB_ID": "123456", "SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
           "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_ID": "0"}
    env |= {"JAX_COORDINATOR_PORT": port} if port else {}
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "JAX_LOCAL_DEVICE_IDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expected = ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 60)[:3]
    settings = distributed.detect(env=env)
    assert (settings.coordinator_address, settings.num_processes, settings.process_id) == expected
    assert settings.reason == "SLURM job 123456 with 16 tasks"


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},  # the batch script, salloc's shell
    {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"},
])
def test_a_process_of_a_multi_task_allocation_not_started_by_srun_is_refused_in_one_line(env):
    with pytest.raises(ValueError) as info:
        distributed.detect(env=env)
    tasks = env["SLURM_NTASKS"]
    assert str(info.value).startswith(f"this process runs in SLURM job 77, an allocation of {tasks} tasks, "
                                      "but srun did not start it")
    assert "RESNET_SCALING_DISTRIBUTED=off" in str(info.value)
    assert distributed.detect(env={**env, "RESNET_SCALING_DISTRIBUTED": "off"}) is None


@pytest.mark.parametrize("args, message", [
    (("h:1", 2, None), "missing the process id"),
    ((None, 2, 0), "missing the coordinator address"),
    (("h:1", 2, 2), "Process id 2 is not in [0, 2)"),
])
def test_incomplete_or_inconsistent_settings_are_refused(args, message):
    with pytest.raises(ValueError) as info:
        distributed.detect(*args, env={})
    assert message in str(info.value)


# --------------------------------------------------------------------------- reaching the coordinator


def test_wait_for_coordinator_returns_once_something_listens():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        distributed.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", timeout_sec=5)


# The unreachable addresses below are ports held (bound, not listening) for the whole test: refused, and
# no other program (another test's coordinator) can start listening there meanwhile.


def test_wait_for_coordinator_gives_up_after_the_timeout():
    with held_port(share_with_coordinator=False) as port:
        address = f"127.0.0.1:{port}"
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=f"Could not reach the coordinator at {address} within 1 s"):
            distributed.wait_for_coordinator(address, timeout_sec=1, poll_sec=0.2)
    # It gave up (the error), and not before its timeout: a bound that no load can break.
    assert time.monotonic() - start >= 1


def test_train_fails_fast_and_clearly_when_the_coordinator_is_unreachable(tmp_path):
    with held_port(share_with_coordinator=False) as port:
        address = f"127.0.0.1:{port}"
        # Its own 3 s, not the 300 s default: the error names the timeout it waited out, and a run that
        # waited out the default would outlast this limit.
        result = subprocess.run(
            [sys.executable, "-m", "resnet_scaling.train", "--config=configs/demo.py",
             f"--workdir={tmp_path}", f"--coordinator_address={address}", "--num_processes=2",
             "--process_id=1", "--initialization_timeout_sec=3"],
            cwd=REPO, env=_clean_env(), capture_output=True, text=True,
            timeout=distributed.DEFAULT_INITIALIZATION_TIMEOUT_SEC / 2)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"Could not reach the coordinator at {address} within 3 s" in result.stderr
    assert "Traceback" not in result.stderr


_EXIT_SCRIPT = """
import os, pathlib, sys, time
from resnet_scaling.job import distributed
address, index, leave = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "leave"
job = distributed.maybe_initialize(address, 2, index, initialization_timeout_sec=60, peer_timeout_sec=30)
done = pathlib.Path("process_0_is_done")
if index == 0:
    done.write_text(str(os.getpid()))  # Then it leaves, or exits at once.


def process_0_is_gone():
    try:
        os.kill(int(done.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


if index == 1:
    # Still winding down (the input pipeline's threads) when process 0 is done: with `leave`, until process
    # 0 waits to leave; without it, until process 0 has exited, and then on, as a process whose coordinator
    # is gone: JAX aborts it meanwhile (a minute without the abort ends it normally, and the test fails).
    deadline = time.monotonic() + 60
    while (not done.exists() or not (leave or process_0_is_gone())) and time.monotonic() < deadline:
        time.sleep(0.05)
    while not leave and time.monotonic() < deadline:
        time.sleep(0.05)
if leave:
    distributed.leave(job)
print(f"process {index} exits", flush=True)
os._exit(0)  # As train.py ends a preempted run: no atexit hook, no wait for the input threads.
"""


@pytest.mark.parametrize("leave", [False, True])
def test_a_process_that_exits_at_once_leaves_through_the_barrier_or_aborts_the_others(tmp_path, leave):
    """Without `leave`, process 0 takes JAX's coordination service with it and JAX aborts process 1 (the
    failure preempted SLURM jobs showed); with it, both exit 0."""
    with held_port(share_with_coordinator=True) as port:
        procs = [subprocess.Popen([sys.executable, "-c", _EXIT_SCRIPT, f"127.0.0.1:{port}", str(i),
                                   "leave" if leave else "exit"], cwd=tmp_path, env=_clean_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert procs[0].returncode == 0, outputs[0][-2000:]
    if leave:
        assert procs[1].returncode == 0 and "process 1 exits" in outputs[1], outputs[1][-2000:]
    else:
        aborted = procs[1].returncode == -signal.SIGABRT and "Terminating process" in outputs[1]
        assert aborted, outputs[1][-2000:]


# --------------------------------------------------------------------------- the local launcher


def test_launcher_gives_each_process_its_id_and_stops_the_job_when_one_fails(tmp_path):
    # Process 1 fails only once all three have printed (files as a barrier): under load, process 2 could
    # otherwise still be starting when the launcher stops it, and never print.
    script = ("import os, pathlib, sys, time\n"
              "pid = int(os.environ['RESNET_SCALING_PROCESS_ID'])\n"
              "print('id', pid, 'of', os.environ['RESNET_SCALING_NUM_PROCESSES'],"
              " os.environ['RESNET_SCALING_COORDINATOR'], flush=True)\n"
              f"barrier = pathlib.Path({str(tmp_path)!r})\n"
              "(barrier / f'printed_{pid}').touch()\n"
              "deadline = time.monotonic() + 120\n"
              "while len(list(barrier.glob('printed_*'))) < 3 and time.monotonic() < deadline:\n"
              "    time.sleep(0.05)\n"
              "sys.exit(3) if pid == 1 else time.sleep(3600)\n")
    # Processes 0 and 2 were stopped, not waited for: the launcher returns long before their hour of sleep
    # (the timeout's margin is for a loaded machine, not a bound on the launcher's speed).
    result = subprocess.run([sys.executable, str(LAUNCHER), "--num_processes=3", "--", sys.executable, "-c",
                             script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 3
    for i in range(3):
        assert f"[{i}] id {i} of 3 127.0.0.1:" in result.stdout


def test_launcher_cpu_environment_replaces_forced_device_counts():
    env = _launcher().process_env(1, 2, "127.0.0.1:9", 2, base={
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x"})
    assert env["RESNET_SCALING_PROCESS_ID"] == "1" and env["JAX_NUM_CPU_DEVICES"] == "2"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"


# --------------------------------------------------------------------------- 2 processes = 1 process


def test_two_processes_train_to_the_same_parameters_as_one_process_on_4_devices(tmp_path):
    """2 processes x 2 CPU devices (gloo) and 1 process x 4 devices, same global batches, 3 steps.

    Compiled with XLA's default optimisations, as real runs compile (the workers' --xla_optimizations); the
    tests' fast compiles of the multi-process path are run by tests/scenarios/test_multiprocess.py.
    """
    multi, single = tmp_path / "multi", tmp_path / "single"
    # Output goes to files, not pipes: waiting on one run while the other fills an undrained pipe would
    # block it (and, for coupled processes, its peers).
    logs = [tmp_path / "multi.log", tmp_path / "single.log"]
    worker = [sys.executable, str(WORKER), "--xla_optimizations=default"]
    commands = [
        [sys.executable, str(LAUNCHER), "--num_processes=2", "--cpu_devices_per_process=2",
         "--timeout_sec=240", "--", *worker, f"--out={multi}"],
        [*worker, f"--out={single}", "--num_cpu_devices=4", "--same_batches_as_processes=2"],
    ]
    runs = []
    for command, log in zip(commands, logs, strict=True):
        with open(log, "w") as sink:
            runs.append(subprocess.Popen(command, cwd=REPO, env=_clean_env(), stdout=sink,
                                         stderr=subprocess.STDOUT, text=True))
    outputs = []
    for run, log in zip(runs, logs, strict=True):
        try:
            run.wait(timeout=300)
        except subprocess.TimeoutExpired:
            for r in runs:
                r.kill()
            pytest.fail("a training process hung")
        outputs.append(log.read_text())
        assert run.returncode == 0, outputs[-1][-3000:]
    assert "[0] DONE process 0 of 2, 4 devices, step 3" in outputs[0]
    assert "[1] DONE process 1 of 2, 4 devices, step 3" in outputs[0]
    assert "DONE process 0 of 1, 4 devices, step 3" in outputs[1]
    reference = np.load(single / "variables_0.npz")
    assert any("batch_stats" in k for k in reference) and len(reference) > 20
    # Not bit for bit: gloo sums across processes in another order than one process does. Measured largest
    # differences, fast compiles / default optimisations: parameters 7.5e-9 / 7.5e-9, BN statistics
    # 4.8e-7 / 1.2e-7.
    for process in (0, 1):
        variables = np.load(multi / f"variables_{process}.npz")
        assert set(variables) == set(reference)
        for name in reference:
            np.testing.assert_allclose(variables[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
