"""A process that dies mid-run: the others stop within a stated time, naming it, and the next launch resumes.

The watchdog's decisions run against a fake key-value store and clock; one end-to-end run kills process 1
of a 2-process training job with SIGKILL.
"""

import re
import signal
import subprocess
import time

import pytest
from jax._src import distributed as jax_distributed

from resnet_scaling import distributed
from tests.helpers import held_port
from tests.test_checkpointing import REPO, _committed_steps, _run_two_processes, _worker_command, _worker_env


class _FakeStore:
    """The coordination service's key-value store, shared by the fake clients of several processes."""

    def __init__(self):
        self.entries = {}
        self.down = False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        assert allow_overwrite or key not in self.entries
        self.entries[key] = value

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        return [(k, v) for k, v in sorted(self.entries.items()) if k.startswith(prefix)]


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _watchdogs(num_processes, timeout_sec=10, store=None):
    store = store or _FakeStore()
    clock = _Clock()
    dogs = [distributed.PeerWatchdog(i, num_processes, timeout_sec, client=lambda: store, clock=clock)
            for i in range(num_processes)]
    return store, clock, dogs


def _rounds(clock, dogs, seconds, step_sec=1.0):
    """Every watchdog polls each `step_sec` for `seconds`; returns {process: message} for those that stop."""
    verdicts = {}
    for _ in range(int(seconds / step_sec)):
        clock.now += step_sec
        for dog in dogs:
            if dog.process_id not in verdicts and (message := dog.check()) is not None:
                verdicts[dog.process_id] = message
    return verdicts


def test_a_silent_process_is_named_after_the_timeout_and_not_before(monkeypatch):
    store, clock, dogs = _watchdogs(3)
    assert _rounds(clock, dogs, 30) == {}  # All beating: nobody is lost, however long it runs.
    monkeypatch.setattr(distributed, "_coordination_client", lambda: store)
    monkeypatch.setattr(jax_distributed.global_state, "process_id", 2)
    distributed.report_progress(10, checkpoint_step=10)
    distributed.report_progress(12)  # The checkpoint recorded stays.
    survivors = [dogs[0], dogs[2]]  # Process 1 dies: its counter stops.
    assert _rounds(clock, survivors, 9) == {}
    verdicts = _rounds(clock, survivors, 3)
    assert set(verdicts) == {0, 2}
    assert verdicts[0].startswith("process 1 of 3 stopped responding (lost at about step 12): no sign of "
                                  "life for 10 s")
    assert verdicts[0].endswith("run the same command to resume from the last complete checkpoint "
                                "(step 10).")
    assert "This process (process 2)" in verdicts[2]
    assert store.entries["resnet_scaling/peer_watch/lost"] == "1"


def test_every_process_names_the_process_the_first_one_found_lost():
    store, clock, dogs = _watchdogs(4)
    _rounds(clock, dogs, 3)
    store.entries["resnet_scaling/peer_watch/lost"] = "3"  # Another process's verdict, seen before ours.
    message = dogs[1].check()
    assert message.startswith("process 3 of 4 stopped responding: ")
    assert message.endswith("from the last complete checkpoint, if there is one.")


def test_a_normal_exit_stops_the_watch_and_an_unreachable_coordinator_is_named():
    store, clock, dogs = _watchdogs(2)
    ended = distributed.PeerWatchdog(1, 2, 10, client=lambda: None, clock=clock)
    assert ended.check() is None and ended.finished  # JAX's client shut down: the process is exiting.
    _rounds(clock, dogs, 3)
    store.down = True  # The coordinator stops answering (process 0 hung, or its host vanished).
    assert _rounds(clock, dogs[1:], 10) == {}
    message = _rounds(clock, dogs[1:], 2)[1]
    assert message.startswith("process 0 of 2, which hosts the coordinator, stopped answering for 10 s")
    assert not dogs[1].finished


def test_progress_is_not_recorded_by_a_process_that_runs_alone():
    assert jax_distributed.global_state.client is None
    distributed.report_progress(3, checkpoint_step=2)  # No coordination service: nothing to do, no error.


