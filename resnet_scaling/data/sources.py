"""The sources that need no files: synthetic images made on the device, and NumPy arrays in memory.

The tf.data sources (TFDS, class folders, shapes) are in pipeline.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from resnet_scaling.config.plan import BatchPlan
from resnet_scaling.data.base import Batch, pad_batch, process_share
from resnet_scaling.job import mesh as mesh_lib


def _random_batch(key: jax.Array, batch_size: int, image_size: int, num_classes: int) -> Batch:
    """Uniform uint8 images [batch, size, size, 3] and int32 labels in [0, num_classes)."""
    image_key, label_key = jax.random.split(key)
    shape = (batch_size, image_size, image_size, 3)
    return {"images": jax.random.randint(image_key, shape, 0, 256, jnp.int32).astype(jnp.uint8),
            "labels": jax.random.randint(label_key, (batch_size,), 0, num_classes, jnp.int32)}


class SyntheticSource:
    """Random images and labels made on the device: the standard input for throughput benchmarks.

    A few sharded batches, made once and cycled: the host does no work per step, so only the step is timed.
    """

    def __init__(self, *, image_size: int, num_classes: int, batch: BatchPlan, mesh: Mesh,
                 num_train_examples: int, num_eval_examples: int, num_batches: int = 4, seed: int = 0):
        self.num_train_examples = num_train_examples
        self.num_eval_examples = num_eval_examples
        self.class_names = None  # Random labels name nothing.
        self._mesh = mesh
        self._image_size = image_size
        self._num_classes = num_classes
        self._batch = batch.for_eval_set(num_eval_examples)
        keys = jax.random.split(jax.random.key(seed), num_batches)
        self._train = [self._make_batch(k, batch.global_batch_size) for k in keys]
        self._seed = seed

    def _make_batch(self, key: jax.Array, batch_size: int) -> Batch:
        # One module-level function with static sizes: every batch of a size reuses one compiled program.
        make = jax.jit(_random_batch, static_argnums=(1, 2, 3),
                       out_shardings=mesh_lib.batch_sharding(self._mesh))
        return make(key, batch_size, self._image_size, self._num_classes)

    def train_batches(self, start_step: int = 0) -> Iterator[Batch]:
        step = start_step
        while True:
            yield self._train[step % len(self._train)]
            step += 1

    def eval_batches(self) -> Iterator[Batch]:
        batch_size = self._batch.eval_global_batch_size
        batch = self._make_batch(jax.random.key(self._seed + 1), batch_size)
        sharding = mesh_lib.batch_sharding(self._mesh)
        # The global batch's first `valid` rows count; later steps (if any) are all padding.
        for step in range(self._batch.eval_steps(self.num_eval_examples)):
            valid = max(0, min(batch_size, self.num_eval_examples - step * batch_size))
            mask = jax.device_put(np.arange(batch_size) < valid, sharding)
            yield {**batch, "mask": mask}


class ArraySource:
    """Training and evaluation from NumPy arrays held in host memory (research code, tests, the demo).

    Every process passes the full arrays and reads its `process_share`. Training runs across epochs, each
    permuted by (seed, epoch, process): step s always sees the same images, so a restart needs no replay.
    `class_names` (label i's name, `config.data.class_names`) is kept for the export; None: unnamed.
    """

    def __init__(self, train_images: np.ndarray, train_labels: np.ndarray, eval_images: np.ndarray,
                 eval_labels: np.ndarray, *, batch: BatchPlan, mesh: Mesh, seed: int = 0,
                 shuffle: bool = True, num_classes: int | None = None, image_size: int | None = None,
                 class_names: Sequence[str] | None = None):
        self.class_names = _checked_class_names(class_names, num_classes)
        if num_classes is None and self.class_names is not None:
            num_classes = len(self.class_names)  # Labels must then index the names.
        for name, images, labels in (("train", train_images, train_labels),
                                     ("eval", eval_images, eval_labels)):
            _check_arrays(name, images, labels, num_classes, image_size)
        train_labels = np.asarray(train_labels, np.int32)
        eval_labels = np.asarray(eval_labels, np.int32)
        batch = batch.for_eval_set(len(eval_labels))
        self._mesh = mesh
        self._seed = seed
        self._shuffle = shuffle
        self._local_batch = batch.per_process_batch_size
        self._local_eval_batch = batch.eval_per_process_batch_size
        index, count = jax.process_index(), jax.process_count()
        start, stop = process_share(len(train_labels), index, count)
        self._train_images, self._train_labels = train_images[start:stop], train_labels[start:stop]
        start, stop = process_share(len(eval_labels), index, count)
        self._eval_images, self._eval_labels = eval_images[start:stop], eval_labels[start:stop]
        self._num_eval_batches = batch.eval_steps(len(eval_labels))  # The same on every process.
        self.num_train_examples = len(train_labels)
        self.num_eval_examples = len(eval_labels)
        if len(self._train_labels) == 0:
            raise ValueError(f"Process {index} of {count} got no training examples: pass more examples.")

    def _epoch_order(self, epoch: int) -> np.ndarray:
        n = len(self._train_labels)
        if not self._shuffle:
            return np.arange(n)
        rng = np.random.default_rng((self._seed, epoch, jax.process_index()))
        return rng.permutation(n)

    def train_batches(self, start_step: int = 0) -> Iterator[Batch]:
        n = len(self._train_labels)
        position = start_step * self._local_batch  # Index into the endless stream of epochs.
        epoch, order = position // n, self._epoch_order(position // n)
        while True:
            indices = []
            while len(indices) < self._local_batch:
                if position // n != epoch:
                    epoch, order = position // n, self._epoch_order(position // n)
                take = min(self._local_batch - len(indices), n - position % n)
                indices.extend(order[position % n: position % n + take])
                position += take
            indices = np.asarray(indices)
            local = {"images": self._train_images[indices], "labels": self._train_labels[indices]}
            yield mesh_lib.host_local_to_global(local, self._mesh)

    def eval_batches(self) -> Iterator[Batch]:
        b = self._local_eval_batch
        for i in range(self._num_eval_batches):
            local = {"images": self._eval_images[i * b: (i + 1) * b],
                     "labels": self._eval_labels[i * b: (i + 1) * b]}
            yield mesh_lib.host_local_to_global(pad_batch(local, b), self._mesh)


def _checked_class_names(class_names: Sequence[str] | None, num_classes: int | None) -> list[str] | None:
    """`class_names` as a list, refused unless they are strings, one per class (not necessarily distinct:
    ImageNet's readable names repeat "crane" and "maillot")."""
    if class_names is None:
        return None
    if isinstance(class_names, str) or not all(isinstance(n, str) for n in class_names):
        raise ValueError(f"class_names must be a sequence of strings, one per label, got {class_names!r}.")
    names = list(class_names)
    if num_classes is not None and len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for {num_classes} classes (config.model.num_classes); "
                         "give one name per label, in label order.")
    return names


def _check_arrays(name: str, images: np.ndarray, labels: np.ndarray, num_classes: int | None,
                  image_size: int | None) -> None:
    """Refuses arrays the steps cannot take, naming what is wrong."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8:
        raise ValueError(f"{name} images must be uint8 pixels in [0, 255], got {images.dtype}; "
                         "normalisation happens on the device.")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"{name} images must be [N, H, W, 3] (NHWC, RGB), got shape {images.shape}.")
    if image_size is not None and images.shape[1:3] != (image_size, image_size):
        raise ValueError(f"{name} images are {images.shape[1]}x{images.shape[2]} pixels but "
                         f"config.data.image_size is {image_size}; resize them or set it to match.")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{name} labels must be [N] with N = {images.shape[0]} images, got shape "
                         f"{labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} labels must be integers, got {labels.dtype}.")
    if len(labels) and (labels.min() < 0 or (num_classes is not None and labels.max() >= num_classes)):
        raise ValueError(f"{name} labels must lie in [0, {num_classes}), found {labels.min()}.."
                         f"{labels.max()}; set config.model.num_classes to match the data.")
