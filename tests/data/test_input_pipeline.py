"""The tf.data pipeline on class folders and on imagenet2012 prepared by TFDS from ILSVRC-style tars:
per-process shares, epochs, restarts, determinism, exact evaluation, bad files and missing datasets."""

import dataclasses
import importlib.util
import itertools
import json
import logging
import os
import pathlib
import threading
import time

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from resnet_scaling import data
from resnet_scaling.checkpointing import preemption
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.data import pipeline, records, tfds_data
from resnet_scaling.job import mesh
from resnet_scaling.training import sections, trainer
from tests.helpers import data_source, tiny_config
from tests.image_files import encode, identity, with_identity, write_folders, write_ilsvrc_tars

# The first three ImageNet classes (TFDS numbers the synsets in labels.txt order).
SYNSETS = ("n01440764", "n01443537", "n01484850")


def _folder_config(root, **overrides):
    settings = {"data__source": "folders", "data__folder": str(root), "model__num_classes": 3,
                "training__global_batch_size": 8, "eval__global_batch_size": 8, **overrides}
    config = tiny_config(**settings)
    config.data.num_threads = 1  # Gentle on the 2-core CI machine.
    return config


@pytest.fixture
def folders(tmp_path):
    """24 training images (3 classes x 8) and 9 evaluation images, each a solid colour naming it."""
    write_folders(tmp_path, train_per_class=8, eval_per_class=3)
    return tmp_path


def _source(config, **kwargs):
    return data_source(config, mesh.create_mesh(8), **kwargs)


def _ids(batch):
    return [identity(image) for image in np.asarray(jax.device_get(batch["images"]))]


def _evaluated_ids(batches):
    """The identities of the real (unmasked) images of evaluation batches, in order."""
    return [i for b in batches for i, real in zip(_ids(b), np.asarray(jax.device_get(b["mask"])), strict=True)
            if real]


