"""A two-process training job through what stops one, resumed each time to the uninterrupted run's state.

One scenario, so that the job launches (each a few seconds of start-up and compiling) are shared:

- launch 1: 2 processes x 2 CPU devices train, evaluating and saving a checkpoint with the evaluation's
  metrics (every 4th step), asynchronously; process 1 is killed (SIGKILL) after step 6, once the checkpoint of
  step 4 is committed; process 0 must stop with one `error:` line that names it and that checkpoint, before
  JAX's own abort;
- the reference, beside launches 1 and 2: the same training, 12 steps uninterrupted; each process records
  which evaluation images it fed;
- launch 2: the same command resumes from step 4; process 1 alone gets a SIGTERM after step 5: both
  processes must stop at the same step and commit a checkpoint of it;
- launch 3: the same command resumes from there to step 12: parameters and BN statistics must equal the
  reference's bit for bit (an uninterrupted 2-process run, not a 1-process one: gloo's cross-process sums
  differ from a single process's in the last bits, see tests/job/test_distributed.py).

Signals are sent while the process is held after a known step (tests/train_worker.py's --hold_at_step), so
a test process that reads logs late, on a loaded machine, can neither miss the step nor signal too late.
"""

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from resnet_scaling import checkpointing
from tests.helpers import held_port, launch_xla_flags, model_of
from tests.train_worker import worker_arrays

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "train_worker.py"

NUM_STEPS, EVERY_STEPS, NUM_EVAL = 12, 4, 17
# Evaluation: 8 images per process and batch (16 over the 4 devices); 17 images split 8 + 9, so process 0's
# second batch is all padding and process 1's has one image and 7 padding rows.
OVERRIDES = {"checkpoint__enabled": True, "checkpoint__every_steps": EVERY_STEPS,
             "checkpoint__async_save": True, "eval__every_steps": EVERY_STEPS,
             "training__num_train_steps": NUM_STEPS, "training__log_every_steps": 1}
FLAGS = {"num_eval": NUM_EVAL}
# 10 s proved too short once: on 2 cores loaded beyond the suite's two workers, process 1 named a live but
# CPU-starved process 0 lost while both restored a checkpoint.
PEER_TIMEOUT_SEC = 20
# Process 1 is held (and signalled) after these steps. JAX's preemption sync stops every process at the
# step after the highest one any process has passed when the notice reaches them: after step 5 (process 0
# waits in step 6's collectives meanwhile) that is step 6, or 7 if the notice comes a step late.
KILL_AT_STEP, SIGTERM_AT_STEP = 6, 5
HANG_SEC = 300  # Only a hang reaches this: a launch took 10-80 s on 2 cores shared with other tests.


def _committed_steps(checkpoints: pathlib.Path) -> list[int]:
    """Steps whose checkpoint is complete on disk: orbax (0.12) writes a save into
    `<step>.orbax-checkpoint-tmp*`, adds `commit_success.txt` once every process's part is written, then
    renames it to `<step>`."""
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").is_file())


@contextlib.contextmanager
def _job(workdir, name, flags=None, flags_1=None):
    """A 2-process job of tests/train_worker.py on 127.0.0.1, with `flags` for both processes and `flags_1`
    for process 1 only; yields (processes, log paths) and kills what is left when the block ends."""
    logs = [workdir.parent / f"{name}-process{i}.log" for i in range(2)]
    procs = []
    # The coordinator's port stays held (SO_REUSEPORT, not listening) until the job ends, so that nothing
    # else takes it first; process 0's coordinator binds beside it, as with launch/local.py.
    with held_port(share_with_coordinator=True) as port:
        coordinator = f"127.0.0.1:{port}"
        # The scenario's launches share a persistent compilation cache of their own: they compile the same
        # programs with the same (fast) options, so only the first launches compile them, as a relaunched
        # `resnet_scaling.train` loads them from its cache.
        env = {**os.environ, "XLA_FLAGS": launch_xla_flags(), "PYTHONUNBUFFERED": "1",
               "JAX_COORDINATOR_BIND_ADDRESS": coordinator,
               "JAX_COMPILATION_CACHE_DIR": str(workdir.parent / "compilation_cache"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
        try:
            for i, log in enumerate(logs):
                process_flags = {**FLAGS, **(flags or {}), **((flags_1 or {}) if i == 1 else {}),
                                 "workdir": workdir, "overrides": json.dumps(OVERRIDES), "num_cpu_devices": 2,
                                 "num_processes": 2, "process_id": i, "coordinator": coordinator}
                command = [sys.executable, str(WORKER)] + [
                    f"--{k}={v}" if v != "" else f"--{k}" for k, v in process_flags.items()]
                # Files, not pipes: the processes are coupled by collectives, so one blocked on a full pipe
                # that nobody reads would stall the other too.
                with open(log, "w") as out:
                    procs.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=out,
                                                  stderr=subprocess.STDOUT, text=True))
            yield procs, logs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _finish(procs, logs):
    """Waits for both processes; returns their outputs, asserting that both succeeded."""
    for proc in procs:
        proc.wait(timeout=HANG_SEC)
    outputs = [log.read_text() for log in logs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]
        assert "error:" not in output, output[-3000:]
    return outputs


