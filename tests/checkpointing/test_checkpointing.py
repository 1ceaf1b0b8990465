"""Checkpoints: exact resume, SIGTERM and SIGKILL, resharding, corrupt and incompatible checkpoints,
the NaN guard, several processes, and the exported parameters."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from resnet_scaling import checkpointing
from resnet_scaling.checkpointing import divergence
from resnet_scaling.job import mesh
from resnet_scaling.training import trainer
from tests.helpers import (
    checkpointer_of,
    launch_xla_flags,
    model_of,
    random_arrays,
    tiny_config,
    users_compile,
)
from tests.worker_runs import committed_steps, compile_sec, run_and_signal

REPO = pathlib.Path(__file__).resolve().parents[2]


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


def test_the_last_k_checkpoints_and_the_best_evaluations_are_kept(tmp_path, monkeypatch):
    evaluated = {}  # step -> the variables each evaluation saw, recorded apart from the checkpointer.
    real_evaluate = trainer.evaluate

    def recording_evaluate(eval_step_fn, state, source, **options):
        evaluated[int(state.step)] = jax.device_get({"params": state.params,
                                                     "batch_stats": state.batch_stats})
        return real_evaluate(eval_step_fn, state, source, **options)

    monkeypatch.setattr(trainer, "evaluate", recording_evaluate)
    # Saves after steps 3, 6 and 8 (the evaluations) and 4: step 4 is neither among the last 2 nor evaluated.
    result = _train(tmp_path, checkpoint__keep=2, eval__every_epochs=0.5, checkpoint__every_steps=4)
    assert sorted(evaluated) == [3, 6, 8]
    # The best by top-1, the later of a tie (orbax's BestN keeps the last of equals).
    best_eval = max(reversed(result.eval_history), key=lambda r: r["eval_top1"])
    kept = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit())
    assert kept == sorted({6, 8, best_eval["step"]})
    assert checkpointing.best_step(str(tmp_path)) == best_eval["step"]
    # The best checkpoint holds the variables of the best evaluation's step, not those of another step.
    best_variables, _ = checkpointing.load_exported(str(checkpointing.best_weights(str(tmp_path))))
    _assert_bitwise_equal(best_variables, evaluated[best_eval["step"]])
    for step in set(evaluated) - {best_eval["step"]}:  # ...which differ from step to step.
        leaves = zip(jax.tree.leaves(best_variables), jax.tree.leaves(evaluated[step]), strict=True)
        assert any(not np.array_equal(x, y) for x, y in leaves), step


def _docs_comparison_block() -> str:
    text = (REPO / "docs" / "checkpoints.md").read_text()
    start = text.index("## Two runs, bit for bit")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


def test_exported_parameters_load_with_one_call_and_the_docs_comparison_says_whether_two_runs_are_equal(
        tmp_path, capsys):
    """The exported parameters load with one call and rebuild the model; docs/checkpoints.md's snippet, run
    as written: on the same tiny run made twice (whose orbax files differ in their bytes, as the page says),
    then on a run and one of its earlier checkpoints."""
    result = _train(tmp_path / "a", training__num_train_steps=4)
    variables, config = checkpointing.load_exported(str(tmp_path / "a"))
    _assert_bitwise_equal(variables["params"], _params(result))
    model = model_of(config)
    logits = model.apply(variables, np.zeros((2, 32, 32, 3), np.float32), train=False)
    assert logits.shape == (2, 10)
    # A checkpoint's parameters load the same way: the last is the final state's.
    last_variables, last_config = checkpointing.load_exported(str(tmp_path / "a" / "checkpoints" / "4"))
    _assert_bitwise_equal(last_variables, variables)
    assert last_config.to_dict() == config.to_dict()

    _train(tmp_path / "b", training__num_train_steps=4)
    files = [{p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name / "export").rglob("*")
              if p.is_file()} for name in ("a", "b")]
    assert files[0] != files[1]
    for other, expected in ((tmp_path / "b", "True"), (tmp_path / "a" / "checkpoints" / "2", "False")):
        block = _docs_comparison_block().replace("/tmp/run_a", str(tmp_path / "a"))
        exec(compile(block.replace("/tmp/run_b", str(other)), "docs/checkpoints.md", "exec"), {})  # noqa: S102
        assert capsys.readouterr().out.split() == [expected], other


def test_a_checkpoint_written_on_8_devices_resumes_on_4(tmp_path):
    written = _train(tmp_path, training__num_train_steps=4, checkpoint__every_steps=0)  # One save: step 4.
    m = mesh.create_mesh(4)
    config = _config(mesh__num_devices=4)
    ckpt = checkpointer_of(tmp_path, config)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=mesh.replicated_sharding(m)),
        written.state)
    state, meta = ckpt.restore_latest(abstract)
    ckpt.close()
    assert meta["step"] == 4 and len(jax.tree.leaves(state.params)[0].sharding.device_set) == 4
    _assert_bitwise_equal(jax.device_get(state.params), _params(written))
    resumed = _train(tmp_path, mesh__num_devices=4, training__num_train_steps=6, checkpoint__every_steps=0)
    assert resumed.start_step == 4 and int(resumed.state.step) == 6


def test_the_first_progress_line_after_a_resume_says_its_window_is_the_steps_since_the_resume(tmp_path,
                                                                                              caplog):
    """Progress every 3 steps, a resume at step 4: the line at step 6 averages steps 5 and 6 only (the
    uninterrupted run's averages 4 to 6), and says so; the next window is whole again."""
    # 8 steps, one record each; an oracle for the losses only, so it saves nothing. The other launches
    # save only where they end: each resume needs that checkpoint alone.
    per_step = _train(tmp_path / "reference", training__log_every_steps=1, checkpoint__enabled=False)
    loss_at = {r["step"]: r["loss"] for r in per_step.train_history}
    at_the_end = {"training__log_every_steps": 3, "checkpoint__every_steps": 0}
    _train(tmp_path / "run", **at_the_end, training__num_train_steps=4)
    with caplog.at_level("INFO", logger="resnet_scaling"):
        resumed = _train(tmp_path / "run", **at_the_end)
    assert resumed.start_step == 4
    records = {r["step"]: r for r in resumed.train_history}
    assert sorted(records) == [6, 8]
    assert records[6]["window_steps"] == 2 and records[6]["window_since_resume"] is True
    np.testing.assert_allclose(records[6]["loss"], np.mean([loss_at[5], loss_at[6]]), rtol=1e-6)
    assert records[8]["window_steps"] == 2 and "window_since_resume" not in records[8]
    lines = {int(m[1]): m[0] for m in re.finditer(r"step (\d+)/8 \(epoch.*", caplog.text)}
    assert lines[6].endswith("(means over the 2 steps since the resume)"), lines
    assert "since the resume" not in lines[8]
    # A resume where a window starts (step 6, windows of 3) cuts none.
    _train(tmp_path / "aligned", **at_the_end, training__num_train_steps=6)
    aligned = _train(tmp_path / "aligned", **at_the_end)
    assert [(r["step"], "window_since_resume" in r) for r in aligned.train_history] == [(8, False)]


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
    with pytest.raises(divergence.DivergenceError,
                       match=r"loss is nan at step 6\. The newest sound checkpoint is step 4 "):
        _train(tmp_path, **overrides)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
    ckpt = checkpointer_of(tmp_path, _config(**overrides))
    m = mesh.create_mesh(8)
    # The same run stopped after its 4 good steps (the schedule jumps only from step 4 on): the state the
    # last good checkpoint must hold.
    reference = _train(tmp_path / "fresh", **{**overrides, "training__num_train_steps": 4,
                                              "checkpoint__enabled": False}).state
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=mesh.replicated_sharding(m)), reference)
    state, meta = ckpt.restore_latest(abstract)
    ckpt.close()
    assert meta["step"] == int(state.step) == 4
    # Parameters, BN statistics and momentum, bit for bit: nothing of the diverged steps leaked in.
    _assert_bitwise_equal(jax.device_get(state), jax.device_get(reference))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


