"""train_and_evaluate end to end: metric files, refusals, the command line's refusals (the whole demo runs
once, in test_console.py, which also trains from a config file with overrides)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from resnet_scaling.training import trainer
from tests.helpers import launch_xla_flags, model_of, random_arrays, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_metrics_are_written_as_json_lines_with_train_and_eval_records(tmp_path):
    config = tiny_config(training__tensorboard=True)
    config.eval.every_epochs = 0.5  # 64 examples, batch 16: an evaluation every 2 steps.
    result = trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_top1" in r]
    assert [r["step"] for r in train] == [2, 4]
    assert [r["step"] for r in evals] == [2, 4]
    assert {"loss", "top1", "top5", "learning_rate", "images_per_sec", "sec_per_step"} <= set(train[0])
    assert all(type(r["eval_count"]) is int and r["eval_count"] == 20 for r in evals)
    assert int(result.state.step) == 4
    assert (tmp_path / "tensorboard").is_dir()


def test_a_small_evaluation_set_is_one_padded_batch_and_its_metrics_are_exact(tmp_path, monkeypatch):
    """20 evaluation images, the default evaluation batch of 1,024, 8 devices: one batch of 24 (3 a device),
    and top-1 and loss those of the final parameters applied to the 20 images outside the library's step."""
    batch_sizes = []
    real_evaluate = trainer.evaluate

    def counting_evaluate(eval_step_fn, state, source, **options):
        batch_sizes.append([int(b["mask"].shape[0]) for b in source.eval_batches()])
        return real_evaluate(eval_step_fn, state, source, **options)

    monkeypatch.setattr(trainer, "evaluate", counting_evaluate)
    config = tiny_config(eval__global_batch_size=1024)
    arrays = random_arrays()
    result = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert batch_sizes == [[24]]  # One evaluation, at the end, in one batch.
    final = result.eval_history[-1]
    assert final["eval_count"] == 20
    _, _, eval_x, eval_y = arrays
    mean, std = np.asarray(config.data.mean_rgb), np.asarray(config.data.stddev_rgb)
    variables = {"params": result.state.params, "batch_stats": result.state.batch_stats}
    logits = np.asarray(model_of(config).apply(variables, (eval_x / 255.0 - mean) / std, train=False),
                        np.float64)
    assert final["eval_top1"] == np.mean(np.argmax(logits, -1) == eval_y)
    log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                       keepdims=True)) - logits.max(-1, keepdims=True)
    np.testing.assert_allclose(final["eval_loss"], -np.mean(log_probs[np.arange(20), eval_y]), rtol=1e-4)


def test_progress_comes_after_log_every_sec_whatever_the_step_interval_and_training_is_the_same(tmp_path):
    """Log points by time (here: after every step) besides those by steps (here: only the last) add
    records, and change nothing the run learns."""
    by_time = trainer.train_and_evaluate(
        tiny_config(training__log_every_steps=1000, training__log_every_sec=1e-9), str(tmp_path / "time"),
        arrays=random_arrays())
    by_steps = trainer.train_and_evaluate(
        tiny_config(training__log_every_steps=1000, training__log_every_sec=0.0), str(tmp_path / "steps"),
        arrays=random_arrays())
    assert [(r["step"], r["window_steps"]) for r in by_time.train_history] == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert [(r["step"], r["window_steps"]) for r in by_steps.train_history] == [(4, 4)]
    for a, b in zip(jax.tree.leaves(by_time.state.params), jax.tree.leaves(by_steps.state.params),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_non_finite_loss_stops_training_with_the_step(tmp_path):
    config = tiny_config(optimizer__base_learning_rate=1e30, optimizer__lr_scaling="none")
    config.schedule.warmup_steps = 0
    config.training.num_train_steps = 6
    # Checkpoints off (tiny_config): the one divergence branch without a checkpoint to name (the branches
    # with checkpoints: tests/checkpointing/test_checkpointing.py and tests/scenarios/test_faults.py).
    with pytest.raises(FloatingPointError, match=r"training loss is (nan|inf) at step \d+\. Checkpoints are "
                                                 r"off\. Lower the learning rate"):
        trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())


def test_arrays_of_another_image_size_than_the_config_are_refused(tmp_path):
    arrays = random_arrays(image_size=40)
    with pytest.raises(ValueError, match=r"images are 40x40 pixels but config.data.image_size is 32"):
        trainer.train_and_evaluate(tiny_config(), str(tmp_path), arrays=arrays)


def test_the_synthetic_path_trains_and_writes_tensorboard_without_tensorflow(tmp_path):
    # As on the GPU machine, which has no TensorFlow: model, step, metrics, TensorBoard's event file and
    # checkpoints must not need it.
    script = (
        "import sys\n"
        "for name in ('tensorflow', 'tensorflow_datasets'):\n"
        "    sys.modules[name] = None  # Importing it now fails as if it were not installed.\n"
        "import jax\n"
        "jax.config.update('jax_disable_most_optimizations', True)  # Compile fast, as conftest.py does.\n"
        "from resnet_scaling.training import trainer\n"
        "from tests.helpers import tiny_config\n"
        "config = tiny_config(data__source='synthetic', data__num_train_examples=64,\n"
        "                     data__num_eval_examples=16, training__num_train_steps=2,\n"
        "                     training__tensorboard=True, checkpoint__enabled=True)\n"
        f"result = trainer.train_and_evaluate(config, {str(tmp_path)!r})\n"
        "assert int(result.state.step) == 2\n"
        "assert sys.modules['tensorflow'] is None\n"
        "print('trained without tensorflow')\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": launch_xla_flags()}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "trained without tensorflow" in proc.stdout, proc.stderr[-3000:]
    assert "TensorBoard summaries off" not in proc.stderr, proc.stderr[-3000:]
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    assert events.stat().st_size > 0


def test_without_tensorboard_installed_the_run_says_so_and_writes_metrics_jsonl(tmp_path, monkeypatch,
                                                                              caplog):
    # Importing it now fails as if it were not installed, even where an earlier test imported it.
    loaded = [name for name in sys.modules if name.startswith("tensorboard.")]
    for name in ("tensorboard", *loaded):
        monkeypatch.setitem(sys.modules, name, None)
    trainer.train_and_evaluate(tiny_config(training__tensorboard=True), str(tmp_path), arrays=random_arrays())
    assert "TensorBoard summaries off" in caplog.text
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "metrics.jsonl").is_file()
