"""The tf.data input pipeline: a process's record share -> decoded, augmented uint8 batches -> global arrays.

Training: an endless stream across epochs from `start_step`'s position, each image augmented with a seed
from its stream position, so a restarted run sees the same images, crops and flips. Evaluation: storage
order, the last batch padded and masked, the same batch count on every process. Undecodable images are
skipped, counted and named (a training file once, not every epoch); only a dataset where most of a sample
across each share fails is refused, at start-up.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Iterator

import jax
import numpy as np
import tensorflow as tf
from jax.sharding import Mesh

from resnet_scaling.config.plan import BatchPlan
from resnet_scaling.data import image_folders, preprocessing, records, shapes
from resnet_scaling.data.base import (
    MLPERF_CROP_AREA_RANGE,
    Batch,
    DataConfig,
    DataError,
    pad_batch,
    prefetch,
    process_share,
)
from resnet_scaling.data.records import RecordShare
from resnet_scaling.job import mesh as mesh_lib

logger = logging.getLogger(__name__)

# Past this, an epoch is far beyond any run; the training stream is endless in practice.
_MAX_EPOCHS = 1 << 40
# Preprocessing branches with tf ops (tf.cond, tf.switch_case) and on Python settings only, so the functions
# tf.data traces need no AutoGraph conversion; converting them cost ~1 s of every launch's start-up.
_graph_function = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True)
class Shares:
    """One process's record shares of the training and evaluation splits, and what they are part of."""

    train: RecordShare
    eval: RecordShare
    num_train_examples: int  # Whole split, all processes.
    num_eval_examples: int
    num_classes: int | None  # None where the dataset does not say.
    description: str  # For the start-up log line.
    class_names: list[str] | None = None  # Label i's name: a class folder's, a TFDS label's; None: unnamed.


def record_shares(data: DataConfig, process_index: int, process_count: int) -> Shares:
    """The shares process `process_index` of `process_count` reads, for the "tfds", "folders" and
    "shapes" sources; raises `DataError` for a missing, unprepared or malformed dataset."""
    if data.source == "tfds":
        from resnet_scaling.data import tfds_data  # Imports tensorflow_datasets.

        builder = tfds_data.open_builder(data.dataset, data.data_dir)
        train, evaluation = (
            tfds_data.record_share(
                builder, split, image_key=data.image_key, label_key=data.label_key,
                process_index=process_index, process_count=process_count, seed=data.seed,
                shuffle=shuffle, shuffle_buffer_size=data.shuffle_buffer_size,
                cycle_length=data.interleave_cycle_length)
            for split, shuffle in ((data.train_split, data.shuffle), (data.eval_split, False)))
        return Shares(train, evaluation, tfds_data.num_examples(builder, data.train_split),
                      tfds_data.num_examples(builder, data.eval_split),
                      tfds_data.num_classes(builder, data.label_key), f"TFDS {builder.info.full_name}",
                      tfds_data.class_names(builder, data.label_key))
    root = data.folder
    if data.source == "shapes":
        root = shapes.shapes_folder(data.cache_dir, num_train=data.num_train_examples,
                                    num_eval=data.num_eval_examples, image_size=data.image_size,
                                    seed=data.seed)
    elif data.source != "folders":
        raise ValueError(f"config.data.source {data.source!r} is not read through tf.data.")
    train_files, eval_files = image_folders.list_splits(root)
    # Listed class by class: permute once (the same on every process) so every share holds every class.
    permutation = np.random.default_rng(data.seed).permutation(len(train_files.paths))
    start, stop = process_share(len(permutation), process_index, process_count)
    mine = permutation[start:stop]
    train = records.FileList([train_files.paths[i] for i in mine], train_files.labels[mine],
                             seed=data.seed, process_index=process_index, shuffle=data.shuffle)
    start, stop = process_share(len(eval_files.paths), process_index, process_count)
    evaluation = records.FileList(eval_files.paths[start:stop], eval_files.labels[start:stop],
                                  seed=data.seed, process_index=process_index, shuffle=False)
    ignored = train_files.num_ignored + eval_files.num_ignored
    description = f"class folders in {root}" + (f" ({ignored} non-image files ignored)" if ignored else "")
    return Shares(train, evaluation, len(train_files.paths), len(eval_files.paths),
                  len(train_files.class_names), description, list(train_files.class_names))