# ------------------------------------------------------------------ real processes


KILL_OVERRIDES = {"schedule__name": "constant", "schedule__warmup_steps": 0, "checkpoint__enabled": True,
                  "training__num_train_steps": 60, "training__log_every_steps": 1,
                  "checkpoint__every_steps": 7}


@pytest.mark.slow
def test_sigterm_and_sigkill_at_random_steps_then_resume_give_the_uninterrupted_parameters(tmp_path):
    """`python -m resnet_scaling.train`, as a user runs it, cut twice and resumed by the same command each
    time: a SIGTERM (a preemption: a clean exit with a checkpoint of the step it stopped at), then a SIGKILL
    of the resumed run (no warning: the newest committed checkpoint is used). The final parameters and
    batch-norm statistics equal those of the same command run without a cut, bit for bit. The launches share
    one persistent compilation cache, as restarts of a run share its workdir's: the first compiles the train
    step, the later ones load it."""
    config_file = tmp_path / "tiny_config.py"
    overrides = {**KILL_OVERRIDES, "data__source": "synthetic", "data__num_eval_examples": 32,
                 # A batch of its own for every step: a resume at the wrong position changes the result.
                 "data__synthetic_num_batches": 60,
                 # Shared by the launches: each after the first loads the compiled step, as a restart does.
                 "training__compilation_cache_dir": str(tmp_path / "compilation_cache")}
    config_file.write_text("from tests.helpers import tiny_config\n\n\n"
                           f"def get_config():\n    return tiny_config(**{overrides!r})\n")
    # One CPU device and a user's compile (the launches time it), as on a user's machine; the config file
    # imports tests/.
    env = {**users_compile(dict(os.environ)), "XLA_FLAGS": launch_xla_flags(), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}

    def command(workdir):
        return [sys.executable, "-m", "resnet_scaling.train", f"--config={config_file}",
                f"--workdir={workdir}"]

    def run_to_the_end(workdir):
        proc = subprocess.run(command(workdir), env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and "Done: step 60 of 60" in proc.stderr, proc.stderr[-3000:]
        return proc.stderr

    def resumed_at(log):
        resumed = re.search(r"Resumed from .* at step (\d+) \(epoch", log)
        assert resumed, log[-3000:]
        return int(resumed.group(1))

    first_compile_sec = compile_sec(run_to_the_end(tmp_path / "reference"))
    run, rng = tmp_path / "run", np.random.default_rng(2026)
    # A try whose run had gone past the chosen steps by the time the test saw a line (a test process starved
    # of CPU reads late) cuts too little: try again from the same state.
    for _ in range(3):
        shutil.rmtree(run, ignore_errors=True)
        returncode, log, reached, _ = run_and_signal(command(run), env, tmp_path / "sigterm.log",
                                                      run / "checkpoints", int(rng.integers(9, 30)),
                                                      signal.SIGTERM)
        if reached is not None and reached < 45:  # Leaves the resumed run a checkpoint of its own (49, 56).
            break
    else:
        pytest.fail(f"the SIGTERM came after step 45 in 3 tries:\n{log[-2000:]}")
    preempted = re.search(r"Preempted \(SIGTERM\) at step (\d+)", log)
    assert returncode == 0 and preempted and "Traceback" not in log, log[-3000:]
    stopped_at = int(preempted.group(1))
    # It logs every step, so it is never past the step after its newest line: the signal is acted on at
    # the end of the step it came in.
    assert reached <= stopped_at <= reached + 1, (reached, stopped_at)
    assert committed_steps(run / "checkpoints")[-1] == stopped_at

    shutil.copytree(run, tmp_path / "preempted")
    for attempt in range(3):
        if attempt:
            shutil.rmtree(run)
            shutil.copytree(tmp_path / "preempted", run)
        returncode, log, reached, committed = run_and_signal(
            command(run), env, tmp_path / "sigkill.log", run / "checkpoints",
            int(rng.integers(stopped_at + 1, 50)), signal.SIGKILL, newer_checkpoint_than=stopped_at)
        if reached is not None and reached < 60:
            break
    else:
        pytest.fail(f"the SIGKILL came after the last step in 3 tries:\n{log[-2000:]}")
    assert returncode == -signal.SIGKILL and resumed_at(log) == stopped_at, log[-3000:]

    last_launch = run_to_the_end(run)
    start_step = resumed_at(last_launch)
    # One program (an entry is KEY-cache; with a maximum cache size JAX keeps KEY-atime beside it), loaded by
    # the restart instead of compiled again.
    assert len(list((tmp_path / "compilation_cache").glob("jit_train_step-*-cache"))) == 1
    assert compile_sec(last_launch) < 0.5 * first_compile_sec, (first_compile_sec, last_launch[-3000:])
    # The newest committed checkpoint: one the killed run wrote (a multiple of 7), no older than those
    # committed when it was killed.
    assert start_step % 7 == 0 and start_step >= committed[-1] > stopped_at, (start_step, committed)
    reference, _ = checkpointing.load_exported(str(tmp_path / "reference"))
    variables, _ = checkpointing.load_exported(str(run))
    assert jax.tree.leaves(reference["batch_stats"])  # resnet_tiny has batch norm: a comparison, not a no-op.
    _assert_bitwise_equal(variables["params"], reference["params"])
    _assert_bitwise_equal(variables["batch_stats"], reference["batch_stats"])


def test_the_best_evaluation_outlives_relaunches_and_a_non_finite_one_is_never_best(tmp_path):
    from resnet_scaling.training import training_setup

    config = tiny_config(checkpoint__enabled=True, checkpoint__async_save=False, checkpoint__keep=2)
    state = training_setup.setup(config, arrays=random_arrays()).state

    def launch(saves):  # A new Checkpointer each time, as a relaunch makes.
        checkpointer = checkpointer_of(tmp_path, config)
        try:
            for step, metrics in saves:
                checkpointer.save(step, state.replace(step=step), {}, metrics)
        finally:
            checkpointer.close()
        return sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())

    best = {"eval_top1": 0.5, "eval_loss": 1.0}
    nan_loss = {"eval_top1": 0.9, "eval_loss": float("nan")}  # The highest top-1, from a diverged state.
    assert launch([(1, None), (2, best), (3, None), (4, nan_loss)]) == [2, 3, 4]
    assert launch([(5, None), (6, {"eval_top1": 0.4, "eval_loss": 0.5}), (7, None)]) == [2, 6, 7]
    assert checkpointing.best_step(str(tmp_path)) == 2
    assert launch([(8, {"eval_top1": 0.5, "eval_loss": 0.9})]) == [7, 8]  # A tie: the later is kept.
    assert checkpointing.best_step(str(tmp_path)) == 8


