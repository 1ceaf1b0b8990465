"""Data sources: per-process shares, reproducible streams, restarts, exact evaluation, bad input."""

import itertools
import logging
import pathlib

import jax
import numpy as np
import pytest

from resnet_scaling import data
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.data import image_folders, shapes
from resnet_scaling.job import mesh
from tests.helpers import data_source, random_arrays, tiny_config
from tests.image_files import write_folders


@pytest.mark.parametrize("process_count", [1, 2, 3])
@pytest.mark.parametrize("num_examples", [0, 1, 10, 50_000, 1_281_167])
def test_process_shares_are_disjoint_and_cover_the_split(process_count, num_examples):
    shares = [data.process_share(num_examples, i, process_count) for i in range(process_count)]
    assert shares[0][0] == 0 and shares[-1][1] == num_examples
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shares))  # Consecutive: disjoint, no gaps.
    sizes = [stop - start for start, stop in shares]
    assert max(sizes) - min(sizes) <= 1


def _array_source(num_devices=8, **kwargs):
    train_x, train_y, eval_x, eval_y = random_arrays(num_train=40, num_eval=21)
    # Label each training image by its index, so batches say which examples they hold.
    train_y = np.arange(40, dtype=np.int32)
    kwargs = {"seed": 3, **kwargs}
    batch = plan_lib.batch_plan(tiny_config(training__global_batch_size=16, eval__global_batch_size=8),
                                num_devices)
    return data.ArraySource(train_x, train_y, eval_x, eval_y, batch=batch, mesh=mesh.create_mesh(num_devices),
                            **kwargs)


def _labels(batch):
    return np.asarray(jax.device_get(batch["labels"]))


def test_training_stream_visits_every_example_once_per_epoch():
    stream = _array_source().train_batches()
    seen = np.concatenate([_labels(next(stream)) for _ in range(5)])  # 80 = two epochs of 40.
    assert sorted(seen[:40]) == list(range(40))
    assert sorted(seen[40:]) == list(range(40))
    assert not np.array_equal(seen[:40], seen[40:])  # A fresh order each epoch.


def test_training_stream_is_reproducible_and_restarts_at_any_step_without_replay():
    reference = [_labels(b) for b in itertools.islice(_array_source().train_batches(), 7)]
    again = [_labels(b) for b in itertools.islice(_array_source().train_batches(), 7)]
    np.testing.assert_array_equal(again, reference)
    for start in (1, 2, 5):
        resumed = [_labels(b) for b in itertools.islice(_array_source().train_batches(start), 7 - start)]
        np.testing.assert_array_equal(resumed, reference[start:])
    other_seed = [_labels(b) for b in itertools.islice(_array_source(seed=4).train_batches(), 7)]
    assert not np.array_equal(other_seed, reference)


def test_batches_are_global_uint8_arrays_sharded_over_the_mesh():
    source = _array_source()
    batch = next(source.train_batches())
    assert batch["images"].dtype == np.uint8 and batch["images"].shape == (16, 32, 32, 3)
    assert batch["labels"].dtype == np.int32
    assert len(batch["images"].sharding.device_set) == 8
    assert batch["images"].addressable_shards[0].data.shape == (2, 32, 32, 3)


@pytest.mark.parametrize("num_devices", [1, 8])
def test_evaluation_sees_every_example_exactly_once_by_identity(num_devices):
    source = _array_source(num_devices=num_devices)
    _, _, eval_x, eval_y = random_arrays(num_train=40, num_eval=21)
    assert len({image.tobytes() for image in eval_x}) == 21  # Random pixels: each image its own identity.
    images, labels, masks = [], [], []
    for batch in source.eval_batches():
        images.append(np.asarray(jax.device_get(batch["images"])))
        labels.append(_labels(batch))
        masks.append(np.asarray(jax.device_get(batch["mask"])))
    images, labels, masks = np.concatenate(images), np.concatenate(labels), np.concatenate(masks)
    assert masks.sum() == 21 == source.num_eval_examples  # 3 batches of 8, the last padded by 3.
    # The real (unmasked) examples are the evaluation split itself, each once and in its order.
    np.testing.assert_array_equal(images[masks], eval_x)
    np.testing.assert_array_equal(labels[masks], eval_y)


def test_array_source_refuses_bad_arrays_with_a_message():
    train_x, train_y, eval_x, eval_y = random_arrays()
    kwargs = {"batch": plan_lib.batch_plan(tiny_config(), 8), "mesh": mesh.create_mesh(8)}
    with pytest.raises(ValueError, match="uint8"):
        data.ArraySource(train_x.astype(np.float32), train_y, eval_x, eval_y, **kwargs)
    with pytest.raises(ValueError, match="NHWC"):
        data.ArraySource(train_x[..., :1], train_y, eval_x, eval_y, **kwargs)
    with pytest.raises(ValueError, match="labels must be"):
        data.ArraySource(train_x, train_y[:-1], eval_x, eval_y, **kwargs)
    with pytest.raises(ValueError, match="num_classes"):
        data.ArraySource(train_x, train_y + 5, eval_x, eval_y, num_classes=10, **kwargs)


