"""Checkpoints: exact resume, SIGTERM and SIGKILL, resharding, corrupt and incompatible checkpoints,
the NaN guard, several processes, and the exported parameters."""

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from resnet_scaling import checkpointing, mesh, models, trainer
from tests.helpers import held_port, persistent_compilation_cache, random_arrays, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "train_worker.py"


def _config(**overrides):
    # A constant learning rate makes the run's length irrelevant to every step but the last, so that
    # runs cut at different points can be compared step for step.
    defaults = {"schedule__name": "constant", "schedule__warmup_steps": 0, "training__num_train_steps": 8,
                "checkpoint__enabled": True, "checkpoint__every_steps": 2,
                "checkpoint__async_save": False}
    return tiny_config(**{**defaults, **overrides})


def _train(workdir, **overrides):
    return trainer.train_and_evaluate(_config(**overrides), str(workdir), arrays=random_arrays(num_train=96))


def _params(result):
    return jax.device_get(result.state.params)


def _assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("xla_optimizations", ["off", "default"], indirect=True)
def test_a_run_stopped_by_preemption_resumes_to_the_same_parameters_bit_for_bit(tmp_path, monkeypatch,
                                                                                 xla_optimizations):
    # On XLA's default path (as real runs compile) each program takes seconds to compile: the three runs
    # share a persistent compilation cache, as a restarted `resnet_scaling.train` does by default.
    with (persistent_compilation_cache(tmp_path / "compilation_cache") if xla_optimizations == "default"
          else contextlib.nullcontext()):
        reference = _params(_train(tmp_path / "reference", checkpoint__async_save=True))

        monkeypatch.setattr(checkpointing.PreemptionWatcher, "reached", lambda self, step: step == 3)
        first = _train(tmp_path / "run", checkpoint__async_save=True)
        assert first.preempted and int(first.state.step) == 3
        assert sorted(os.listdir(tmp_path / "run" / "checkpoints"))[:2] == ["2", "3"]
        first_meta = json.loads((tmp_path / "run" / "checkpoints" / "3" / "meta" / "metadata").read_text())
        monkeypatch.undo()

        resumed = _train(tmp_path / "run", checkpoint__async_save=True)
    assert resumed.start_step == 3 and not resumed.preempted and int(resumed.state.step) == 8
    _assert_bitwise_equal(_params(resumed), reference)
    # The clocks survive the restart: the resumed run's checkpoint counts both runs' training time.
    meta = json.loads((tmp_path / "run" / "checkpoints" / "8" / "meta" / "metadata").read_text())
    assert meta["clock"]["train_sec"] > first_meta["clock"]["train_sec"] > 0


def test_only_the_last_k_checkpoints_are_kept_and_the_best_parameters_are_saved(tmp_path, monkeypatch):
    evaluated = {}  # step -> the variables each evaluation saw, recorded apart from the checkpointer.
    real_evaluate = trainer.evaluate

    def recording_evaluate(eval_step_fn, state, source):
        evaluated[int(state.step)] = jax.device_get({"params": state.params,
                                                     "batch_stats": state.batch_stats})
        return real_evaluate(eval_step_fn, state, source)

    monkeypatch.setattr(trainer, "evaluate", recording_evaluate)
    result = _train(tmp_path, checkpoint__keep=2, eval__every_epochs=0.5)
    assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()) == [6, 8]
    best_steps = [int(s) for s in os.listdir(tmp_path / "best") if s.isdigit()]
    best_eval = max(result.eval_history, key=lambda r: r["eval_top1"])
    assert best_steps == [best_eval["step"]] and sorted(evaluated) == [3, 6, 8]
    # best/ holds the variables of the best evaluation's step, not those of another step.
    best_variables, _ = checkpointing.load_exported(str(tmp_path / "best"))
    _assert_bitwise_equal(best_variables, evaluated[best_eval["step"]])
    for step in set(evaluated) - {best_eval["step"]}:  # ...which differ from step to step.
        leaves = zip(jax.tree.leaves(best_variables), jax.tree.leaves(evaluated[step]), strict=True)
        assert any(not np.array_equal(x, y) for x, y in leaves), step