def test_folder_batches_are_uint8_with_the_folder_labels_and_every_image_once_per_epoch(folders):
    source = _source(_folder_config(folders))
    assert (source.num_train_examples, source.num_eval_examples) == (24, 9)
    stream = source.train_batches()
    batches = [next(stream) for _ in range(6)]  # Two epochs of 24.
    first = batches[0]
    assert first["images"].dtype == np.uint8 and first["images"].shape == (8, 32, 32, 3)
    assert first["images"].sharding.spec[0] == "data"
    ids = list(itertools.chain.from_iterable(_ids(b) for b in batches))
    labels = np.concatenate([np.asarray(b["labels"]) for b in batches])
    # Training images are 0..23, class c holding 8c..8c+7.
    np.testing.assert_array_equal(labels, np.asarray(ids) // 8)
    assert sorted(ids[:24]) == list(range(24)) and sorted(ids[24:]) == list(range(24))
    assert ids[:24] != ids[24:]  # Each epoch its own order.


def test_a_restarted_stream_continues_exactly_where_the_uninterrupted_one_is(folders):
    config = _folder_config(folders, training__global_batch_size=16)  # 1.5 batches per epoch.
    stream = _source(config).train_batches()
    uninterrupted = [np.asarray(next(stream)["images"]) for _ in range(5)]
    restarted = _source(config).train_batches(start_step=3)  # Mid-epoch, after a boundary.
    for expected in uninterrupted[3:]:
        np.testing.assert_array_equal(np.asarray(next(restarted)["images"]), expected)


@pytest.mark.slow
def test_a_preempted_run_on_image_files_resumes_to_the_same_state_bit_for_bit(folders, tmp_path, monkeypatch):
    """In process, with asynchronous saves (tests/checkpointing/test_checkpointing.py cuts the command
    line's runs, compiled as real runs compile): the input stream, the parameters, the BN statistics, the
    optimizer's momentum and the clocks all continue where the preempted run stopped."""
    settings = {"schedule__name": "constant", "schedule__warmup_steps": 0, "training__num_train_steps": 7,
                "checkpoint__export": False}  # 7 steps of 8 images: past two epochs of 24. No export: unread.
    config = _folder_config(folders, **settings, checkpoint__enabled=True, checkpoint__every_steps=4,
                            checkpoint__async_save=True)
    # The uninterrupted reference saves nothing: saving never changes the state a run trains.
    reference = jax.device_get(trainer.train_and_evaluate(_folder_config(folders, **settings),
                                                          str(tmp_path / "reference")).state)
    monkeypatch.setattr(preemption.PreemptionWatcher, "reached", lambda self, step: step == 5)
    first = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert first.preempted and int(first.state.step) == 5  # 40 images: mid-epoch, between two saves.
    checkpoints = tmp_path / "run" / "checkpoints"
    assert {"4", "5"} <= set(os.listdir(checkpoints)) and "6" not in os.listdir(checkpoints)
    first_meta = json.loads((checkpoints / "5" / "meta" / "metadata").read_text())
    monkeypatch.undo()
    resumed = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert resumed.start_step == 5 and not resumed.preempted and int(resumed.state.step) == 7
    resumed_state = jax.device_get(resumed.state)
    for part in ("params", "batch_stats", "opt_state"):
        resumed_leaves, reference_leaves = (jax.tree.leaves(getattr(s, part)) for s in (resumed_state,
                                                                                        reference))
        for x, y in zip(resumed_leaves, reference_leaves, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=part)
    assert jax.tree.leaves(reference.batch_stats) and jax.tree.leaves(reference.opt_state)
    # The clocks survive the restart: the resumed run's checkpoint counts both runs' training time.
    meta = json.loads((checkpoints / "7" / "meta" / "metadata").read_text())
    assert meta["clock"]["train_sec"] > first_meta["clock"]["train_sec"] > 0


def test_ending_a_stream_never_waits_for_the_deletion_of_its_tf_data_iterator(folders, monkeypatch):
    """Deleting a tf.data iterator waits for its autotuning thread, which can sleep up to a minute first
    (see pipeline._delete_iterator): the training stream, closed, and an evaluation, run to its end, hand
    their iterators to another thread to delete. Here each deletion blocks until the test releases it."""
    source = _source(_folder_config(folders))  # Set-up reads through iterators of its own, deleted at once.
    release, deleted_by = threading.Event(), []
    as_numpy_iterator = tf.data.Dataset.as_numpy_iterator

    class SlowToDelete:
        def __init__(self, dataset):
            self._iterator = as_numpy_iterator(dataset)

        def __iter__(self):
            return self

        def __next__(self):
            return next(self._iterator)

        def __del__(self):
            release.wait(timeout=30)
            deleted_by.append(threading.current_thread())

    monkeypatch.setattr(tf.data.Dataset, "as_numpy_iterator", lambda dataset: SlowToDelete(dataset))
    start = time.monotonic()
    stream = source.train_batches()
    next(stream)
    stream.close()
    assert len(list(source.eval_batches())) == 2  # 9 images in batches of 8.
    assert time.monotonic() - start < 20 and deleted_by == []  # Not deleted on this thread: not waited for.
    release.set()
    deadline = time.monotonic() + 30
    while len(deleted_by) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(deleted_by) == 2 and threading.main_thread() not in deleted_by  # Deleted, elsewhere.


def test_same_seed_same_batches_other_seed_other_batches(folders):
    def first_batches(seed):
        stream = _source(_folder_config(folders, seed=seed)).train_batches()
        return [np.asarray(next(stream)["images"]) for _ in range(3)]

    a, b, c = first_batches(0), first_batches(0), first_batches(1)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))


@pytest.mark.parametrize("process_count", [1, 2, 3])
def test_process_shares_are_disjoint_cover_the_split_and_evaluate_every_image_once(folders, process_count):
    config = _folder_config(folders)
    shares = [pipeline.record_shares(sections.read(config).data, p, process_count)
              for p in range(process_count)]

    def share_ids(share):
        return [identity(tf.io.decode_jpeg(image_bytes).numpy()) for image_bytes, _ in share.in_order()]

    for split, expected in (("train", range(24)), ("eval", range(24, 33))):
        ids = [share_ids(getattr(s, split)) for s in shares]
        assert sorted(itertools.chain.from_iterable(ids)) == list(expected)  # Disjoint and covering.
        assert max(map(len, ids)) - min(map(len, ids)) <= 1
    # Exact evaluation: every process runs the same number of batches, and over all processes the real
    # (unmasked) images are each evaluation image exactly once, by identity.
    evaluated, batch_counts = [], []
    for p, share in enumerate(shares):
        # One process's part of a job of `process_count` processes, each making 8 images per batch.
        batch = dataclasses.replace(plan_lib.batch_plan(config, 8), num_processes=process_count)
        source = pipeline.TFDataSource(
            share, preprocess=pipeline.preprocess_config(sections.read(config).data), batch=batch,
            mesh=mesh.create_mesh(8), process_index=p)
        batches = list(source.local_eval_batches())
        batch_counts.append(len(batches))
        evaluated += _evaluated_ids(batches)
        assert all(b["images"].shape == (8, 32, 32, 3) and b["images"].dtype == np.uint8 for b in batches)
    assert len(set(batch_counts)) == 1 and sorted(evaluated) == list(range(24, 33))


