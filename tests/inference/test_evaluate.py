"""Evaluation-only runs (`evaluate.py`) and inference (`predict.py`) on a tiny model that has learnt.

One run on a learnable dataset (the class is the colour) is trained once for the module; its export/ and
its best evaluation's checkpoint are then evaluated again, on other meshes, from the command line and
through the predictor.
"""

import json
import logging
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from resnet_scaling import checkpointing
from resnet_scaling import config as config_lib
from resnet_scaling.inference.evaluation import evaluate_workdir
from resnet_scaling.inference.predict import Predictor
from resnet_scaling.training import trainer
from tests.helpers import launch_xla_flags, model_of, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[2]

# One colour per class, with noise: a tiny ResNet learns it in a dozen steps.
COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [120, 120, 120]])


def colour_arrays(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(COLOURS), n).astype(np.int32)
    noise = rng.integers(-40, 41, (n, 32, 32, 3))
    return np.clip(COLOURS[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8), labels


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run on colour arrays: 16 steps, an evaluation and a checkpoint every other epoch (8 steps:
    two, the best among them kept), the export."""
    workdir = tmp_path_factory.mktemp("colours")
    # 40 evaluation images at batch 16: the last of 3 batches is half padding.
    arrays = (*colour_arrays(64, seed=0), *colour_arrays(40, seed=1))
    config = tiny_config(model__num_classes=4, training__num_train_steps=16, optimizer__lr_scaling="none",
                         optimizer__base_learning_rate=0.1, eval__every_epochs=2.0, checkpoint__enabled=True,
                         checkpoint__every_steps=0, checkpoint__async_save=False)  # Saved at evaluations.
    result = trainer.train_and_evaluate(config, str(workdir), arrays=arrays)
    assert result.eval_history[-1]["eval_top1"] > 0.8  # Learnt: chance is 0.25.
    return workdir, arrays, result


def test_the_export_evaluates_to_the_trainers_final_evaluation_and_is_written(run):
    workdir, arrays, result = run
    final = result.eval_history[-1]
    evaluation = evaluate_workdir(str(workdir), arrays=arrays[2:])
    # The oracle: the exported model's class for each of the 40 images (no batches, no padding, no mask),
    # counted here against the labels.
    correct = int((Predictor.from_workdir(str(workdir)).predict_classes(arrays[2]) == arrays[3]).sum())
    assert evaluation["eval_top1"] == pytest.approx(correct / 40) and evaluation["eval_count"] == 40
    assert evaluation["eval_top1"] == final["eval_top1"]
    assert evaluation["eval_top5"] == final["eval_top5"]
    assert evaluation["eval_loss"] == pytest.approx(final["eval_loss"], rel=1e-5)
    assert evaluation["weights"] == "export" and evaluation["step"] is None
    written = json.loads((workdir / "eval_export_eval.json").read_text())
    assert evaluation["path"] == str(workdir / "eval_export_eval.json")
    assert {k: written[k] for k in ("eval_top1", "eval_count", "weights", "split")} == {
        "eval_top1": final["eval_top1"], "eval_count": 40, "weights": "export", "split": "eval"}


def test_best_evaluates_to_the_best_evaluation_of_the_run(run, caplog):
    workdir, arrays, result = run
    best = max(reversed(result.eval_history), key=lambda r: r["eval_top1"])  # The later of a tie.
    with caplog.at_level("WARNING"):
        evaluation = evaluate_workdir(str(workdir), "best", arrays=arrays, write=False)  # All four arrays.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # orbax's included.
    assert evaluation["step"] == best["step"]
    assert evaluation["eval_top1"] == best["eval_top1"] and evaluation["eval_count"] == 40
    # Its own loss (test_checkpointing.py checks the best checkpoint's variables against every evaluation's).
    assert evaluation["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-5)
    assert not (workdir / "eval_best_eval.json").exists()


def test_the_result_does_not_depend_on_the_devices_or_the_evaluation_batch(run):
    workdir, arrays, result = run
    # 3 devices (trained on 8), 12 images per batch (trained with 16), given as a command line would.
    evaluation = evaluate_workdir(str(workdir), arrays=arrays[2:], devices=jax.devices()[:3],
                                  overrides={"eval.global_batch_size": "12"}, write=False)
    assert evaluation["num_devices"] == 3 and evaluation["eval_count"] == 40
    assert evaluation["eval_top1"] == result.eval_history[-1]["eval_top1"]


def test_what_cannot_apply_is_refused_naming_the_field(run):
    workdir, arrays, _ = run
    with pytest.raises(config_lib.ConfigError, match=r"config.data.source.*arrays=\(eval_images"):
        evaluate_workdir(str(workdir))
    with pytest.raises(config_lib.ConfigError, match="config.data.eval_split: a split applies to TFDS"):
        evaluate_workdir(str(workdir), split="validation", arrays=arrays[2:])
    with pytest.raises(config_lib.ConfigError, match="config.model.num_filters: only existing data"):
        evaluate_workdir(str(workdir), arrays=arrays[2:], overrides={"model.num_filters": 16})
    with pytest.raises(config_lib.ConfigError, match="config.eval.global_batch_size: 'many'"):
        evaluate_workdir(str(workdir), arrays=arrays[2:], overrides={"eval.global_batch_size": "many"})
    with pytest.raises(FileNotFoundError, match="checkpoints/ folder: give the run's workdir"):
        evaluate_workdir(str(workdir / "checkpoints"), arrays=arrays[2:])


def test_the_predictor_normalises_as_training_did_and_raw_pixels_into_the_model_do_not(run):
    workdir, arrays, result = run
    images, labels = arrays[2:]
    predictor = Predictor.from_workdir(str(workdir))
    accuracy = float(np.mean(predictor.predict_classes(images) == labels))
    assert accuracy == result.eval_history[-1]["eval_top1"]
    # What the README's snippet did: the model's own apply on unnormalised pixels. It runs, and is wrong.
    variables, config = checkpointing.load_exported(str(workdir))
    raw_logits = model_of(config).apply(variables, images.astype(np.float32), train=False)
    raw_accuracy = float(np.mean(np.argmax(raw_logits, -1) == labels))
    assert raw_accuracy < accuracy - 0.4, (raw_accuracy, accuracy)

    # The logits are the model's on images normalised as training did, written apart here in NumPy:
    # (pixels / 255 - mean) / stddev per channel.
    logits = predictor(images)
    mean, stddev = (np.asarray(v, np.float32) for v in (config.data.mean_rgb, config.data.stddev_rgb))
    normalised = (images.astype(np.float32) / 255 - mean) / stddev
    model = model_of(config)
    np.testing.assert_allclose(logits, model.apply(variables, normalised, train=False), rtol=1e-4, atol=1e-4)

    # Any batch size, in chunks or not, gives each image the same logits (batch norm uses running averages).
    chunked = Predictor.from_workdir(str(workdir), batch_size=16)(images)  # Chunks of 16, 16 and 8.
    np.testing.assert_allclose(chunked, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(predictor(images[3:4]), logits[3:4], rtol=1e-5, atol=1e-5)
    assert predictor(images[:0]).shape == (0, 4)
    probabilities, classes = predictor.top_k(images, k=2)
    assert probabilities.shape == classes.shape == (40, 2)
    # Against a softmax and a sort written in NumPy.
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    softmax = exp / exp.sum(-1, keepdims=True)
    np.testing.assert_array_equal(classes, np.argsort(-logits, axis=-1, kind="stable")[:, :2])
    np.testing.assert_allclose(probabilities, np.take_along_axis(softmax, classes, -1), rtol=1e-5, atol=1e-7)

    # A run with per-device BN groups needs no device count here: inference has no groups.
    config.model.bn_group_size = 0
    np.testing.assert_allclose(Predictor(variables, config)(images), logits, rtol=1e-5, atol=1e-5)

    best = Predictor.from_workdir(str(workdir), weights="best")
    best_accuracy = float(np.mean(best.predict_classes(images) == labels))
    assert best_accuracy == max(r["eval_top1"] for r in result.eval_history)


def test_the_predictor_refuses_images_it_cannot_take(run):
    workdir, arrays, _ = run
    predictor = Predictor.from_workdir(str(workdir))
    images = arrays[2]
    with pytest.raises(ValueError, match="uint8.*got float32"):
        predictor(images.astype(np.float32) / 255)
    with pytest.raises(ValueError, match=r"image_size is 32\), got shape \(2, 40, 40, 3\)"):
        predictor(np.zeros((2, 40, 40, 3), np.uint8))
    with pytest.raises(ValueError, match=r"pass images\[None\]"):
        predictor(images[0])
    with pytest.raises(ValueError, match=r"got shape \(2, 32, 32\)"):
        predictor(images[:2, ..., 0])
    # The checkpoints/ folder given for its workdir: the error names the workdir to give instead.
    for weights in ("best", "export"):
        with pytest.raises(FileNotFoundError, match=re.escape(f"checkpoints/ folder: give the run's workdir "
                                                              f"({workdir})")):
            Predictor.from_workdir(str(workdir / "checkpoints"), weights=weights)
    with pytest.raises(FileNotFoundError, match="No workdir, export/ or checkpoint at .*/no-such-run"):
        Predictor.from_workdir(str(workdir / "no-such-run"))
    with pytest.raises(ValueError, match="weights must be one of export, best, got 'bset'"):
        checkpointing.load_exported(str(workdir), "bset")  # Not the export by default.


# ------------------------------------------------------------------ the command line


def _evaluate_command(*args):
    # One CPU device (the tests' 8 fake ones are dropped): the run trained on 8 evaluates the same on 1.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": launch_xla_flags(), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "resnet_scaling.evaluate", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_command_evaluates_a_synthetic_run_and_writes_its_json(tmp_path):
    config = tiny_config(data__source="synthetic", data__num_train_examples=64, data__num_eval_examples=20,
                         training__num_train_steps=2, checkpoint__enabled=True, checkpoint__keep_best=False,
                         checkpoint__async_save=False)
    result = trainer.train_and_evaluate(config, str(tmp_path))
    # As a run saved by an older version would be: without fields that the model and validation now read.
    saved = tmp_path / "export" / "config.json"
    old = json.loads(saved.read_text())
    del old["model"]["zero_init_last_bn_scale"], old["eval"]["target_top1"]
    saved.write_text(json.dumps(old))
    proc = _evaluate_command(f"--workdir={tmp_path}", "--verbosity=1")  # 1: debug lines, the memory's too.
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((tmp_path / "eval_export_eval.json").read_text())
    final = result.eval_history[-1]
    assert written["eval_count"] == 20 and written["num_devices"] == 1
    assert written["eval_top1"] == final["eval_top1"]
    assert "export parameters on eval: top-1" in proc.stdout and "over 20 images" in proc.stdout
    assert "eval_export_eval.json" in proc.stdout
    # On the CPU the evaluation step keeps the memory it frees, as training's does.
    assert "Host memory: what a step frees is kept for the next" in proc.stdout + proc.stderr
    # This run kept no best parameters (the workdir's own config.json is not taken for them).
    with pytest.raises(FileNotFoundError, match="no evaluated checkpoint.*--weights=export"):
        evaluate_workdir(str(tmp_path), "best")
    with pytest.raises(FileNotFoundError, match="has no evaluated checkpoint"):
        Predictor.from_workdir(str(tmp_path), weights="best")


def test_the_command_ends_in_one_error_line_without_export_or_for_an_arrays_run(tmp_path, run):
    proc = _evaluate_command(f"--workdir={tmp_path}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has no export/" in errors[0], proc.stderr[-3000:]

    proc = _evaluate_command(f"--workdir={run[0]}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "error: config.data.source: this run was trained on in-memory arrays" in proc.stderr