def test_exported_parameters_load_with_one_call_and_rebuild_the_model(tmp_path):
    result = _train(tmp_path)
    variables, config = checkpointing.load_exported(str(tmp_path))
    _assert_bitwise_equal(variables["params"], _params(result))
    model = models.model_from_config(config)
    logits = model.apply(variables, np.zeros((2, 32, 32, 3), np.float32), train=False)
    assert logits.shape == (2, 10)
    best_variables, _ = checkpointing.load_exported(str(tmp_path / "best"))
    assert set(best_variables) == {"params", "batch_stats"}


def test_a_checkpoint_written_on_8_devices_resumes_on_4(tmp_path):
    written = _train(tmp_path, training__num_train_steps=4)
    m = mesh.create_mesh(4)
    config = _config(mesh__num_devices=4)
    ckpt = checkpointing.Checkpointer(str(tmp_path), config)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=mesh.replicated_sharding(m)),
        written.state)
    state, meta = ckpt.restore_latest(abstract)
    ckpt.close()
    assert meta["step"] == 4 and len(jax.tree.leaves(state.params)[0].sharding.device_set) == 4
    _assert_bitwise_equal(jax.device_get(state.params), _params(written))
    resumed = _train(tmp_path, mesh__num_devices=4, training__num_train_steps=6)
    assert resumed.start_step == 4 and int(resumed.state.step) == 6


def test_a_corrupt_latest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    _train(tmp_path, training__num_train_steps=4)
    state_dir = tmp_path / "checkpoints" / "4" / "state"
    for path in state_dir.rglob("*"):
        if path.is_file():
            path.write_bytes(b"garbage")
    (tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1").mkdir()  # A save cut short.
    with caplog.at_level("WARNING"):
        resumed = _train(tmp_path, training__num_train_steps=6)
    assert resumed.start_step == 2
    assert "Skipping checkpoint" in caplog.text and "/4" in caplog.text


def test_when_no_checkpoint_can_be_read_the_run_refuses_to_start_from_scratch(tmp_path):
    _train(tmp_path, training__num_train_steps=4, checkpoint__keep=5)
    for path in (tmp_path / "checkpoints").rglob("*"):
        if path.is_file() and "state" in path.parts:
            path.write_bytes(b"garbage")
    for _ in range(2):  # The next identical command refuses too: it never trains from step 0 silently.
        with pytest.raises(checkpointing.UnreadableCheckpointsError,
                           match=r"2 unreadable one\(s\) are in .*unreadable_checkpoints.*from_scratch"):
            _train(tmp_path, training__num_train_steps=4)
    restarted = _train(tmp_path, training__num_train_steps=4, checkpoint__restart_from_scratch=True)
    assert restarted.start_step == 0 and int(restarted.state.step) == 4


def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(tmp_path):
    _train(tmp_path, training__num_train_steps=2)
    with pytest.raises(checkpointing.IncompatibleCheckpointError,
                       match=r"model.num_filters: checkpoint 8, config 16.*--workdir"):
        _train(tmp_path, model__num_filters=16)


def test_a_diverging_run_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # 96 examples at batch 16: 6 steps per epoch. The learning rate jumps 1e30-fold after step 4.
    overrides = {"schedule__name": "piecewise", "schedule__boundary_epochs": (4 / 6,),
                 "schedule__decay_factor": 1e30, "training__log_every_steps": 3,
                 "training__num_train_steps": 12}
    with pytest.raises(trainer.DivergenceError,
                       match=r"loss is nan at step 6\. The newest sound checkpoint is step 4 "):
        _train(tmp_path, **overrides)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
    ckpt = checkpointing.Checkpointer(str(tmp_path), _config(**overrides))
    m = mesh.create_mesh(8)
    reference = _train(tmp_path / "fresh", training__num_train_steps=4).state
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=mesh.replicated_sharding(m)), reference)
    state, _ = ckpt.restore_latest(abstract)
    ckpt.close()
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


