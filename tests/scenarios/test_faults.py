"""Faults that used to lose work or lie: a runaway learning rate, corrupted checkpoint bytes, two runs on one
workdir, unwritable and full disks, resuming on other data or with other settings, and the one-line errors
of the command line."""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from resnet_scaling import checkpointing
from resnet_scaling.checkpointing import divergence
from resnet_scaling.job import workdir
from resnet_scaling.training import trainer, training_setup
from tests.helpers import checkpointer_of, random_arrays, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[2]


def _config(**overrides):
    defaults = {"schedule__name": "constant", "schedule__warmup_steps": 0, "training__num_train_steps": 8,
                "checkpoint__enabled": True, "checkpoint__every_steps": 2, "checkpoint__async_save": False}
    return tiny_config(**{**defaults, **overrides})


def _train(path, **overrides):
    return trainer.train_and_evaluate(_config(**overrides), str(path), arrays=random_arrays(num_train=96))


def _steps(path):
    return sorted(int(p.name) for p in (path / "checkpoints").iterdir() if p.name.isdigit())


# ------------------------------------------------------------------ divergence


def test_a_runaway_learning_rate_never_reaches_a_checkpoint_and_a_sane_rerun_finishes(tmp_path):
    # Measured with this config: after update 2 the parameter norm is ~4,000x its start, after update 3
    # ~1e10x (finite: the loss of step 3 is 3.5e7), and the loss turns NaN at step 4.
    runaway = {"optimizer__base_learning_rate": 1e6, "schedule__name": "cosine", "schedule__warmup_steps": 1,
               "checkpoint__every_steps": 1, "training__log_every_steps": 1}
    with pytest.raises(divergence.DivergenceError,
                       match=r"state after step 2 has a parameter norm .*x that of step 0.*not saved\. "
                             r"The newest sound checkpoint is step 1 "):
        _train(tmp_path, **runaway)
    assert _steps(tmp_path) == [1]
    saved = checkpointing.latest_saved_meta(str(tmp_path))
    assert saved["step"] == 1
    # A save at the end only: the rerun's own saves prove nothing here, and each costs a moment.
    resumed = _train(tmp_path, **{**runaway, "optimizer__base_learning_rate": 0.1,
                                  "checkpoint__every_steps": 0})
    assert resumed.start_step == 1 and int(resumed.state.step) == 8
    assert all(np.isfinite(r["loss"]) for r in resumed.train_history)


def test_a_checkpoint_disproved_by_the_next_loss_is_moved_away(tmp_path):
    # The norm check off: the first NaN loss (step 4) shows that the state after step 3 was already bad,
    # so checkpoints 3 and later go to diverged_checkpoints/ and the message names checkpoint 2.
    runaway = {"optimizer__base_learning_rate": 1e6, "schedule__name": "cosine", "schedule__warmup_steps": 1,
               "checkpoint__every_steps": 1, "training__log_every_steps": 1,
               "training__max_param_norm_growth": 0.0}
    with pytest.raises(divergence.DivergenceError,
                       match=r"loss is nan at step 4\. The newest sound checkpoint is step 2 "):
        _train(tmp_path, **runaway)
    assert _steps(tmp_path) == [1, 2]
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "diverged_checkpoints").iterdir()) == ["3"]


# ------------------------------------------------------------------ corrupted bytes