def preprocess_config(data: DataConfig) -> preprocessing.PreprocessConfig:
    """The preprocessing settings of `data`; `data.mlperf_crop` crops `MLPERF_CROP_AREA_RANGE` instead."""
    return preprocessing.PreprocessConfig(
        image_size=data.image_size,
        crop_area_range=MLPERF_CROP_AREA_RANGE if data.mlperf_crop else tuple(data.crop_area_range),
        crop_aspect_range=tuple(data.crop_aspect_range), crop_attempts=data.crop_attempts,
        random_flip=data.random_flip, eval_resize_size=data.eval_resize_size,
        resize_method=data.resize_method)


def source_from_config(data: DataConfig, mesh: Mesh, batch: BatchPlan, *,
                       evaluation_only: bool = False) -> TFDataSource:
    """This process's tf.data source for the "tfds", "folders" and "shapes" sources; `evaluation_only`:
    its "Input:" line names the evaluation split alone (`evaluate` reads nothing else)."""
    index, count = jax.process_index(), jax.process_count()
    shares = record_shares(data, index, count)
    if shares.num_classes is not None and shares.num_classes != data.num_classes:
        raise DataError(f"The dataset has {shares.num_classes} classes but config.model.num_classes is "
                        f"{data.num_classes}; set --config.model.num_classes={shares.num_classes}.")
    if evaluation_only:
        logger.info("Input: %s: %d evaluation images; process %d of %d reads %d.", shares.description,
                    shares.num_eval_examples, index, count, shares.eval.num_examples)
    else:
        logger.info("Input: %s: %d training and %d evaluation images; process %d of %d reads %d and %d.",
                    shares.description, shares.num_train_examples, shares.num_eval_examples, index, count,
                    shares.train.num_examples, shares.eval.num_examples)
    return TFDataSource(
        shares, preprocess=preprocess_config(data), batch=batch, mesh=mesh,
        seed=data.seed, num_threads=data.num_threads, prefetch_batches=data.prefetch_batches,
        device_prefetch=data.device_prefetch)