def _wait_for(condition, what, procs, logs):
    """Polls `condition` while both processes run (a hang guard only, not a time limit)."""
    deadline = time.monotonic() + HANG_SEC
    while not condition():
        for proc, log in zip(procs, logs, strict=True):
            assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {what} in {HANG_SEC} s:\n{logs[1].read_text()[-3000:]}"
        time.sleep(0.05)


def _wait_until_held(hold_dir, procs, logs, checkpoints=None):
    """Waits until process 1 holds (and, if given, `checkpoints` has a committed step); returns the step."""
    marker = hold_dir / "held-1"
    _wait_for(lambda: marker.exists() and (checkpoints is None or _committed_steps(checkpoints)),
              "hold of process 1", procs, logs)
    return int(marker.read_text())


def _done(output):
    """(start_step, step, preempted) from train_worker's last line."""
    start, step, preempted = re.search(r"DONE start_step=(\d+) step=(\d+) preempted=(\w+)", output).groups()
    return int(start), int(step), preempted == "True"


def _assert_bitwise_equal(a, b):
    leaves_a, leaves_b = jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for (path, x), y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_a_killed_then_preempted_two_process_job_resumes_bit_for_bit_and_evaluates_every_image_once(tmp_path):
    reference, run, holds = tmp_path / "reference", tmp_path / "run", tmp_path / "holds"
    holds.mkdir()
    watched = {"peer_timeout_sec": PEER_TIMEOUT_SEC}  # Launches 1-3 join as train.py does, watchdog on.
    with contextlib.ExitStack() as stack:
        procs, logs = stack.enter_context(_job(run, "killed", flags=watched,
                                               flags_1={"hold_at_step": KILL_AT_STEP, "hold_dir": holds}))
        # Held after step 6, process 1 has started no step 7 and no save after step 4's, which completes
        # meanwhile (asynchronous saves go on while the main thread waits).
        assert _wait_until_held(holds, procs, logs, run / "checkpoints") == KILL_AT_STEP
        assert _committed_steps(run / "checkpoints") == [4]
        procs[1].send_signal(signal.SIGKILL)
        # The reference runs while process 0 waits out the peer timeout, and during launch 2; launch 1 has
        # compiled every program it needs into the cache.
        reference_job = stack.enter_context(_job(reference, "reference", flags={"record_eval": tmp_path}))
        # No wall-clock limit: JAX's own heartbeat abort (SIGABRT, from half its heartbeat timeout after the
        # death: 38 s, `PeerTiming`) bounds the watchdog's line; coming after it would fail below.
        returncode = procs[0].wait(timeout=HANG_SEC)
        killed_output = logs[0].read_text()

        # Launch 1: the survivor names the dead process in its one error line, its last, and stops. Its
        # collective fails at once (gloo sees the reset connection), so it names the peer as a stopping job
        # does (10 s), as train.py would; one hung instead would name it after the peer timeout.
        assert returncode == 1, killed_output[-3000:]
        errors = [line for line in killed_output.splitlines() if line.startswith("error:")]
        assert errors == [killed_output.rstrip("\n").splitlines()[-1]], killed_output[-3000:]
        silence = (r"(10 s \(while the job was stopping\)|"
                   rf"{PEER_TIMEOUT_SEC} s \(RESNET_SCALING_PEER_TIMEOUT_SEC\))")
        assert re.match(rf"error: process 1 of 2 stopped responding: no sign of life for {silence}\. .* run "
                        r"the same command to resume from the last complete checkpoint \(step 4\)\.$",
                        errors[0]), errors[0]
        assert "Terminating process" not in killed_output  # JAX's C++ abort did not come first.

        # Launch 2: resumes from step 4; a SIGTERM to process 1 stops both at one step, with its checkpoint.
        (holds / "held-1").unlink()
        procs, logs = stack.enter_context(_job(run, "preempted", flags=watched,
                                               flags_1={"hold_at_step": SIGTERM_AT_STEP, "hold_dir": holds}))
        assert _wait_until_held(holds, procs, logs) == SIGTERM_AT_STEP
        procs[1].send_signal(signal.SIGTERM)
        # JAX's listener looks for the signal once a second and says when it saw it (jax 0.10.2); released
        # only then, process 1 leaves the notice only the coordination service's round trips to make.
        _wait_for(lambda: "SIGTERM caught at" in logs[1].read_text(), "SIGTERM notice", procs, logs)
        (holds / "release-1").touch()
        preempted_outputs = _finish(procs, logs)
        reference_outputs = _finish(*reference_job)
    (start, stopped_at, preempted), second = (_done(out) for out in preempted_outputs)
    assert second == (start, stopped_at, preempted) and start == 4 and preempted, preempted_outputs[1][-3000:]
    assert SIGTERM_AT_STEP < stopped_at < NUM_STEPS  # Process 0 got no signal, yet stopped at that step.
    assert f"Preempted (SIGTERM) at step {stopped_at}: checkpoint saved" in preempted_outputs[0]
    assert stopped_at in _committed_steps(run / "checkpoints")

    # Launch 3: resumes from the preemption's checkpoint to the end.
    with _job(run, "resumed", flags=watched) as (procs, logs):
        resumed_outputs = _finish(procs, logs)
    assert [_done(out) for out in resumed_outputs] == [(stopped_at, NUM_STEPS, False)] * 2
    resumed_variables, _ = checkpointing.load_exported(str(run))
    reference_variables, config = checkpointing.load_exported(str(reference))
    _assert_bitwise_equal(resumed_variables["params"], reference_variables["params"])
    _assert_bitwise_equal(resumed_variables["batch_stats"], reference_variables["batch_stats"])

    # The reference: the last checkpoint's asynchronous save and the export, which coincide, both completed
    # (barriers of one taken for the other's would time out or hang); the checkpoint kept as the best is
    # the best evaluation's in process 0's log (the later of a tie).
    assert [_done(out) for out in reference_outputs] == [(0, NUM_STEPS, False)] * 2
    assert _committed_steps(reference / "checkpoints")[-1] == NUM_STEPS
    assert checkpointing.is_export_directory(reference / "export")
    top1 = {int(step): float(value) for step, value in
            re.findall(r"eval at step (\d+): loss \S+, top1 (\S+),", reference_outputs[0])}
    assert sorted(top1) == list(range(EVERY_STEPS, NUM_STEPS + 1, EVERY_STEPS))
    assert checkpointing.best_step(str(reference)) == max(sorted(top1, reverse=True), key=top1.get)

    # Exact evaluation by identity: at every evaluation the two processes fed every image exactly once
    # between them (unequal shares, 8 and 9, and padding), and both got the same totals.
    records = [[json.loads(line) for line in (tmp_path / f"eval-{i}.jsonl").read_text().splitlines()]
               for i in range(2)]
    eval_steps = list(range(EVERY_STEPS, NUM_STEPS + 1, EVERY_STEPS))
    assert [r["step"] for r in records[0]] == [r["step"] for r in records[1]] == eval_steps
    for first, second in zip(*records, strict=True):
        assert sorted(first.pop("ids") + second.pop("ids")) == list(range(NUM_EVAL)), (first, second)
        assert (first.pop("padding"), second.pop("padding")) == (8, 7)
        assert first == second and first["eval_count"] == NUM_EVAL
    # ...and the devices' sums are one device's over the 17 images once each: the final evaluation against
    # a NumPy loss of the exported model's logits. (Within float32 rounding; the ids above tell apart two
    # images of nearly the same loss, which the mean cannot.)
    _, _, eval_images, eval_labels = worker_arrays(NUM_EVAL, stamp_ids=True)
    mean, stddev = (np.asarray(config.data[k], np.float32) for k in ("mean_rgb", "stddev_rgb"))
    logits = np.asarray(model_of(config).apply(
        reference_variables, (eval_images / np.float32(255) - mean) / stddev, train=False), np.float64)
    shifted = logits - logits.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    expected_loss = -log_probs[np.arange(NUM_EVAL), eval_labels].mean()
    assert records[0][-1]["eval_loss"] == pytest.approx(expected_loss, rel=1e-5)