def test_undecodable_files_are_skipped_and_counted_and_awkward_ones_decode(folders, caplog):
    train_dir, val_dir = folders / "train" / "class_0", folders / "val" / "class_1"
    (train_dir / "truncated.JPEG").write_bytes(encode(with_identity(1))[:300])
    (train_dir / "garbage.jpg").write_bytes(os.urandom(2000))
    (train_dir / "cmyk.JPEG").write_bytes(encode(with_identity(33), mode="CMYK"))
    (train_dir / "grey.JPEG").write_bytes(encode(with_identity(34), mode="L"))
    (train_dir / "png.JPEG").write_bytes(encode(with_identity(35), fmt="PNG"))
    (train_dir / "notes.txt").write_text("not an image")
    (val_dir / "truncated.JPEG").write_bytes(encode(with_identity(1))[:300])
    source = _source(_folder_config(folders))
    assert source.num_train_examples == 29  # 24 + 5 image files; notes.txt is not one.
    stream = source.train_batches()
    with caplog.at_level(logging.WARNING):
        batches = [next(stream) for _ in range(27 // 8 * 2)]  # 27 decodable images per epoch.
    assert source.num_skipped_train >= 2
    assert "truncated.JPEG" in caplog.text and "garbage.jpg" in caplog.text
    ids = list(itertools.chain.from_iterable(_ids(b) for b in batches))
    assert {33, 35} <= set(ids)  # The CMYK and PNG images, with their colours.
    # 10 files, one undecodable: every decodable image once (identities 24..32).
    assert sorted(_evaluated_ids(source.eval_batches())) == list(range(24, 33))
    assert "Evaluation left out 1 undecodable" in caplog.text


def test_a_dataset_where_nothing_decodes_is_refused_at_start_up_naming_the_files(tmp_path):
    for split in ("train", "val"):
        for name, count in (("a", 3), ("b", 1)):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                (tmp_path / split / name / f"{i}.jpg").write_bytes(os.urandom(500))
    with pytest.raises(data.DataError, match=r"None of the 4 training images sampled .* could be decoded .*"
                                             r"(a/\d\.jpg|b/0\.jpg), .* and 1 more; remove or replace them"):
        _source(_folder_config(tmp_path, model__num_classes=2))


def _empty_files(folder, count):
    """`count` zero-byte .JPEG files that sort before write_folders' 0.JPEG, 1.JPEG, ..."""
    for i in range(count):
        (folder / f"+empty_{i}.JPEG").write_bytes(b"")
    assert sorted(os.listdir(folder))[0] == "+empty_0.JPEG"


def test_bad_files_sorting_first_do_not_condemn_a_dataset_whose_other_files_are_fine(tmp_path, caplog):
    # Nine empty files first in the evaluation split (what an interrupted copy leaves), 12 good ones after:
    # a probe of the first files alone refused this dataset.
    write_folders(tmp_path, train_per_class=8, eval_per_class=4)
    _empty_files(tmp_path / "val" / "class_0", 9)
    source = _source(_folder_config(tmp_path))
    with caplog.at_level(logging.WARNING):
        evaluated = _evaluated_ids(source.eval_batches())
    assert sorted(evaluated) == list(range(24, 36))  # Each of the 12 good images once.
    assert "Evaluation left out 9 undecodable image(s)" in caplog.text and "+empty_0.JPEG" in caplog.text


def test_a_dataset_most_of_whose_sample_is_bad_is_refused_naming_the_files(tmp_path):
    write_folders(tmp_path, train_per_class=8, eval_per_class=1)  # 3 good evaluation images.
    _empty_files(tmp_path / "val" / "class_0", 9)
    with pytest.raises(data.DataError) as error:
        _source(_folder_config(tmp_path))
    message = str(error.value)
    assert "Only 3 of the 12 evaluation images sampled" in message and "9 could not" in message
    assert "empty: 0 bytes" in message
    assert "+empty_0.JPEG" in message and "and 6 more" in message and "remove or replace them" in message
    assert "\n" not in message


@pytest.mark.parametrize("evaluation_only", [False, True])
def test_the_input_line_names_the_splits_its_reader_reads(folders, caplog, evaluation_only):
    """Training reads both splits; `evaluate` (evaluation_only) the evaluation split alone, and says so."""
    with caplog.at_level(logging.INFO, logger="resnet_scaling"):
        _source(_folder_config(folders), evaluation_only=evaluation_only)
    lines = [m for m in caplog.messages if m.startswith("Input:")]
    # write_folders: 3 classes of 8 training and 3 evaluation images.
    assert lines == [f"Input: class folders in {folders}: 9 evaluation images; process 0 of 1 reads 9."
                     if evaluation_only else
                     f"Input: class folders in {folders}: 24 training and 9 evaluation images; process 0 of "
                     "1 reads 24 and 9."]


def test_evaluation_names_the_images_it_left_out_once(folders, caplog):
    (folders / "val" / "class_1" / "truncated.JPEG").write_bytes(encode(with_identity(1))[:300])
    source = _source(_folder_config(folders))
    with caplog.at_level(logging.INFO):
        for _ in range(2):  # Two evaluations: the same file named once; every good image once in each.
            assert sorted(_evaluated_ids(source.eval_batches())) == list(range(24, 33))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "Evaluation left out 1 undecodable image(s) of this process's 10 (it covers 9)" in warnings[0]
    assert os.path.join("class_1", "truncated.JPEG") in warnings[0] and "remove or replace" in warnings[0]
    assert "the same 1 undecodable image(s) as before" in caplog.text


def test_each_undecodable_training_file_is_named_once_not_every_epoch(folders, caplog):
    train_dir = folders / "train" / "class_0"
    (train_dir / "truncated.JPEG").write_bytes(encode(with_identity(1))[:300])
    (train_dir / "garbage.jpg").write_bytes(os.urandom(2000))
    source = _source(_folder_config(folders))
    stream = source.train_batches()
    with caplog.at_level(logging.WARNING):
        for _ in range(12):  # 96 images: over three epochs of 24 decodable (26 files).
            next(stream)
    assert source.num_skipped_train >= 6  # Both files, every epoch.
    warnings = [r.getMessage() for r in caplog.records if "undecodable training" in r.getMessage()]
    for name in ("truncated.JPEG", "garbage.jpg"):
        assert sum(name in w for w in warnings) == 1, warnings
    assert all("remove or replace them" in w for w in warnings)


def test_a_training_class_folder_without_images_is_named(folders):
    (folders / "train" / "class_3").mkdir()
    (folders / "train" / "class_3" / "notes.txt").write_text("not an image")
    with pytest.raises(data.DataError, match=r"1 training class folder\(s\) hold no image files .*"
                                             r"train/class_3; add their images"):
        _source(_folder_config(folders, model__num_classes=4))


def test_classes_without_evaluation_images_are_named_in_a_warning(folders, caplog):
    for file in (folders / "val" / "class_2").iterdir():
        file.unlink()
    with caplog.at_level(logging.WARNING):
        source = _source(_folder_config(folders))
    assert source.num_eval_examples == 6
    assert "1 of 3 classes have no evaluation images" in caplog.text and ": class_2;" in caplog.text


def test_record_shares_name_each_record_by_its_storage_index_in_any_epoch(tmp_path):
    # Three TFRecord files; each record holds its own name, so a stream shows where its records are stored.
    pieces = []
    for f, (skip, take) in enumerate(((1, 4), (0, 3), (2, 5))):
        filename = str(tmp_path / f"shard-{f}.tfrecord")
        with tf.io.TFRecordWriter(filename) as writer:
            for r in range(skip + take):
                writer.write(f"record {r} of {filename}".encode())
        pieces.append((filename, skip, take))
    share = records.TFRecordShards(pieces, lambda s: (s, tf.constant(0, tf.int32)), seed=5, process_index=0,
                                   shuffle_buffer_size=4, cycle_length=2)
    stored = [bytes(b.numpy()).decode() for b, _ in share.in_order()]
    assert [share.name(i) for i in range(share.num_examples)] == stored
    for epoch in (0, 3):
        streamed = [bytes(b.numpy()).decode() for b, _ in share.epoch(tf.constant(epoch, tf.int64))]
        assert streamed != stored
        indices = share.storage_indices(epoch, np.arange(share.num_examples))
        assert [stored[i] for i in indices] == streamed
    sample = share.sample_indices(5)
    assert len(sample) == 5 and {share.name(i).split(" of ")[1] for i in sample} == {p[0] for p in pieces}
    read = {int(i): bytes(b).decode() for i, b, _ in share.records_at(sample).as_numpy_iterator()}
    assert read == {int(i): stored[i] for i in sample}
    paths = [tmp_path / f"file_{i}" for i in range(10)]
    for path in paths:
        path.write_bytes(b"")
    files = records.FileList([str(p) for p in paths], list(range(10)), seed=1, process_index=0)
    for epoch in (0, 1):
        order = [int(label) for _, label in files.epoch(tf.constant(epoch, tf.int64))]  # Labels: indices.
        np.testing.assert_array_equal(files.storage_indices(epoch, np.arange(10)), order)
        assert order != list(range(10))
    assert files.name(3) == str(paths[3])


def test_missing_or_malformed_folders_and_class_mismatch_say_what_to_fix(tmp_path, folders):
    with pytest.raises(data.DataError, match="No folder .*train"):
        _source(_folder_config(tmp_path / "nowhere"))
    with pytest.raises(data.DataError, match="num_classes=3"):
        _source(_folder_config(folders, model__num_classes=10))
    (folders / "val" / "class_9").mkdir()
    (folders / "val" / "class_9" / "x.jpg").write_bytes(encode(with_identity(0)))
    with pytest.raises(data.DataError, match="classes the training split lacks"):
        _source(_folder_config(folders))


# --- imagenet2012, prepared by TFDS's own builder from ILSVRC2012-style tars ---------------------------

@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    """imagenet2012 prepared offline: 3 classes x 5 training images, 10 validation images."""
    root = tmp_path_factory.mktemp("imagenet")
    write_ilsvrc_tars(root / "manual", SYNSETS, train_per_class=5, num_val=10)
    builder = tfds.builder("imagenet2012", data_dir=str(root / "tfds"))
    config = tfds.download.DownloadConfig(manual_dir=str(root / "manual"))
    builder.download_and_prepare(download_config=config)  # TFDS's own builder, offline.
    return str(root / "tfds")


def _imagenet_config(data_dir, **overrides):
    settings = {"data__source": "tfds", "data__dataset": "imagenet2012", "data__data_dir": data_dir,
                "model__num_classes": 1000, "training__global_batch_size": 8, "eval__global_batch_size": 8,
                **overrides}
    config = tiny_config(**settings)
    config.data.num_threads = 1
    return config


def test_imagenet2012_from_tars_trains_and_evaluates_every_validation_image_once(imagenet_dir):
    source = _source(_imagenet_config(imagenet_dir))
    assert (source.num_train_examples, source.num_eval_examples) == (15, 10)
    stream = source.train_batches()
    labels = np.concatenate([np.asarray(next(stream)["labels"]) for _ in range(4)])
    assert set(labels) == {0, 1, 2}  # The three synsets' indices in TFDS's labels.txt.
    evals = list(source.eval_batches())
    assert len(evals) == 2
    # The validation images are distinct random pixels: 10 distinct real images are each of them once.
    real = [image.tobytes() for b in evals
            for image in np.asarray(jax.device_get(b["images"]))[np.asarray(jax.device_get(b["mask"]))]]
    assert len(real) == len(set(real)) == 10
    names = tfds.builder("imagenet2012", data_dir=imagenet_dir).info.features["label"].names
    labels_file = os.path.join(os.path.dirname(tfds.__file__), "datasets/imagenet2012/validation_labels.txt")
    with open(labels_file) as f:
        expected = sorted(names.index(line.strip()) for line in itertools.islice(f, 10))
    got = np.concatenate([np.asarray(b["labels"])[np.asarray(b["mask"])] for b in evals])
    assert sorted(got) == expected


@pytest.mark.parametrize("process_count", [1, 2, 3])
def test_imagenet2012_shares_are_disjoint_and_cover_each_split(imagenet_dir, process_count):
    config = _imagenet_config(imagenet_dir)
    shares = [pipeline.record_shares(sections.read(config).data, p, process_count)
              for p in range(process_count)]
    for split, total in (("train", 15), ("eval", 10)):
        records = [[bytes(b.numpy()) for b, _ in getattr(s, split).in_order()] for s in shares]
        flat = list(itertools.chain.from_iterable(records))
        assert len(flat) == len(set(flat)) == total
        assert max(map(len, records)) - min(map(len, records)) <= 1
    # An epoch of the shuffled training share is a permutation of the share; epochs differ.
    train = shares[0].train
    epochs = [[bytes(b.numpy()) for b, _ in train.epoch(tf.constant(e, tf.int64))] for e in (0, 1)]
    in_order = [bytes(b.numpy()) for b, _ in train.in_order()]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(in_order)
    if process_count == 1:
        assert epochs[0] != epochs[1]


def test_an_unprepared_or_unknown_tfds_dataset_says_what_to_run(tmp_path):
    with pytest.raises(data.DataError, match=r"(?s)not prepared.*python -m resnet_scaling\.prepare "
                                             r"--dataset=imagenet2012 --manual_dir=<that folder> --data_dir"):
        _source(_imagenet_config(str(tmp_path)))
    with pytest.raises(data.DataError, match="no dataset 'no_such_dataset'"):
        tfds_data.open_builder("no_such_dataset", str(tmp_path))


def test_any_tfds_image_dataset_by_name_png_and_greyscale_included(tmp_path):
    # TFDS's offline test builder: 20 + 20 MNIST-shaped images stored as greyscale PNGs.
    tfds.testing.DummyMnist(data_dir=str(tmp_path)).download_and_prepare()
    config = _imagenet_config(str(tmp_path), data__dataset="dummy_mnist", data__eval_split="test",
                              model__num_classes=10)
    source = _source(config)
    assert (source.num_train_examples, source.num_eval_examples) == (20, 20)
    batch = next(source.train_batches())
    images = np.asarray(batch["images"])
    assert images.shape == (8, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(images[..., 0], images[..., 2])  # Grey, as RGB.
    assert sum(int(np.asarray(b["mask"]).sum()) for b in source.eval_batches()) == 20


def test_the_input_benchmark_times_every_variant_the_flax_example_included(tmp_path, monkeypatch):
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "input_pipeline.py"
    monkeypatch.syspath_prepend(str(path.parent))  # It imports harness.py from beside it.
    spec = importlib.util.spec_from_file_location("input_pipeline_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    jpeg = tf.constant(benchmark.make_jpegs(1, width=160, height=120)[0])
    flax_image = benchmark.flax_example_preprocess_for_train(jpeg)
    assert flax_image.dtype == tf.float32 and flax_image.shape == (224, 224, 3)
    # A tiny run of the real command, every variant and a `previous` copy of the library's preprocessing.
    previous = pathlib.Path(benchmark.preprocessing.__file__)
    result = benchmark.main(["--num_jpegs=2", "--width=160", "--height=120", "--images=4", "--batch_size=2",
                             "--repeats=2", f"--previous_file={previous}", f"--json_out={tmp_path}/ip.json"])
    assert set(result["images_per_sec"]) == set(benchmark.VARIANTS) | {"previous"}
    runs = {name: np.asarray(r) for name, r in result["runs"].items()}
    assert all(len(r) == 2 and min(r) > 0 for r in runs.values())
    # Each figure recomputed from the timed runs: images/sec the median of a variant's repeats, its speedup
    # the median of its per-repeat ratios to the flax example's run beside it (two repeats: their mean).
    for name, r in runs.items():
        assert result["images_per_sec"][name] == pytest.approx(np.median(r), rel=1e-12)
        assert result["speedup_over_flax_example"][name] == pytest.approx(
            np.mean(r / runs["flax_example"]), rel=1e-12)
    library_over_naive = np.median(runs["library"]) / np.median(runs["naive"])
    assert result["speedup_over_naive"] == pytest.approx(library_over_naive, rel=1e-12)