class TFDataSource:
    """A `DataSource` fed by tf.data from a process's share of a training and an evaluation split."""

    def __init__(self, shares: Shares, *, preprocess: preprocessing.PreprocessConfig,
                 batch: BatchPlan, mesh: Mesh, seed: int = 0,
                 num_threads: int = 0, prefetch_batches: int = 2, device_prefetch: int = 2,
                 process_index: int | None = None):
        """
        Args:
          batch: the run's batch sizes; this process makes `per_process_batch_size` images per step.
          seed: seeds the augmentation (the shares' order has its own seed).
          num_threads: tf.data threads for this pipeline; 0 leaves the choice to tf.data.
          prefetch_batches: host batches decoded ahead.
          device_prefetch: batches placed on the devices ahead of the step that takes them.
          process_index: default JAX's; tests pass it, with a multi-process `batch`, to build its batches.
        """
        self.num_train_examples = shares.num_train_examples
        self.num_eval_examples = shares.num_eval_examples
        batch = batch.for_eval_set(self.num_eval_examples)
        self.class_names = shares.class_names
        self._train, self._eval = shares.train, shares.eval
        self._process_index = jax.process_index() if process_index is None else process_index
        self._process_count = batch.num_processes
        self._preprocess = preprocess
        self._mesh = mesh
        self._seed = seed
        self._num_threads = num_threads
        self._prefetch_batches = prefetch_batches
        self._device_prefetch = device_prefetch
        self._local_batch = batch.per_process_batch_size
        self._local_eval_batch = batch.eval_per_process_batch_size
        self._num_eval_batches = batch.eval_steps(self.num_eval_examples)  # The same on every process.
        self.num_skipped_train = 0  # Undecodable training images skipped so far by this process.
        self._named_train_skips: set[int] = set()  # Storage indices already named in a warning.
        self._named_eval_skips: tuple[int, ...] = ()  # The left-out images the last warning named.
        if self._train.num_examples == 0:
            raise DataError(f"Process {self._process_index} of {self._process_count} got no training "
                            "examples: the training split is smaller than the number of processes.")
        for name, share in (("training", self._train), ("evaluation", self._eval)):
            _check_decodable(name, share, preprocess)

    def _options(self) -> tf.data.Options:
        options = tf.data.Options()
        options.deterministic = True  # Same seed, same batches, whatever the thread timing.
        if self._num_threads > 0:
            options.threading.private_threadpool_size = self._num_threads
        return options

    def train_dataset(self, start_step: int = 0) -> tf.data.Dataset:
        """This process's training batches as tf.data: {images uint8, labels int32, index int64}."""
        per_epoch = self._train.num_examples
        position = start_step * self._local_batch
        first_epoch, offset = divmod(position, per_epoch)
        train, config = self._train, self._preprocess
        augment_seed = tf.constant([self._seed, self._process_index], tf.int64)

        def epoch_records(epoch):
            skip = tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), tf.constant(0, tf.int64))
            return train.epoch(epoch).skip(skip)

        @_graph_function
        def preprocess(index, record):
            image_bytes, label = record
            seed = tf.random.experimental.stateless_fold_in(augment_seed, index)
            image = preprocessing.preprocess_for_train(image_bytes, seed, config)
            return {"images": image, "labels": tf.cast(label, tf.int32), "index": index}

        ds = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS).flat_map(epoch_records)
        ds = ds.enumerate(start=position)
        ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.ignore_errors()  # Undecodable images; counted from the gaps in `index`.
        ds = ds.batch(self._local_batch, drop_remainder=True)
        return ds.prefetch(self._prefetch_batches).with_options(self._options())

    def eval_dataset(self) -> tf.data.Dataset:
        """This process's evaluation batches as tf.data, unpadded (the last one may be short)."""
        config = self._preprocess

        @_graph_function
        def preprocess(index, record):
            image_bytes, label = record
            image = preprocessing.preprocess_for_eval(image_bytes, config)
            return {"images": image, "labels": tf.cast(label, tf.int32), "index": index}

        ds = self._eval.in_order().enumerate()  # `index`: the storage index.
        ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.ignore_errors()  # Undecodable images; local_eval_batches names them from the gaps in `index`.
        ds = ds.batch(self._local_eval_batch)
        return ds.prefetch(self._prefetch_batches).with_options(self._options())

    def train_batches(self, start_step: int = 0) -> Iterator[Batch]:
        return prefetch(self._global_train_batches(start_step), self._device_prefetch)

    def _global_train_batches(self, start_step: int) -> Iterator[Batch]:
        per_epoch = self._train.num_examples
        expected = start_step * self._local_batch
        iterator = [self.train_dataset(start_step).as_numpy_iterator()]  # Deleted by _delete_iterator.
        try:
            for local in iterator[0]:
                index = local.pop("index")
                missing = np.setdiff1d(np.arange(expected, index[-1] + 1), index)
                if missing.size:
                    self._note_train_skips(missing, per_epoch)
                expected = int(index[-1]) + 1
                yield mesh_lib.host_local_to_global(local, self._mesh)
        finally:
            _delete_iterator(iterator)

    def _note_train_skips(self, positions: np.ndarray, per_epoch: int) -> None:
        """Counts skipped stream positions; warns once per file, naming those not named before."""
        self.num_skipped_train += positions.size
        epochs, offsets = np.divmod(positions, per_epoch)
        stored = np.concatenate([self._train.storage_indices(int(e), offsets[epochs == e])
                                 for e in np.unique(epochs)])
        new = [int(i) for i in np.unique(stored) if int(i) not in self._named_train_skips]
        if not new:
            return
        self._named_train_skips.update(new)
        logger.warning("Skipping %d undecodable training image(s): %s; remove or replace them (each is named "
                       "once: %d so far in this process, skipped silently in later epochs).", len(new),
                       image_folders.name_few(sorted(self._train.name(i) for i in new), 5),
                       len(self._named_train_skips))

    def eval_batches(self) -> Iterator[Batch]:
        for local in self.local_eval_batches():
            yield mesh_lib.host_local_to_global(local, self._mesh)

    def local_eval_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """This process's padded evaluation batches (NumPy, with `mask`), as many as every process runs."""
        b = self._local_eval_batch
        size = self._preprocess.image_size
        evaluated, num_batches = [], 0
        iterator = [self.eval_dataset().as_numpy_iterator()]  # Deleted by _delete_iterator.
        try:
            for local in iterator[0]:
                evaluated.append(local.pop("index"))
                num_batches += 1
                yield pad_batch(local, b)
        finally:
            _delete_iterator(iterator)
        for _ in range(self._num_eval_batches - num_batches):
            empty = {"images": np.zeros((0, size, size, 3), np.uint8), "labels": np.zeros((0,), np.int32)}
            yield pad_batch(empty, b)
        covered = np.concatenate(evaluated) if evaluated else np.zeros((0,), np.int64)
        left_out = np.setdiff1d(np.arange(self._eval.num_examples), covered)
        if left_out.size:
            self._note_eval_skips(left_out)

    def _note_eval_skips(self, left_out: np.ndarray) -> None:
        """Names the images an evaluation left out; later evaluations leaving out the same ones say less."""
        n, total = left_out.size, self._eval.num_examples
        if tuple(left_out.tolist()) == self._named_eval_skips:
            logger.info("Evaluation left out the same %d undecodable image(s) as before.", n)
            return
        self._named_eval_skips = tuple(left_out.tolist())
        logger.warning("Evaluation left out %d undecodable image(s) of this process's %d (it covers %d): %s; "
                       "remove or replace them to evaluate on the whole split.", n, total, total - n,
                       image_folders.name_few([self._eval.name(int(i)) for i in left_out], 5))


