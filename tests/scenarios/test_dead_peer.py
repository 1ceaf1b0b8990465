"""A process that dies mid-run: the others stop within a stated time, naming it, and the next launch resumes.

The watchdog's decisions (`resnet_scaling/job/distributed.py`) run here against a fake key-value store and
clock; the end-to-end runs, which kill process 1 of a 2-process training job with SIGKILL and resume it, are
tests/scenarios/test_multiprocess.py's scenario and tests/scenarios/test_slurm.py's (through the command
line).
"""

import atexit

import pytest

from resnet_scaling.job import distributed


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


def test_a_silent_process_is_named_after_the_timeout_and_not_before():
    checkpoints = [5]
    store, clock, dogs = _watchdogs(3, complete_checkpoints=lambda: checkpoints)
    assert _rounds(clock, dogs, 30) == {}  # All beating: nobody is lost, however long it runs.
    survivors = [dogs[0], dogs[2]]  # Process 1 dies: its counter stops.
    assert _rounds(clock, survivors, 9) == {}
    checkpoints.append(10)  # Completed since the death: the line names the newest on disk when it speaks.
    verdicts = _rounds(clock, survivors, 3)
    assert set(verdicts) == {0, 2}
    assert verdicts[0].startswith("process 1 of 3 stopped responding: no sign of life for 10 s "
                                  "(RESNET_SCALING_PEER_TIMEOUT_SEC).")
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


def test_the_peer_timeout_comes_from_the_argument_the_environment_or_the_default():
    env = {distributed.ENV_PEER_TIMEOUT: "15"}
    assert distributed.resolve_peer_timeout_sec(None, {}) == distributed.DEFAULT_PEER_TIMEOUT_SEC == 60
    assert distributed.resolve_peer_timeout_sec(None, env) == 15
    assert distributed.resolve_peer_timeout_sec(0, env) == 0
    with pytest.raises(ValueError, match="RESNET_SCALING_PEER_TIMEOUT_SEC must be a number"):
        distributed.resolve_peer_timeout_sec(None, {distributed.ENV_PEER_TIMEOUT: "1m"})
    with pytest.raises(ValueError, match=">= 0"):
        distributed.resolve_peer_timeout_sec(-1, {})


@pytest.mark.parametrize("timeout_sec, poll, bound, stopping_bound, heartbeat", [
    (60, 5, 80, 16, 180), (10, 1, 14, 12, 48), (20, 2, 28, 13, 76), (1, 0.5, 3, 2.5, 26)])
def test_the_timing_table_states_the_bounds(timeout_sec, poll, bound, stopping_bound, heartbeat):
    timing = distributed.PeerTiming.for_timeout(timeout_sec)
    assert (timing.poll_sec, timing.exit_bound_sec, timing.stopping_exit_bound_sec,
            timing.jax_heartbeat_timeout_sec) == (poll, bound, stopping_bound, heartbeat)
    assert timing.stopping_exit_bound_sec < 30  # SLURM's default KillWait.
    # JAX's own heartbeat abort can come half its timeout after a death (its processes beat every half
    # timeout): after the watchdog's line.
    assert timing.jax_heartbeat_timeout_sec / 2 > timing.exit_bound_sec


def test_a_process_on_its_way_out_says_it_left_and_makes_no_more_calls():
    store, clock, dogs = _watchdogs(2)
    dog = dogs[0].start()
    try:
        dog.stop()
        dog._thread.join(timeout=30)
        assert not dog._thread.is_alive()
        assert store.entries["resnet_scaling/peer_watch/left/0"] == "1"
        dogs[1].check()  # Process 1 sees that process 0 left: its silence is no death.
        clock.now += 60
        assert dogs[1].check() is None
    finally:
        atexit.unregister(dog.stop)


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
    # The newest complete checkpoint as the next launch will find it, read when the line is written.
    assert message.endswith("resume from the last complete checkpoint (step 40).")


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
