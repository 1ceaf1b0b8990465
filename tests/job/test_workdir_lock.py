"""The workdir lock against what crashes and restarts leave behind: an empty or garbage run.lock, a dead
run's pid reused by another process, a lock from before a reboot. Each case goes through the trainer's
entry, which must get past the lock to the set-up (patched here to stop there) or refuse in one line."""

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from resnet_scaling.job import workdir
from resnet_scaling.training import trainer, training_setup
from tests.helpers import random_arrays, tiny_config


class _SetupReached(Exception):
    pass


def _stop_at_setup(*args, **kwargs):
    raise _SetupReached


def _launch(path, monkeypatch):
    """The trainer on `path` up to its set-up: True if it got past the lock, else the WorkdirError."""
    monkeypatch.setattr(training_setup, "setup", _stop_at_setup)
    try:
        trainer.train_and_evaluate(tiny_config(), str(path), arrays=random_arrays(num_train=32))
    except _SetupReached:
        return True
    except workdir.WorkdirError as e:
        return e
    raise AssertionError("the trainer neither reached its set-up nor refused")


@pytest.mark.parametrize("content", ["", "{\"host\": \"h", "\x00\x00\x00", "[1, 2]", "null"])
def test_an_empty_or_garbage_lock_is_set_aside_and_the_run_goes_on(tmp_path, monkeypatch, caplog, content):
    lock_file = tmp_path / workdir.LOCK_FILENAME
    lock_file.write_text(content)
    old = time.time() - 60
    os.utime(lock_file, (old, old))
    with caplog.at_level(logging.WARNING):
        assert _launch(tmp_path, monkeypatch) is True
    aside = list(tmp_path.glob(f"{workdir.LOCK_FILENAME}.damaged-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert "empty or unreadable" in caplog.text


def test_a_just_created_empty_lock_is_given_time_to_be_written(tmp_path, monkeypatch):
    # Another run between its exclusive create and its write: wait the grace, and if the record never
    # comes, take the workdir; if it comes, refuse naming that run.
    lock_file = tmp_path / workdir.LOCK_FILENAME
    lock_file.write_text("")
    start = time.monotonic()
    assert _launch(tmp_path, monkeypatch) is True
    assert time.monotonic() - start >= workdir.DAMAGED_GRACE_SEC * 0.9

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock_file.write_text("")
        writer = subprocess.Popen([sys.executable, "-c", (
            "import json, socket, sys, time; time.sleep(0.5); "
            f"open({str(lock_file)!r}, 'w').write(json.dumps({{'host': socket.gethostname(), "
            f"'pid': {holder.pid}, 'started': time.time(), 'heartbeat': time.time(), "
            "'command': 'other'}))")])
        error = _launch(tmp_path, monkeypatch)
        writer.wait()
        assert isinstance(error, workdir.WorkdirError) and f"pid {holder.pid}" in str(error)
    finally:
        holder.kill()
        holder.wait()


def _lock_record(pid, **fields):
    now = time.time()
    return {"host": socket.gethostname(), "pid": pid, "started": now - 300, "heartbeat": now - 300,
            "command": "python -m resnet_scaling.train --workdir=here", **fields}


def test_a_dead_runs_lock_whose_pid_was_reused_is_taken_over(tmp_path, monkeypatch):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = workdir.process_start_time(other.pid)
        if start is None:
            pytest.skip("no /proc here: pid reuse cannot be told apart from a live holder")
        lock_file = tmp_path / workdir.LOCK_FILENAME
        # The pid now belongs to an unrelated process that started later than the run that wrote the lock.
        lock_file.write_text(json.dumps(_lock_record(other.pid, pid_start=start - 1000)))
        assert _launch(tmp_path, monkeypatch) is True
        # A restarted container: the lock names pid 1 with another start time.
        lock_file.write_text(json.dumps(_lock_record(1, pid_start=workdir.process_start_time(1) + 1)))
        assert _launch(tmp_path, monkeypatch) is True
        # The same pid with its own start time is the live holder: refused, naming it.
        lock_file.write_text(json.dumps(_lock_record(other.pid, pid_start=start)))
        error = _launch(tmp_path, monkeypatch)
        assert isinstance(error, workdir.WorkdirError)
        assert f"in use by another run: pid {other.pid}" in str(error)
        assert "\n" not in str(error)
        # A lock written before the machine rebooted is stale whatever its pid.
        lock_file.write_text(json.dumps(_lock_record(other.pid, pid_start=start, boot_id="another-boot")))
        if workdir._boot_id() is not None:
            assert _launch(tmp_path, monkeypatch) is True
    finally:
        other.kill()
        other.wait()


def test_the_lock_records_what_tells_its_process_apart(tmp_path):
    with workdir.WorkdirLock(tmp_path) as lock:
        record = json.loads(lock.path.read_text())
        assert record["pid"] == os.getpid()
        assert record["pid_start"] == workdir.process_start_time(os.getpid())
        if os.path.exists(f"/proc/{os.getpid()}/stat"):
            assert isinstance(record["pid_start"], int)
            # Field 22 of /proc/self/stat, read independently: the comm field may hold spaces.
            stat = open(f"/proc/{os.getpid()}/stat").read()
            assert record["pid_start"] == int(stat.split(") ")[-1].split()[19])
    assert not lock.path.exists()
