"""One process's share of a split as a stream of (encoded image, label) records, in a per-epoch order.

Two kinds of storage, one interface (`RecordShare`):

- `FileList`: image files named by path (class folders). Random access, so each epoch visits the share
  in an exact permutation seeded by (seed, epoch, process), and a restart skips to any position for free.
- `TFRecordShards`: TFDS's TFRecord shards. No random access within a shard, so an epoch shuffles the
  order of the shard pieces, interleaves several of them and permutes the records within windows the
  size of a shuffle buffer (all seeded). A restart in the middle of an epoch skips the records before
  its position without decoding or training on them (it reads them: TFRecord files cannot seek).

Epochs are functions of a tensor so that the pipeline can flat-map an endless range of them.
"""

from __future__ import annotations

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

    def describe(self, epoch: int, offset: int) -> str:
        """Names the record at `offset` in `epoch`'s order, for messages about bad files."""
        ...


def epoch_seed(seed: int, process_index: int, epoch: tf.Tensor) -> tf.Tensor:
    """The stateless seed of one process's epoch order."""
    base = tf.constant([seed, process_index], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64))


class FileList:
    """Image files named by path, with integer labels."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], *, seed: int, process_index: int,
                 shuffle: bool = True):
        self._paths = np.asarray(paths, dtype=object).astype(str)
        # Made once, outside any tf.function: the epoch functions capture them instead of embedding
        # a copy of every path in each traced graph.
        self._path_tensor = tf.constant(self._paths, tf.string)
        self._label_tensor = tf.constant(np.asarray(labels, np.int32))
        self._seed = seed
        self._process_index = process_index
        self._shuffle = shuffle
        self.num_examples = len(self._paths)

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

    def describe(self, epoch: int, offset: int) -> str:
        return str(self._paths[int(self._order(tf.constant(epoch, tf.int64))[offset])])


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
        self._filenames = tf.constant([p[0] for p in pieces], tf.string)
        self._skips = tf.constant([p[1] for p in pieces], tf.int64)
        self._takes = tf.constant([p[2] for p in pieces], tf.int64)
        self._parse = parse
        self._seed = seed
        self._process_index = process_index
        self._shuffle = shuffle
        self._buffer = shuffle_buffer_size
        self._cycle_length = max(1, min(cycle_length, len(pieces)))
        self.num_examples = int(sum(p[2] for p in pieces))

    def _pieces(self, order: tf.Tensor | None) -> tf.data.Dataset:
        pieces = (self._filenames, self._skips, self._takes)
        if order is not None:
            pieces = tuple(tf.gather(p, order) for p in pieces)
        return tf.data.Dataset.from_tensor_slices(pieces)

    @staticmethod
    def _read_piece(filename: tf.Tensor, skip: tf.Tensor, take: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(filename, buffer_size=1 << 20).skip(skip).take(take)

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        if not self._shuffle:
            return self.in_order()
        count = tf.shape(self._filenames, out_type=tf.int64)[0]
        seed = epoch_seed(self._seed, self._process_index, epoch)
        order = tf.random.experimental.stateless_shuffle(tf.range(count), seed=seed)
        records = self._pieces(order).interleave(
            self._read_piece, cycle_length=self._cycle_length, block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Mix records within consecutive windows of `shuffle_buffer_size`, each window permuted with
        # its own stateless seed. Unlike `Dataset.shuffle` (whose seed cannot vary per epoch inside
        # flat_map), this keeps each epoch's order a pure function of (seed, epoch, process).
        windows = records.batch(self._buffer).enumerate()
        windows = windows.map(lambda i, window: tf.random.experimental.stateless_shuffle(
            window, seed=tf.random.experimental.stateless_fold_in(seed, i)))
        return windows.unbatch().map(self._parse)

    def in_order(self) -> tf.data.Dataset:
        records = self._pieces(None).flat_map(self._read_piece)
        return records.map(self._parse)

    def describe(self, epoch: int, offset: int) -> str:
        return f"record {offset} of epoch {epoch} in this process's share"


def _read_file(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.io.read_file(path), label
