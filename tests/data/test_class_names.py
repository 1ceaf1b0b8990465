"""Class names travel with the weights: each source names its labels (class folders, the demo's shapes, a
TFDS dataset, arrays given names; synthetic data none), a run saves them with its export and beside its
checkpoints, and the predictor names its predictions.

The oracles are the names the tests wrote: folder names sorted (ImageFolder's numbering), a TFDS
dataset's declared label names, the list given for arrays.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from resnet_scaling import checkpointing, data
from resnet_scaling import config as config_lib
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.inference.evaluation import evaluate_workdir
from resnet_scaling.inference.predict import Predictor
from resnet_scaling.job import mesh
from resnet_scaling.training import trainer
from tests.helpers import data_source, random_arrays, tiny_config
from tests.image_files import encode

# Created in this order; numbered in sorted order (apple 0, mango 1, zebra 2), so the two orders differ.
FRUITS = {"zebra": (200, 40, 40), "apple": (40, 200, 40), "mango": (40, 40, 200)}
# The demo's classes in label order: its shapes are written as class folders, numbered in sorted order.
DEMO_CLASS_NAMES = ["checkerboard", "diagonal_stripes", "disc", "dots", "horizontal_stripes", "plus", "ring",
                    "square", "triangle", "vertical_stripes"]


def _coloured(colour, n, seed):
    """`n` 32x32 images of one colour with noise."""
    noise = np.random.default_rng(seed).integers(-40, 41, (n, 32, 32, 3))
    return np.clip(np.asarray(colour) + noise, 0, 255).astype(np.uint8)


def _write_fruit_folders(root):
    for split, per_class in (("train", 8), ("val", 4)):
        for seed, (name, colour) in enumerate(FRUITS.items()):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i, image in enumerate(_coloured(colour, per_class, seed=seed + 10 * (split == "val"))):
                (folder / f"{i}.jpg").write_bytes(encode(image))


@pytest.fixture(scope="module")
def fruit_run(tmp_path_factory):
    """A finished run on three class folders of colours: learnt, then evaluated and checkpointed once, at the
    end (the best evaluation's checkpoint is that one)."""
    root = tmp_path_factory.mktemp("fruits")
    _write_fruit_folders(root / "data")
    workdir = root / "run"
    config = tiny_config(data__source="folders", data__folder=str(root / "data"), model__num_classes=3,
                         training__global_batch_size=8, eval__global_batch_size=8,
                         training__num_train_steps=15, optimizer__lr_scaling="none",
                         optimizer__base_learning_rate=0.1, data__eval_resize_size=32, eval__every_epochs=0,
                         checkpoint__enabled=True, checkpoint__every_steps=0, checkpoint__async_save=False)
    config.data.num_threads = 1
    result = trainer.train_and_evaluate(config, str(workdir))
    return workdir, result


def test_a_folder_run_names_its_predictions_after_its_folders(fruit_run):
    workdir, result = fruit_run
    expected = sorted(FRUITS)  # ["apple", "mango", "zebra"]
    predictor = Predictor.from_workdir(str(workdir))
    assert predictor.class_names == expected
    images = np.concatenate([_coloured(colour, 2, seed=99) for colour in FRUITS.values()])
    classes = predictor.predict_classes(images)
    labels = predictor.predict_labels(images)
    assert labels == [expected[c] for c in classes]
    # Learnt (chance is 1/3), so each colour's prediction is named after the folder of that colour.
    assert result.eval_history[-1]["eval_top1"] == 1.0
    assert labels == [name for name in FRUITS for _ in range(2)]
    _, top = predictor.top_k(images, k=2)
    assert predictor.names_of(top).tolist() == [[expected[c] for c in row] for row in top]
    # The best evaluation's checkpoint is named too, from the workdir (its checkpoints hold no copy).
    assert Predictor.from_workdir(str(workdir), weights="best").class_names == expected
    assert not any((workdir / "checkpoints").rglob(checkpointing.CLASS_NAMES_FILENAME))


def test_evaluating_a_folder_run_again_reads_and_names_its_evaluation_split_alone(fruit_run, caplog):
    """`evaluate`'s "Input:" line names the images it reads, not the training set it does not."""
    workdir, result = fruit_run
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        evaluation = evaluate_workdir(str(workdir), write=False)
    assert evaluation["eval_count"] == 12 and evaluation["eval_top1"] == result.eval_history[-1]["eval_top1"]
    assert [m for m in caplog.messages if m.startswith("Input:")] == [
        f"Input: class folders in {workdir.parent / 'data'}: 12 evaluation images; process 0 of 1 reads 12."]


def test_a_copied_export_keeps_its_names_and_an_older_one_has_none(fruit_run, tmp_path):
    workdir, _ = fruit_run
    copy = tmp_path / "elsewhere" / "export"
    shutil.copytree(workdir / "export", copy)
    assert json.loads((copy / "class_names.json").read_text()) == sorted(FRUITS)
    saved = checkpointing.load_saved_weights(str(copy))
    assert saved.class_names == sorted(FRUITS) and saved.step is None
    assert Predictor.from_workdir(str(copy)).class_names == sorted(FRUITS)
    # An export written before names were saved loads as before, its predictions unnamed.
    (copy / "class_names.json").unlink()
    predictor = Predictor.from_workdir(str(copy))
    assert predictor.class_names is None
    images = _coloured(FRUITS["apple"], 2, seed=5)
    assert predictor.predict_classes(images).shape == (2,)
    with pytest.raises(ValueError, match="named no classes.*use predict_classes"):
        predictor.predict_labels(images)


def test_an_array_run_keeps_the_names_it_was_given(tmp_path):
    names = ("cat", "dog", "ship", "car", "frog", "deer", "bird", "horse", "plane", "truck")
    config = tiny_config(data__class_names=names, training__num_train_steps=2, checkpoint__enabled=True,
                         checkpoint__async_save=False)
    trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    images = random_arrays(num_train=4)[0]
    for weights in ("export", "best"):
        predictor = Predictor.from_workdir(str(tmp_path), weights=weights)
        assert predictor.class_names == list(names)
        assert predictor.predict_labels(images) == [names[c] for c in predictor.predict_classes(images)]
    # Arrays without names: predictions are unnamed, and the predictor says where names would come from.
    variables, config = checkpointing.load_exported(str(tmp_path))
    config.data.class_names = None
    unnamed = Predictor(variables, config)
    assert unnamed.class_names is None
    with pytest.raises(ValueError, match="config.data.class_names"):
        unnamed.names_of(np.array([0]))


def test_class_names_that_cannot_name_the_labels_are_refused():
    with pytest.raises(config_lib.ConfigError, match="class_names: holds 2 names for model.num_classes=10"):
        config_lib.validate(tiny_config(data__class_names=("a", "b")))
    with pytest.raises(config_lib.ConfigError, match="data.class_names: names the classes of the 'arrays'"):
        config_lib.validate(tiny_config(data__source="folders", data__folder="/data",
                                        data__class_names=tuple("abcdefghij")))
    train_x, train_y, eval_x, eval_y = random_arrays(num_train=8, num_eval=8, num_classes=3)
    # The source's own check, for code that builds it without a config.
    devices = mesh.create_mesh(8)
    config = tiny_config(training__global_batch_size=8, eval__global_batch_size=8)
    batch = plan_lib.batch_plan_for_mesh(config, devices)
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        data.ArraySource(train_x, train_y, eval_x, eval_y, batch=batch, mesh=devices,
                         num_classes=3, class_names=["a", "b"])
    source = data.ArraySource(train_x, train_y, eval_x, eval_y, batch=batch, mesh=devices,
                              class_names=("a", "b", "c"))
    assert source.class_names == ["a", "b", "c"]


def test_the_demo_shapes_are_named_by_their_folders_and_synthetic_data_is_not(tmp_path):
    config = tiny_config(data__source="shapes", data__cache_dir=str(tmp_path), data__num_train_examples=20,
                         data__num_eval_examples=10, data__eval_resize_size=32, training__global_batch_size=8,
                         eval__global_batch_size=8)
    config.data.num_threads = 1
    source = data_source(config, mesh.create_mesh(8))
    assert source.class_names == DEMO_CLASS_NAMES
    (root,) = tmp_path.iterdir()
    assert sorted(os.listdir(root / "train")) == DEMO_CLASS_NAMES
    synthetic = tiny_config(data__source="synthetic", data__num_train_examples=16, data__num_eval_examples=16)
    assert data_source(synthetic, mesh.create_mesh(8)).class_names is None


class ClassNamesTestFruits(tfds.core.GeneratorBasedBuilder):
    """A tiny TFDS image dataset whose labels are declared names, in an order that is not sorted."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(32, 32, 3)),
            "label": tfds.features.ClassLabel(names=list(FRUITS))}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(8), "test": self._generate_examples(4)}

    def _generate_examples(self, n):
        for i in range(n):
            label = i % len(FRUITS)
            yield i, {"image": _coloured(list(FRUITS.values())[label], 1, seed=i)[0], "label": label}


def test_a_tfds_source_takes_the_datasets_label_names(tmp_path):
    ClassNamesTestFruits(data_dir=str(tmp_path)).download_and_prepare()
    config = tiny_config(data__source="tfds", data__dataset="class_names_test_fruits",
                         data__data_dir=str(tmp_path), data__eval_split="test", model__num_classes=3,
                         data__eval_resize_size=32, training__global_batch_size=8, eval__global_batch_size=8)
    config.data.num_threads = 1
    source = data_source(config, mesh.create_mesh(8))
    assert source.class_names == ["zebra", "apple", "mango"]  # As declared: TFDS numbers them in this order.