def _data_files(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    assert files, sorted(str(p) for p in (step_dir / "state").rglob("*"))
    return sorted(files, key=lambda p: p.stat().st_size)


def test_4_kib_of_random_bytes_are_caught_and_a_flipped_bit_never_restores_other_values_than_were_saved(
        tmp_path, caplog):
    """Checkpoint 4 of one tiny run, damaged in copies of its workdir: 4 KiB of random bytes are caught and
    the run resumes from checkpoint 2; a flipped bit is caught likewise, or restores the values saved."""
    result = _train(tmp_path / "run", training__num_train_steps=4)
    random_bytes = tmp_path / "random_bytes"
    shutil.copytree(tmp_path / "run", random_bytes)
    target = _data_files(random_bytes / "checkpoints" / "4")[-1]  # The largest: parameters and moments.
    data = bytearray(target.read_bytes())
    start = len(data) // 2
    data[start:start + 4096] = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    target.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        resumed = _train(random_bytes, training__num_train_steps=6)
    assert resumed.start_step == 2 and int(resumed.state.step) == 6
    # zstd refuses most such blocks itself; the fingerprints catch the rest (the flipped bits below).
    assert "Skipping checkpoint" in caplog.text and "checkpoints/4 (moved to" in caplog.text
    assert [p.name.split("-")[0] for p in (random_bytes / "unreadable_checkpoints").iterdir()] == ["4"]
    caplog.clear()

    # OCDBT's chunks carry no checksum: measured, a flipped bit in the large data files restored silently
    # changed arrays. Now each flip either leaves what is restored bit-identical (bytes no array reads) or
    # the checkpoint is set aside and the previous one restored.
    saved = jax.device_get(result.state)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            result.state)
    # The largest data file holds the parameters and the optimizer's moments; which arrays the smaller
    # ones hold, and so whether a restore reads a given byte of them, changes with the order of the
    # asynchronous writes. A flip in bytes no array reads restores bit-identical values, which is right too.
    largest = _data_files(tmp_path / "run" / "checkpoints" / "4")[-1]
    caught = 0
    for i, (file, fraction) in enumerate((largest, f) for f in (0.1, 0.3, 0.5, 0.7, 0.9)):
        copy = tmp_path / f"flip{i}"
        shutil.copytree(tmp_path / "run", copy)
        target = copy / file.relative_to(tmp_path / "run")
        data = bytearray(target.read_bytes())
        data[int(len(data) * fraction)] ^= 0x10
        target.write_bytes(bytes(data))
        checkpointer = checkpointer_of(copy, _config())
        with caplog.at_level("WARNING"):
            state, meta = checkpointer.restore_latest(abstract)
        checkpointer.close()
        if meta["step"] == 4:
            for restored, original in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(saved),
                                          strict=True):
                np.testing.assert_array_equal(restored, original)
        else:
            assert meta["step"] == 2
            caught += 1
    # Measured: all 5 flips land in array bytes and are caught; one spare for a layout that puts a header
    # or padding under one of them.
    assert caught >= 4 and "differ from what was saved" in caplog.text


def test_fingerprints_see_every_bit_and_every_array():
    from resnet_scaling.checkpointing import state_checks

    tree = {"a": np.arange(1000, dtype=np.float32), "b": {"c": np.ones((3, 4), np.int32)},
            "h": np.zeros(8, jax.numpy.bfloat16)}
    base = state_checks.fingerprint(tree)
    assert set(base) == {"['a']", "['b']['c']", "['h']"}
    flipped = np.arange(1000, dtype=np.float32)
    flipped.view(np.uint32)[637] ^= 1  # The lowest mantissa bit of one element.
    assert state_checks.mismatched(base, state_checks.fingerprint({**tree, "a": flipped})) == ["['a']"]
    swapped = np.arange(1000, dtype=np.float32)
    swapped[[3, 4]] = swapped[[4, 3]]  # Same values, other positions.
    assert state_checks.mismatched(base, state_checks.fingerprint({**tree, "a": swapped})) == ["['a']"]
    assert state_checks.mismatched(base, state_checks.fingerprint(tree)) == []


# ------------------------------------------------------------------ the workdir lock


def _no_setup(*args, **kwargs):
    raise AssertionError("set-up must not start")