def test_the_peer_timeout_comes_from_the_argument_the_environment_or_the_default():
    env = {distributed.ENV_PEER_TIMEOUT: "15"}
    assert distributed.resolve_peer_timeout_sec(None, {}) == distributed.DEFAULT_PEER_TIMEOUT_SEC == 60
    assert distributed.resolve_peer_timeout_sec(None, env) == 15
    assert distributed.resolve_peer_timeout_sec(0, env) == 0
    with pytest.raises(ValueError, match="RESNET_SCALING_PEER_TIMEOUT_SEC must be a number"):
        distributed.resolve_peer_timeout_sec(None, {distributed.ENV_PEER_TIMEOUT: "1m"})
    with pytest.raises(ValueError, match=">= 0"):
        distributed.resolve_peer_timeout_sec(-1, {})
    # The stated bounds. JAX's own heartbeat abort can come half its timeout after a death (its processes
    # beat every half timeout), which must be after the watchdog's line.
    assert distributed.peer_exit_bound_sec(60) == 80 and distributed.peer_exit_bound_sec(10) == 14
    assert distributed.jax_heartbeat_timeout_sec(60) == 180
    assert distributed.jax_heartbeat_timeout_sec(10) == 48
    for timeout_sec in (1, 10, 60, 600):
        bound_sec = distributed.peer_exit_bound_sec(timeout_sec)
        assert distributed.jax_heartbeat_timeout_sec(timeout_sec) / 2 > bound_sec


def test_at_exit_the_bound_counts_from_the_dead_peers_last_sign_of_life(monkeypatch, capsys):
    store, clock, dogs = _watchdogs(2)
    _rounds(clock, dogs, 3)  # Both beat; process 1's last beat, at 1003 s, is seen by process 0 at 1004 s.
    _rounds(clock, dogs[:1], 8)  # Process 1 is dead; at 1011 s process 0's main thread starts to exit.
    slept, exits = [], []
    monkeypatch.setattr(distributed.time, "sleep", slept.append)
    monkeypatch.setattr(distributed.os, "_exit", exits.append)
    dogs[0]._end_if_exit_hangs()  # Held in JAX's shutdown barrier: it waits out the bound, then ends.
    assert slept == [pytest.approx(1004 + distributed.peer_exit_bound_sec(10) - 1011)] == [7]
    assert exits == [1]
    assert capsys.readouterr().err.startswith("error: process 1 of 2 stopped responding")


# ------------------------------------------------------------------ real processes

PEER_TIMEOUT_SEC = 10
OVERRIDES = {"checkpoint__enabled": True, "checkpoint__every_steps": 5, "training__num_train_steps": 30,
             "training__log_every_steps": 1}


def test_a_killed_process_stops_the_other_with_its_name_and_the_next_launch_resumes(tmp_path):
    workdir = tmp_path / "run"
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    procs = []
    with held_port(share_with_coordinator=True) as port:  # As _run_two_processes and launch/local.py.
        coordinator = f"127.0.0.1:{port}"
        env = {**_worker_env(), "JAX_COORDINATOR_BIND_ADDRESS": coordinator}
        for i, log in enumerate(logs):
            with open(log, "w") as out:  # Files, not pipes: see _run_two_processes.
                procs.append(subprocess.Popen(
                    _worker_command(workdir, OVERRIDES, num_cpu_devices=2, num_processes=2, process_id=i,
                                    coordinator=coordinator, peer_timeout_sec=PEER_TIMEOUT_SEC),
                    env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True))
        returncode, stopped_after_sec = _kill_process_1_after_a_checkpoint(workdir, procs, logs[0])
    output = logs[0].read_text()
    assert returncode == 1, output[-3000:]
    # The stated bound (14 s for a 10 s timeout), plus a little for the process's own exit.
    assert stopped_after_sec < distributed.peer_exit_bound_sec(PEER_TIMEOUT_SEC) + 5, stopped_after_sec
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == output.rstrip("\n").splitlines()[-1], output[-3000:]
    assert re.match(r"error: process 1 of 2 stopped responding \(lost at about step \d+\): no sign of "
                    r"life for 10 s .* run the same command to resume from the last complete checkpoint",
                    errors[0])
    assert "Terminating process" not in output  # JAX's C++ abort did not come first.
    last_complete = _committed_steps(workdir / "checkpoints")[-1]
    assert 0 < last_complete < 30

    outputs = _run_two_processes(workdir, OVERRIDES, peer_timeout_sec=PEER_TIMEOUT_SEC)
    assert all(f"DONE start_step={last_complete} step=30 " in out for out in outputs), outputs[0][-3000:]
    assert not any("error:" in out for out in outputs)


def _kill_process_1_after_a_checkpoint(workdir, procs, log0):
    """SIGKILLs process 1 once a checkpoint is committed and process 0 has logged step 7; returns process 0's
    exit status and how long after the kill it exited."""
    try:
        deadline = time.monotonic() + 120
        while not (_committed_steps(workdir / "checkpoints") and "step 7/" in log0.read_text()):
            assert time.monotonic() < deadline and procs[0].poll() is None, log0.read_text()[-3000:]
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        returncode = procs[0].wait(timeout=distributed.peer_exit_bound_sec(PEER_TIMEOUT_SEC) + 30)
        return returncode, time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