def test_a_non_finite_state_is_never_exported(tmp_path):
    from resnet_scaling.training import training_setup

    config = tiny_config(checkpoint__enabled=True, checkpoint__async_save=False)
    state = training_setup.setup(config, arrays=random_arrays()).state
    nan_state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    checkpointer = checkpointer_of(tmp_path, config)
    try:
        with pytest.raises(FloatingPointError, match="not exporting"):
            checkpointer.export(nan_state)
    finally:
        checkpointer.close()
    assert not (tmp_path / "export").exists()


def test_a_replicated_array_is_split_over_the_replicas_only_in_slices_of_a_mebibyte_or_more(tmp_path):
    """orbax writes an array every replica holds in one slice per replica; a BN vector over 8 replicas
    would be 8 slices of 8 values. The checkpointer writes arrays whole below 1 MiB a slice."""
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("data",)),
                                            jax.sharding.PartitionSpec())
    state = {"bn_scale": jax.device_put(np.ones(64, np.float32), replicated),
             # 8 MiB over 8 replicas: a MiB a slice.
             "kernel": jax.device_put(np.ones((2048, 1024), np.float32), replicated)}
    checkpointer = checkpointer_of(tmp_path, tiny_config(checkpoint__enabled=True))
    checkpointer.save(1, state, clock={})
    checkpointer.wait()
    checkpointer.close()
    saved = ocp.PyTreeCheckpointHandler().metadata(tmp_path / "checkpoints" / "1" / "state").tree
    assert saved["bn_scale"].storage.write_shape == (64,)
    assert saved["kernel"].storage.write_shape == (2048 // 8, 1024)
    # orbax's own handler splits the small one too: the size gate is what keeps it whole.
    ocp.PyTreeCheckpointer().save(tmp_path / "default", state)
    assert ocp.PyTreeCheckpointHandler().metadata(tmp_path / "default").tree["bn_scale"].storage.write_shape \
        == (64 // 8,)