def test_arrays_source_without_arrays_says_how_to_pass_them():
    with pytest.raises(ValueError, match="arrays="):
        data_source(tiny_config(), mesh.create_mesh(8))


def test_synthetic_source_makes_sharded_batches_on_the_device_and_masks_eval():
    config = tiny_config(data__source="synthetic", data__num_eval_examples=20)
    source = data_source(config, mesh.create_mesh(8))
    stream = source.train_batches()
    first = next(stream)
    assert first["images"].dtype == np.uint8 and first["images"].shape == (16, 32, 32, 3)
    assert int(np.max(jax.device_get(first["labels"]))) < 10
    assert len(first["images"].sharding.device_set) == 8
    masks = [np.asarray(jax.device_get(b["mask"])) for b in source.eval_batches()]
    assert sum(m.sum() for m in masks) == 20 and len(masks) == 2


def test_synthetic_batches_are_distinct_and_compiled_once(caplog):
    # JAX names each program it compiles (log_compiles): the batch program's compiles are counted by its
    # name, whatever else this worker compiled before (the eager key ops, another test's threads).
    # An image size no other test uses, so that its batch program is not cached yet.
    config = tiny_config(data__source="synthetic", data__image_size=24)
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles(True):
        source = data_source(config, mesh.create_mesh(8))
    compiles = [m for m in caplog.messages if m.startswith("Compiling jit(_random_batch)")]
    assert len(compiles) == 1, compiles  # 4 batches made, one program: not one per batch.
    batches = [np.asarray(jax.device_get(b["images"])) for b in itertools.islice(source.train_batches(), 4)]
    assert all(not np.array_equal(a, b) for a, b in itertools.combinations(batches, 2))


def test_shapes_dataset_is_deterministic_balanced_and_varied():
    images, labels = shapes.make_shapes(200, image_size=32, seed=1)
    again, again_labels = shapes.make_shapes(200, image_size=32, seed=1)
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, again_labels)
    assert images.dtype == np.uint8 and images.shape == (200, 32, 32, 3)
    assert np.bincount(labels, minlength=shapes.NUM_CLASSES).tolist() == [20] * shapes.NUM_CLASSES
    other, _ = shapes.make_shapes(200, image_size=32, seed=2)
    assert not np.array_equal(images, other)
    # Each image shows contrast (a shape or texture), not a flat colour.
    assert (images.reshape(200, -1).std(axis=1) > 20).all()


def test_the_shapes_folder_is_written_once_saying_so_before_the_wait(tmp_path, caplog):
    """The demo's first run writes 14,000 JPEGs (half a minute): a line before, none on later runs."""
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        root = shapes.shapes_folder(str(tmp_path), num_train=30, num_eval=20)
    assert len(list(pathlib.Path(root).glob("*/*/*.jpg"))) == 50
    assert caplog.messages[0].startswith(f"Writing the demo dataset (50 JPEGs) to {root}, once; about ")
    assert len(caplog.messages) == 2 and caplog.messages[1].startswith("Wrote the demo dataset in ")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        assert shapes.shapes_folder(str(tmp_path), num_train=30, num_eval=20) == root
    assert caplog.messages == []


def test_a_split_without_any_image_names_its_empty_class_folders_and_the_files_it_ignored(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "train" / "cat" / "cat.webp").write_bytes(b"RIFF")
    with pytest.raises(data.DataError) as error:
        image_folders.list_class_folders(str(tmp_path / "train"))
    message = str(error.value)
    assert "no image files (.jpg, .jpeg, .png) in any of its 2 class folders" in message
    assert str(tmp_path / "train" / "cat") in message and str(tmp_path / "train" / "dog") in message
    assert "cat.webp) are ignored" in message and "\n" not in message


def test_empty_class_folders_are_listed_first_few_and_a_count(tmp_path):
    write_folders(tmp_path, num_classes=2, train_per_class=1, eval_per_class=1)
    for i in range(5):
        (tmp_path / "train" / f"empty_{i}").mkdir()
    with pytest.raises(data.DataError, match=r"5 training class folder\(s\) hold no image files .*empty_0, "
                                             r".*empty_1, .*empty_2 and 2 more; add their images"):
        image_folders.list_splits(str(tmp_path))
    assert image_folders.name_few(["a", "b"]) == "a, b"


def test_a_single_class_dataset_is_refused_in_one_line(tmp_path):
    # One class: every prediction is right, so a run would report 100% top-1 and "target reached".
    write_folders(tmp_path, num_classes=1, train_per_class=2, eval_per_class=1)
    with pytest.raises(data.DataError) as error:
        image_folders.list_splits(str(tmp_path))
    message = str(error.value)
    assert "holds 1 class folder(s)" in message and "at least 2 classes" in message and "\n" not in message
    write_folders(tmp_path, num_classes=2, train_per_class=2, eval_per_class=1)
    train, _ = image_folders.list_splits(str(tmp_path))
    assert len(train.class_names) == 2