def _delete_iterator(holder: list) -> None:
    """Deletes the tf.data iterator in `holder` (a one-item list, its only reference) on a daemon thread.

    Deletion waits for the autotuning thread, which can miss the cancellation (TF's CancellationManager wakes
    it before marking itself cancelled) and sleep out its period, doubling up to a minute: on the caller's
    thread that delayed an evaluation's or the run's end, or the exit (~30 s after the demo's headline).
    """
    try:
        threading.Thread(target=holder.clear, name="tf.data iterator deletion", daemon=True).start()
    except RuntimeError:  # The interpreter is shutting down and starts no threads: delete it here.
        holder.clear()


def _check_decodable(name: str, share: RecordShare, config: preprocessing.PreprocessConfig,
                     sample_size: int = 32) -> None:
    """Raises DataError, naming the files, when most of a sample spread across a share cannot be decoded.

    Skipping alone would hide a dataset where (almost) none decodes, and spin forever where none does.
    Spread, not the first files: a few bad ones sorting first (one class's empty files) must not condemn all.
    """
    indices = share.sample_indices(sample_size)
    if not indices.size:
        return
    decoded = share.records_at(indices).map(
        _graph_function(lambda index, image_bytes, _: (index, preprocessing.preprocess_for_eval(image_bytes,
                                                                                                 config))),
        num_parallel_calls=tf.data.AUTOTUNE)
    good = {int(index) for index, _ in decoded.ignore_errors().as_numpy_iterator()}
    bad = sorted((int(i) for i in indices if int(i) not in good), key=share.name)
    if 2 * len(bad) <= len(indices):
        return  # Any bad ones are skipped, and named, when the run meets them.
    count = "None" if len(bad) == len(indices) else f"Only {len(indices) - len(bad)}"
    raise DataError(f"{count} of the {len(indices)} {name} images sampled across this process's share could "
                    f"be decoded as JPEG, PNG, GIF or BMP; {len(bad)} could not "
                    f"({_why_undecodable(share, bad[0], config)}): "
                    f"{image_folders.name_few([share.name(i) for i in bad])}; remove or replace them.")


def _why_undecodable(share: RecordShare, index: int, config: preprocessing.PreprocessConfig) -> str:
    """Why the record at storage index `index` cannot be decoded, in a few words."""
    try:
        for _, image_bytes, _ in share.records_at(np.asarray([index])):
            if not image_bytes.numpy():
                return "the first is empty: 0 bytes"
            preprocessing.preprocess_for_eval(image_bytes, config)
    except tf.errors.OpError as e:
        # Eager errors wrap the message: "{{function_node ...}} <message> [Op:DecodeImage] name: ".
        message = re.sub(r"\{\{.*?\}\}|\[Op:.*", "", e.message).strip()
        return "the first: " + (message.splitlines() or ["reason unknown"])[0].rstrip(".")
    return "reason unknown"