def test_a_second_run_on_a_locked_workdir_refuses_before_any_set_up_naming_the_first(tmp_path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / workdir.LOCK_FILENAME).write_text(json.dumps(
            {"host": socket.gethostname(), "pid": holder.pid, "started": time.time(),
             "heartbeat": time.time(), "command": "python -m resnet_scaling.train --workdir=here"}))
        # "At once" is "before the slow set-up (devices, data, compilation)": counted by what ran, not by a
        # clock that a loaded machine slows.
        with monkeypatch.context() as patch:
            patch.setattr(training_setup, "setup", _no_setup)
            with pytest.raises(workdir.WorkdirError, match=rf"in use by another run: pid {holder.pid} on "):
                _train(tmp_path)
        assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # Its process is gone: the lock is stale. (Checkpoints off: the lock is taken and released without them.)
    result = _train(tmp_path, training__num_train_steps=2, checkpoint__enabled=False)
    assert int(result.state.step) == 2 and not (tmp_path / workdir.LOCK_FILENAME).exists()


def test_a_lock_from_another_host_is_stale_only_when_its_heartbeat_stopped(tmp_path):
    lock_file = tmp_path / workdir.LOCK_FILENAME
    for age, busy in ((5.0, True), (workdir.STALE_AFTER_SEC + 5, False)):
        lock_file.write_text(json.dumps({"host": "another-host", "pid": 1, "started": time.time() - age,
                                         "heartbeat": time.time() - age, "command": "train"}))
        lock = workdir.WorkdirLock(tmp_path)
        if busy:
            with pytest.raises(workdir.WorkdirError, match="pid 1 on another-host"):
                lock.acquire()
        else:
            lock.acquire()
            assert json.loads(lock_file.read_text())["pid"] == os.getpid()
            lock.release()
            assert not lock_file.exists()


def test_the_lock_holder_refreshes_its_heartbeat(tmp_path):
    lock = workdir.WorkdirLock(tmp_path, heartbeat_sec=0.05)
    with lock:
        # Four different heartbeats (three refreshes), however slowly a loaded machine schedules the heartbeat
        # thread; the deadline (1,200 intervals) only turns a heartbeat that never comes into a failure.
        beats, deadline = [], time.monotonic() + 60
        while len(beats) < 4:
            assert time.monotonic() < deadline, f"{len(beats)} different heartbeats in 60 s"
            try:
                beat = json.loads(lock.path.read_text())["heartbeat"]
            except ValueError:  # Read while being rewritten (the refresh is not atomic): read again.
                continue
            if not beats or beat != beats[-1]:
                beats.append(beat)
            time.sleep(0.01)
    assert beats == sorted(beats)


def test_resuming_from_an_older_checkpoint_leaves_one_metric_record_per_step(tmp_path):
    # Saves after steps 4 and 8 only (not at the evaluations): the resume needs 4 alone.
    settings = {"training__log_every_steps": 1, "eval__every_steps": 2, "checkpoint__every_steps": 4,
                "checkpoint__keep_best": False}
    _train(tmp_path, **settings)
    # As if the run had died after logging step 8 but before saving it.
    for path in sorted((tmp_path / "checkpoints" / "8").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (tmp_path / "checkpoints" / "8").rmdir()
    resumed = _train(tmp_path, **settings)
    assert resumed.start_step == 4
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "loss" in r]
    eval_steps = [r["step"] for r in records if "eval_top1" in r]
    assert train_steps == list(range(1, 9)) and eval_steps == [2, 4, 6, 8]


# ------------------------------------------------------------------ disks


def test_an_unwritable_workdir_fails_before_any_set_up(tmp_path, monkeypatch):
    # Before the slow set-up (devices, data, compilation): checked by what ran, not by a clock.
    monkeypatch.setattr(training_setup, "setup", _no_setup)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(workdir.WorkdirError,
                       match=r"Cannot write to the workdir .*a_file/run: Not a directory"):
        _train(tmp_path / "a_file" / "run")


def _tiny_filesystem(path, size):
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); "
                    "test_a_save_that_fails_names_its_cause covers the message")
    return lambda: subprocess.run(["umount", "-l", str(path)], check=False)


