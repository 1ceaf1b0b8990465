"""One process's share of a split as a stream of (encoded image, label) records, in a per-epoch order.

Two kinds of storage, one interface (`RecordShare`). `FileList` (image files named by path: class folders) has
random access, so each epoch is an exact permutation seeded by (seed, epoch, process), and a restart skips to
any position for free. `TFRecordShards` (TFDS's TFRecord shards) has none: an epoch shuffles the pieces,
interleaves several and permutes records within shuffle-buffer windows (all seeded); a mid-epoch restart reads
the records before its position (TFRecord files cannot seek) but neither decodes nor trains on them.

Epochs are functions of a tensor, so the pipeline can flat-map an endless range of them. A record's storage
index (its place in `in_order`) names it in messages about bad records and identifies it across epochs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import tensorflow as tf


class RecordShare(Protocol):
    """A process's share of a split."""

    num_examples: int  # Records in this share.

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """(image_bytes, label) records of the share in epoch `epoch`'s order."""
        ...

    def in_order(self) -> tf.data.Dataset:
        """(image_bytes, label) records of the share in storage order (evaluation)."""
        ...

    def storage_indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        """The storage indices of the records at `offsets` in `epoch`'s order."""
        ...

    def name(self, index: int) -> str:
        """Names the record at storage index `index`, for messages about bad records."""
        ...

    def sample_indices(self, count: int) -> np.ndarray:
        """About `count` sorted storage indices spread across the share, cheap to read."""
        ...

    def records_at(self, indices: np.ndarray) -> tf.data.Dataset:
        """(storage index, image_bytes, label) of the records at `indices`."""
        ...


def epoch_seed(seed: int, process_index: int, epoch: tf.Tensor) -> tf.Tensor:
    """The stateless seed of one process's epoch order."""
    base = tf.constant([seed, process_index], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64))


def spread(num_examples: int, count: int) -> np.ndarray:
    """Up to `count` sorted indices into `num_examples`, evenly spaced from the first to the last."""
    if num_examples <= 0 or count <= 0:
        return np.zeros((0,), np.int64)
    return np.unique(np.linspace(0, num_examples - 1, min(num_examples, count)).round().astype(np.int64))


