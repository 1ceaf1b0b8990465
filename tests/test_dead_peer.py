"""A process that dies mid-run: the others stop within a stated time, naming it, and the next launch resumes.

The watchdog's decisions run here against a fake key-value store and clock; the end-to-end run, which kills
process 1 of a 2-process training job with SIGKILL and resumes it bit for bit, is part of
tests/test_multiprocess.py's scenario.
"""

import jax
import orbax.checkpoint as ocp
import pytest

from resnet_scaling import distributed


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

    def key_value_try_get(self, key):
        if self.down or key not in self.entries:
            raise RuntimeError("NOT_FOUND" if not self.down else "UNAVAILABLE")
        return self.entries[key]

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        return [(k, v) for k, v in sorted(self.entries.items()) if k.startswith(prefix)]


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _watchdogs(num_processes, timeout_sec=10, store=None, complete_checkpoints=None):
    store = store or _FakeStore()
    clock = _Clock()
    dogs = [distributed.PeerWatchdog(i, num_processes, timeout_sec, client=lambda: store, clock=clock,
                                     complete_checkpoints=complete_checkpoints)
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
    monkeypatch.setattr(jax, "process_index", lambda: 2)
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
    assert not ocp.multihost.is_jax_distributed_client_initialized()
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


def test_once_the_job_is_stopping_a_silent_peer_is_named_after_10_s_and_one_that_left_never():
    store, clock, dogs = _watchdogs(3, timeout_sec=60, complete_checkpoints=lambda: [20, 40])
    _rounds(clock, dogs, 10)
    # A SIGTERM reached a process: JAX's preemption sync manager records it in the service (jax 0.10.2).
    store.entries[distributed.JAX_PREEMPTION_NOTICE_KEY] = "2026-12-02T18:18:58.519656125+00:00"
    dogs[2].stop()  # Process 2 saved and is leaving (distributed.leave): its beats stop, and it said so.
    survivors = dogs[:1]  # Process 1 is dead (kill -9): its beats stop too, without a word.
    assert _rounds(clock, survivors, 10) == {}
    message = _rounds(clock, survivors, 2)[0]
    assert message.startswith("process 1 of 3 stopped responding: no sign of life for 10 s (while the job "
                              "was stopping).")
    # The newest complete checkpoint as the next launch will find it, not the one last reported.
    assert message.endswith("resume from the last complete checkpoint (step 40).")
    assert distributed.stopping_exit_bound_sec(60) == 5 + 10 + 1 < 30  # SLURM's default KillWait


def test_a_failing_process_hurries_the_watch_and_a_run_without_checkpoints_says_it_starts_over():
    store, clock, dogs = _watchdogs(2, timeout_sec=60, complete_checkpoints=lambda: [])
    _rounds(clock, dogs, 10)
    dogs[0].hurry(wait_sec=0)  # Its collective failed; the watch thread is not running here.
    assert _rounds(clock, dogs[:1], 10) == {}
    message = _rounds(clock, dogs[:1], 2)[0]
    assert "(while the job was stopping)" in message
    assert message.endswith("run the same command to resume from the start: no checkpoint is complete.")
    unreadable = distributed.PeerWatchdog(0, 2, 60, client=lambda: store, clock=clock,
                                          complete_checkpoints=lambda: 1 / 0)
    assert unreadable._lost_message([1]).endswith("from the last complete checkpoint, if there is one.")