# The failed save's later TensorStore writes call back into the event loop orbax closed at the first failure;
# Python cannot raise that anywhere (pytest names it "Exception ignored in: None"); the command line sends
# those tracebacks to the log file (test_console's closed-event-loop test).
@pytest.mark.filterwarnings("ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_stops_the_run_at_once_naming_the_cause_and_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "small_disk"
    # Room for ~6 checkpoints of the tiny model (~0.65 MB each): with 1600k the first save sometimes did not
    # fit (1 run in 3), leaving no complete checkpoint to name, and with 2400k once on a loaded machine.
    unmount = _tiny_filesystem(run_dir, "4000k")
    try:
        # Whichever write meets the full disk first (a checkpoint, goodput.json, metrics.jsonl) ends the run.
        with pytest.raises((checkpointing.CheckpointSaveError, workdir.WorkdirError)) as failure:
            _train(run_dir, training__num_train_steps=40, checkpoint__async_save=True, checkpoint__keep=10,
                   training__log_every_steps=1, checkpoint__every_steps=1)
        message = str(failure.value)
        assert "No space left on device" in message and "\n" not in message, message
        last = int(message.split("The last complete checkpoint is step ")[1].split()[0])
        assert last in _steps(run_dir)
    finally:
        unmount()


def test_a_full_disk_met_by_a_metrics_write_names_the_cause_and_the_last_checkpoint(tmp_path, monkeypatch):
    import errno

    from resnet_scaling.metrics import goodput

    real_write = workdir.write_text_atomically

    def fill_the_disk_at_step_5(path, text):
        is_goodput = str(path).endswith(goodput.GOODPUT_FILENAME)
        if is_goodput and (json.loads(text)["launches"][-1]["last_step"] or 0) >= 5:
            # Wrapped, as orbax wraps TensorStore's errors: the cause is found along the chain.
            raise ValueError("write failed") from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, text)

    monkeypatch.setattr(workdir, "write_text_atomically", fill_the_disk_at_step_5)
    with pytest.raises(workdir.WorkdirError,
                       match=r"^Writing to the workdir .* failed: No space left on device \(ENOSPC\)\. "
                             r"The last complete checkpoint is step 4 in .*checkpoints; run the same command",
                       ) as failure:
        _train(tmp_path, training__log_every_steps=1)
    assert "\n" not in str(failure.value)
    assert _steps(tmp_path) == [2, 4]
    # Other I/O errors are not a full disk: they stay what they are.

    def lose_the_directory(path, text):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))

    monkeypatch.setattr(workdir, "write_text_atomically", lose_the_directory)
    with pytest.raises(FileNotFoundError):
        _train(tmp_path / "other", training__log_every_steps=1)


def test_only_saves_orbax_finished_count_as_complete(tmp_path):
    for step in (2, 4):  # Renamed into place, as orbax finishes a save on a local disk.
        (tmp_path / "checkpoints" / str(step)).mkdir(parents=True)
    (tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1").mkdir()  # A save cut off before its rename.
    assert checkpointing.complete_steps(str(tmp_path)) == [2, 4]
    assert checkpointing.complete_steps(str(tmp_path / "none")) == []


def test_a_background_save_that_fails_while_closing_is_named_like_any_failed_save(tmp_path, monkeypatch):
    import errno

    import orbax.checkpoint as ocp

    real_wait = ocp.CheckpointManager.wait_until_finished

    def fail_once_step_6_is_started(self):
        real_wait(self)
        if self.latest_step() == 6:
            # As a writer that failed leaves it: no finished folder for step 6, and orbax forgets the step
            # (its public `reload` reads the steps from the directory again).
            shutil.rmtree(self.directory / "6")
            self.reload()
            raise ValueError("tensorstore write failed") from OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", fail_once_step_6_is_started)
    with pytest.raises(checkpointing.CheckpointSaveError,
                       match=r"checkpoint of step 6 failed: Disk quota exceeded \(EDQUOT\)\. "
                             r"The last complete checkpoint is step 4 in"):
        _train(tmp_path, training__num_train_steps=6, checkpoint__every_steps=4)  # Saves 4, then 6.


def test_a_save_that_fails_names_its_cause(tmp_path, monkeypatch):
    import errno

    import orbax.checkpoint as ocp

    real_save = ocp.CheckpointManager.save

    def save_then_fill_the_disk(self, step, *args, **kwargs):
        if step >= 4:
            raise ValueError("tensorstore write failed") from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save_then_fill_the_disk)
    with pytest.raises(checkpointing.CheckpointSaveError,
                       match=r"checkpoint of step 4 failed: No space left on device \(ENOSPC\)\. The last "
                             r"complete checkpoint is step 2 in .*checkpoints; run the same command"):
        _train(tmp_path)