class FileList:
    """Image files named by path, with integer labels."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], *, seed: int, process_index: int,
                 shuffle: bool = True):
        self._paths = np.asarray(paths, dtype=object).astype(str)
        # Made once, outside any tf.function: traced epochs capture them instead of copying every path.
        self._path_tensor = tf.constant(self._paths, tf.string)
        self._label_tensor = tf.constant(np.asarray(labels, np.int32))
        self._seed = seed
        self._process_index = process_index
        self._shuffle = shuffle
        self.num_examples = len(self._paths)
        self._last_order: tuple[int, np.ndarray] | None = None  # (epoch, order) of the last lookup.

    def _order(self, epoch: tf.Tensor) -> tf.Tensor:
        indices = tf.range(self.num_examples, dtype=tf.int64)
        if not self._shuffle:
            return indices
        return tf.random.experimental.stateless_shuffle(
            indices, seed=epoch_seed(self._seed, self._process_index, epoch))

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        order = self._order(epoch)
        paths = tf.gather(self._path_tensor, order)
        labels = tf.gather(self._label_tensor, order)
        return tf.data.Dataset.from_tensor_slices((paths, labels)).map(_read_file)

    def in_order(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((self._path_tensor, self._label_tensor)).map(_read_file)

    def storage_indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        if self._last_order is None or self._last_order[0] != epoch:  # One shuffle per epoch, not per call.
            self._last_order = (epoch, self._order(tf.constant(epoch, tf.int64)).numpy())
        return self._last_order[1][np.asarray(offsets, np.int64)]

    def name(self, index: int) -> str:
        return str(self._paths[index])

    def sample_indices(self, count: int) -> np.ndarray:
        return spread(self.num_examples, count)

    def records_at(self, indices: np.ndarray) -> tf.data.Dataset:
        indices = tf.constant(np.asarray(indices, np.int64))
        paths, labels = tf.gather(self._path_tensor, indices), tf.gather(self._label_tensor, indices)
        return tf.data.Dataset.from_tensor_slices((indices, paths, labels)).map(
            lambda index, path, label: (index, *_read_file(path, label)))


class TFRecordShards:
    """Pieces of TFRecord files (filename, records to skip, records to take), as TFDS describes a split."""

    def __init__(self, pieces: Sequence[tuple[str, int, int]], parse: Callable[[tf.Tensor], tuple],
                 *, seed: int, process_index: int, shuffle: bool = True, shuffle_buffer_size: int = 16_384,
                 cycle_length: int = 16):
        """
        Args:
          pieces: (filename, skip, take) per file, in the split's storage order.
          parse: serialized example -> (image_bytes, int32 label), a TF function.
          seed, process_index: seed the per-epoch order.
          shuffle: whether epochs shuffle at all (False: storage order every epoch).
          shuffle_buffer_size: records permuted together (memory: this many encoded images).
          cycle_length: pieces read at once, interleaved record by record.
        """
        self._piece_list = [(str(f), int(skip), int(take)) for f, skip, take in pieces]
        takes = np.asarray([p[2] for p in self._piece_list], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(takes)[:-1]]).astype(np.int64)  # Storage index of each.
        self._filenames = tf.constant([p[0] for p in pieces], tf.string)
        self._skips = tf.constant([p[1] for p in pieces], tf.int64)
        self._takes = tf.constant(takes, tf.int64)
        self._start_tensor = tf.constant(self._starts, tf.int64)
        self._parse = parse
        self._seed = seed
        self._process_index = process_index
        self._shuffle = shuffle
        self._buffer = shuffle_buffer_size
        self._cycle_length = max(1, min(cycle_length, len(pieces)))
        self.num_examples = int(takes.sum())
        self._last_order: tuple[int, np.ndarray] | None = None  # (epoch, storage indices in its order).

    def _pieces(self, order: tf.Tensor | None) -> tf.data.Dataset:
        pieces = (self._filenames, self._skips, self._takes, self._start_tensor)
        if order is not None:
            pieces = tuple(tf.gather(p, order) for p in pieces)
        return tf.data.Dataset.from_tensor_slices(pieces)

    @staticmethod
    def _read_piece(filename: tf.Tensor, skip: tf.Tensor, take: tf.Tensor,
                    start: tf.Tensor) -> tf.data.Dataset:
        del start
        return tf.data.TFRecordDataset(filename, buffer_size=1 << 20).skip(skip).take(take)

    @staticmethod
    def _index_piece(filename: tf.Tensor, skip: tf.Tensor, take: tf.Tensor,
                     start: tf.Tensor) -> tf.data.Dataset:
        """The storage indices of a piece's records, in the places `_read_piece` puts the records."""
        del filename, skip
        return tf.data.Dataset.range(start, start + take)

    def _epoch_windows(self, epoch: tf.Tensor, read_piece: Callable) -> tf.data.Dataset:
        """Epoch `epoch`'s records (or, with `_index_piece`, their storage indices) in shuffled windows."""
        count = tf.shape(self._filenames, out_type=tf.int64)[0]
        seed = epoch_seed(self._seed, self._process_index, epoch)
        order = tf.random.experimental.stateless_shuffle(tf.range(count), seed=seed)
        records = self._pieces(order).interleave(
            read_piece, cycle_length=self._cycle_length, block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Each `shuffle_buffer_size` window gets its own stateless permutation: unlike `Dataset.shuffle`
        # (whose seed cannot vary per epoch inside flat_map), the order is a pure function of (seed, epoch,
        # process), and of the window's length and seed only, so indices move as records do.
        windows = records.batch(self._buffer).enumerate()
        return windows.map(lambda i, window: tf.random.experimental.stateless_shuffle(
            window, seed=tf.random.experimental.stateless_fold_in(seed, i)))

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        if not self._shuffle:
            return self.in_order()
        return self._epoch_windows(epoch, self._read_piece).unbatch().map(self._parse)

    def in_order(self) -> tf.data.Dataset:
        records = self._pieces(None).flat_map(self._read_piece)
        return records.map(self._parse)

    def storage_indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        offsets = np.asarray(offsets, np.int64)
        if not self._shuffle:
            return offsets
        if self._last_order is None or self._last_order[0] != epoch:
            # The epoch's order rebuilt from index ranges instead of records: no file is read.
            windows = self._epoch_windows(tf.constant(epoch, tf.int64), self._index_piece)
            self._last_order = (epoch, np.concatenate(list(windows.as_numpy_iterator())))
        return self._last_order[1][offsets]

    def name(self, index: int) -> str:
        piece = int(np.searchsorted(self._starts, index, side="right")) - 1
        filename, skip, _ = self._piece_list[piece]
        return f"record {skip + index - int(self._starts[piece])} of {filename}"

    def sample_indices(self, count: int) -> np.ndarray:
        """The first records of up to `count` pieces spread across the share: a record deep inside a
        file costs reading the records before it."""
        pieces = [p for p in spread(len(self._piece_list), count) if self._piece_list[p][2] > 0]
        if not pieces:
            return np.zeros((0,), np.int64)
        per_piece = math.ceil(count / len(pieces))
        indices = [self._starts[p] + np.arange(min(per_piece, self._piece_list[p][2])) for p in pieces]
        return np.concatenate(indices)[:count]

    def records_at(self, indices: np.ndarray) -> tf.data.Dataset:
        """Reads each piece holding one of `indices` up to the last one wanted in it."""
        indices = np.unique(np.asarray(indices, np.int64))
        pieces = np.searchsorted(self._starts, indices, side="right") - 1
        reads = []
        for piece in np.unique(pieces):
            filename, skip, _ = self._piece_list[piece]
            last = int(indices[pieces == piece].max())
            reads.append((filename, skip, last - int(self._starts[piece]) + 1, int(self._starts[piece])))
        if not reads:
            return tf.data.Dataset.from_tensor_slices(
                (tf.zeros((0,), tf.int64), tf.zeros((0,), tf.string), tf.zeros((0,), tf.int32)))
        wanted = tf.constant(indices)

        def read(filename, skip, take, start):
            return tf.data.Dataset.zip(tf.data.Dataset.range(start, start + take),
                                       self._read_piece(filename, skip, take, start))

        filenames, skips, takes, starts = zip(*reads, strict=True)
        pieces = (tf.constant(filenames, tf.string),
                  *(tf.constant(column, tf.int64) for column in (skips, takes, starts)))
        records = tf.data.Dataset.from_tensor_slices(pieces).interleave(
            read, cycle_length=min(len(reads), 16), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        records = records.filter(lambda index, _: tf.reduce_any(tf.equal(index, wanted)))
        return records.map(lambda index, serialized: (index, *self._parse(serialized)))


def _read_file(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.io.read_file(path), label