# ------------------------------------------------------------------ real processes


def _worker_command(workdir, overrides, **flags):
    command = [sys.executable, str(WORKER), f"--workdir={workdir}", f"--overrides={json.dumps(overrides)}"]
    return command + [f"--{k}={v}" if v != "" else f"--{k}" for k, v in flags.items()]


def _worker_env():
    return {**os.environ, "XLA_FLAGS": "", "PYTHONUNBUFFERED": "1"}


def _run_worker(workdir, overrides, **flags):
    proc = subprocess.run(_worker_command(workdir, overrides, **flags), env=_worker_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _committed_steps(checkpoints: pathlib.Path) -> list[int]:
    """Steps whose checkpoint is complete on disk.

    orbax (0.12) writes a save into `<step>.orbax-checkpoint-tmp*`, writes `commit_success.txt` into it when
    every item is written, then renames it to `<step>`: a digit-named directory is a committed one.
    """
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").is_file())


def _run_and_signal(workdir, overrides, at_step, sig, after_a_committed_checkpoint=False):
    """Starts a worker and sends `sig` at the first step it logs from `at_step` on (and, if asked, at which
    a checkpoint is committed: saves are asynchronous, so a logged save step proves nothing).

    Returns:
      (returncode, log, the committed steps seen before the signal was sent).
    """
    proc = subprocess.Popen(_worker_command(workdir, overrides), env=_worker_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, committed = [], []
    try:
        for line in proc.stdout:
            log.append(line)
            logged = re.match(r"step (\d+)/", line)
            if logged and int(logged.group(1)) >= at_step:
                committed = _committed_steps(workdir / "checkpoints")
                if committed or not after_a_committed_checkpoint:
                    proc.send_signal(sig)
                    break
        log.extend(proc.stdout)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(log), committed


KILL_OVERRIDES = {"schedule__name": "constant", "schedule__warmup_steps": 0, "checkpoint__enabled": True,
                  "training__num_train_steps": 60, "training__log_every_steps": 1,
                  "checkpoint__every_steps": 7}


def test_sigterm_and_sigkill_at_random_steps_then_resume_give_the_uninterrupted_parameters(tmp_path):
    _run_worker(tmp_path / "reference", KILL_OVERRIDES)
    reference, _ = checkpointing.load_exported(str(tmp_path / "reference"))
    rng = np.random.default_rng(2026)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # The signal is sent when the test reads a step's log line; a test process starved of CPU reads it
        # late, and the run may have reached its last step by then. Such a try cut nothing: try again.
        for attempt in range(3):
            workdir = tmp_path / f"{sig.name}-{attempt}"
            at_step = int(rng.integers(9, 40))
            returncode, log, committed = _run_and_signal(workdir, KILL_OVERRIDES, at_step, sig,
                                                         after_a_committed_checkpoint=sig == signal.SIGKILL)
            if "step 60/60" not in log:
                break
        else:
            pytest.fail(f"{sig.name} reached no run before its last step in 3 tries:\n{log[-2000:]}")
        if sig == signal.SIGTERM:
            assert returncode == 0 and "Preempted (SIGTERM) at step" in log, log[-2000:]
            stopped_at = int(log.split("Preempted (SIGTERM) at step ")[1].split(":")[0])
            assert stopped_at >= at_step and str(stopped_at) in os.listdir(workdir / "checkpoints")
        else:
            assert returncode == -signal.SIGKILL, log[-2000:]
            assert committed and "DONE" not in log, log[-2000:]
        resumed = _run_worker(workdir, KILL_OVERRIDES)
        start_step = int(resumed.stdout.split("start_step=")[1].split()[0])
        assert 0 < start_step < 60 and "step=60 " in resumed.stdout
        if sig == signal.SIGTERM:
            assert start_step == stopped_at
        else:  # The newest committed checkpoint: a multiple of 7, no older than those seen before the kill.
            assert start_step % 7 == 0 and start_step >= committed[-1], (start_step, committed)
        variables, _ = checkpointing.load_exported(str(workdir))
        _assert_bitwise_equal(variables["params"], reference["params"])
        _assert_bitwise_equal(variables["batch_stats"], reference["batch_stats"])


def _run_two_processes(workdir, overrides, **flags):
    # Each process writes to a file, not a pipe: the two are coupled by collectives, so one blocked on a
    # full pipe that nobody reads yet would stall the other too.
    logs = [workdir.parent / f"{workdir.name}-process{i}.log" for i in range(2)]
    workdir.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    # The coordinator's port stays held until both processes end, so that nothing else takes it first;
    # process 0's coordinator binds beside the held socket on the loopback interface (as launch/local.py).
    with held_port(share_with_coordinator=True) as port:
        coordinator = f"127.0.0.1:{port}"
        env = {**_worker_env(), "JAX_COORDINATOR_BIND_ADDRESS": coordinator}
        for i, log in enumerate(logs):
            with open(log, "w") as out:
                procs.append(subprocess.Popen(
                    _worker_command(workdir, overrides, num_cpu_devices=2, num_processes=2, process_id=i,
                                    coordinator=coordinator, **flags),
                    env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True))
        try:
            for proc in procs:
                proc.wait(timeout=240)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    outputs = [log.read_text() for log in logs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]
    return outputs


def test_two_processes_save_and_restore_to_the_uninterrupted_parameters(tmp_path):
    overrides = {"schedule__name": "constant", "schedule__warmup_steps": 0, "checkpoint__enabled": True,
                 "checkpoint__every_steps": 2, "data__shuffle": False}
    _run_two_processes(tmp_path / "reference", {**overrides, "training__num_train_steps": 6})
    outputs = _run_two_processes(tmp_path / "run", {**overrides, "training__num_train_steps": 3})
    assert all("step=3 " in out for out in outputs)
    outputs = _run_two_processes(tmp_path / "run", {**overrides, "training__num_train_steps": 6})
    assert all("start_step=3 step=6 " in out for out in outputs)
    reference, _ = checkpointing.load_exported(str(tmp_path / "reference"))
    resumed, _ = checkpointing.load_exported(str(tmp_path / "run"))
    _assert_bitwise_equal(resumed["params"], reference["params"])
    shutil.rmtree(tmp_path)


def test_a_non_finite_state_never_enters_best_or_export(tmp_path):
    from resnet_scaling import training_setup

    config = tiny_config(checkpoint__enabled=True, checkpoint__async_save=False)
    state = training_setup.setup(config, arrays=random_arrays()).state
    nan_state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    checkpointer = checkpointing.Checkpointer(str(tmp_path), config)
    try:
        checkpointer.save_best(1, nan_state, {"eval_top1": 0.5, "eval_loss": float("nan")})
        with pytest.raises(FloatingPointError, match="not exporting"):
            checkpointer.export(nan_state)
        checkpointer.save_best(2, state, {"eval_top1": 0.1, "eval_loss": 2.3})  # A finite one is kept.
    finally:
        checkpointer.close()
    assert sorted(p.name for p in (tmp_path / "best").iterdir() if p.name.isdigit()) == ["2"]
    assert not (tmp_path / "export").exists()


def test_two_processes_evaluate_keep_the_best_and_checkpoint_on_the_same_steps(tmp_path):
    # Every step evaluates, saves best/ and saves a checkpoint, all asynchronously: 8 coinciding saves of
    # two managers per run. Barriers of one manager must never be taken for the other's.
    overrides = {"checkpoint__enabled": True, "checkpoint__every_steps": 1, "checkpoint__async_save": True,
                 "eval__every_steps": 1, "training__num_train_steps": 8}
    outputs = _run_two_processes(tmp_path / "run", overrides, best_every_eval="")
    assert all("step=8 " in out for out in outputs)
    assert sorted(p.name for p in (tmp_path / "run" / "best").iterdir() if p.name.isdigit()) == ["8"]
    assert "8" in os.listdir(tmp_path / "run" / "checkpoints")