# ------------------------------------------------------------------ what a resume may change


def test_a_changed_learning_rate_on_resume_is_said_and_recorded_and_other_data_refused_before_set_up(
        tmp_path, caplog, monkeypatch):
    def train(**overrides):  # Each launch saves at its end only: the next resumes from there.
        return _train(tmp_path, checkpoint__every_steps=0, **overrides)

    train(training__num_train_steps=4)
    with caplog.at_level("WARNING"):
        train(training__num_train_steps=6, optimizer__base_learning_rate=0.05)
    assert ("Resuming at step 4 with changed settings: training.num_train_steps 4 -> 6; "
            "optimizer.base_learning_rate 0.1 -> 0.05.") in caplog.text
    (record,) = [json.loads(line) for line in (tmp_path / "config_changes.jsonl").read_text().splitlines()]
    assert record["step"] == 4
    assert record["changes"] == {"optimizer.base_learning_rate": [0.1, 0.05],
                                 "training.num_train_steps": [4, 6]}
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["optimizer"]["base_learning_rate"] == 0.05  # Steps 5 and 6 used it.
    # A launch of a finished run runs no step: the export keeps the settings its steps used.
    train(training__num_train_steps=6, optimizer__base_learning_rate=0.01)
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["optimizer"]["base_learning_rate"] == 0.05
    # Resuming on other data is refused, before any set-up.
    monkeypatch.setattr(training_setup, "setup", _no_setup)
    with pytest.raises(checkpointing.IncompatibleCheckpointError,
                       match=r"data.num_train_examples: checkpoint 1281167, config 5000"):
        train(training__num_train_steps=6, data__num_train_examples=5000)


# ------------------------------------------------------------------ signals


def test_the_host_never_runs_more_than_max_steps_ahead_of_the_devices(monkeypatch):
    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda outputs: waited.append(outputs))
    in_flight = trainer.StepsInFlight(2)
    for step in range(1, 6):
        in_flight.after_step(step, None, step)
        assert waited == list(range(1, max(step - 2, 0) + 1))  # Step k waits for step k-2.


def test_ctrl_c_saves_a_checkpoint_of_the_step_it_came_in_and_exits_cleanly(tmp_path):
    from tests.worker_runs import run_and_signal, worker_command, worker_env

    # Far more steps than run before the signal: a run that ignored it would not end by itself.
    overrides = {"schedule__name": "constant", "schedule__warmup_steps": 0, "checkpoint__enabled": True,
                 "training__num_train_steps": 100_000, "training__log_every_steps": 1,
                 "checkpoint__every_steps": 50}
    workdir = tmp_path / "run"
    returncode, text, reached, _ = run_and_signal(worker_command(workdir, overrides), worker_env(),
                                                   tmp_path / "log.txt", workdir / "checkpoints", at_step=5,
                                                   sig=signal.SIGINT)
    assert returncode == 0 and "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
    preempted = re.search(r"Preempted \(SIGINT\) at step (\d+):", text)
    assert preempted, text[-2000:]
    stopped_at = int(preempted.group(1))
    # `reached`: the newest step the run had logged when the signal was sent (read with the run stopped,
    # however late the test saw the line). Logging every step fetches each step's loss, so the loop is never
    # past the step after it: the signal is acted on at the end of the step it came in.
    assert reached is not None and reached <= stopped_at <= reached + 1, (reached, stopped_at)
    *periodic, last = _steps(workdir)
    assert last == stopped_at and all(step % 50 == 0 for step in periodic), _steps(workdir)
