"""The interface every data source implements, and what the sources share.

Sources yield global batches sharded by `mesh.batch_sharding`: `images` uint8 [B, H, W, 3], `labels` int32
[B]; evaluation batches add `mask` (False on padding), so each example counts once on any number of devices.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from resnet_scaling.config.plan import BatchPlan
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.job.errors import RunError

__all__ = ["MLPERF_CROP_AREA_RANGE", "Batch", "DataConfig", "DataError", "DataSource", "pad_batch",
           "prefetch", "process_share", "shaped_eval_batch", "shaped_train_batch"]

Batch = dict[str, jax.Array]
# MLPerf's training crop area (the reference's is 8-100%); MLPerf mode overrides `data.crop_area_range`.
MLPERF_CROP_AREA_RANGE = (0.05, 1.0)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What the sources read: `config.data` (its fields, commented in config.py), the seed, the classes and
    MLPerf's crop (`sections.read` builds it). Normalisation (`mean_rgb`, `stddev_rgb`) is the step's."""

    source: str = "tfds"  # One of config_fields.DATA_SOURCES.
    dataset: str = "imagenet2012"
    data_dir: str = ""
    train_split: str = "train"
    eval_split: str = "validation"
    image_key: str = "image"
    label_key: str = "label"
    folder: str = ""
    cache_dir: str = "~/.cache/resnet_scaling"
    image_size: int = 224
    class_names: tuple[str, ...] | None = None
    num_train_examples: int = 1_281_167
    num_eval_examples: int = 50_000
    shuffle: bool = True
    synthetic_num_batches: int = 4
    crop_area_range: tuple[float, float] = (0.08, 1.0)
    crop_aspect_range: tuple[float, float] = (3 / 4, 4 / 3)
    crop_attempts: int = 10
    random_flip: bool = True
    eval_resize_size: int = 256
    resize_method: str = "bilinear"
    shuffle_buffer_size: int = 16_384
    interleave_cycle_length: int = 16
    num_threads: int = 0
    prefetch_batches: int = 2
    device_prefetch: int = 2
    num_classes: int = 1000  # `config.model.num_classes`: a dataset with another count is refused.
    seed: int = 0  # `config.seed`: shuffling, augmentation, synthetic images.
    mlperf_crop: bool = False  # `config.mlperf.enabled`: train on MLPERF_CROP_AREA_RANGE's crops.


class DataError(RunError, ValueError):
    """A dataset is missing, unprepared or malformed; the message says what to do."""


class DataSource(Protocol):
    """What the trainer needs from a dataset."""

    num_train_examples: int  # Defines an epoch.
    num_eval_examples: int  # Evaluation covers exactly these.
    # Label i's name (a class folder's, a TFDS label's, the user's for arrays); None where the data has none.
    class_names: list[str] | None

    def train_batches(self, start_step: int = 0) -> Iterator[Batch]:
        """Endless global training batches, starting with the one step `start_step` would see."""
        ...

    def eval_batches(self) -> Iterator[Batch]:
        """One pass over the evaluation examples, the last batch padded and masked."""
        ...


def process_share(num_examples: int, process_index: int, process_count: int) -> tuple[int, int]:
    """[start, stop) of a process's disjoint share of `num_examples` (shares differ by at most 1)."""
    start = num_examples * process_index // process_count
    stop = num_examples * (process_index + 1) // process_count
    return start, stop


def pad_batch(local: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Pads a short host batch to `batch_size` with zeros and adds `mask` (False on the padding)."""
    valid = len(local["labels"])
    pad = batch_size - valid
    padded = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) if pad else v
              for k, v in local.items()}
    padded["mask"] = np.arange(batch_size) < valid
    return padded


def prefetch(batches: Iterator[Batch], size: int) -> Iterator[Batch]:
    """Keeps `size` batches in flight ahead of the consumer: making a global array starts its
    host-to-device copy without waiting, so the transfers overlap the steps still running."""
    if size <= 0:
        yield from batches
        return
    queue = collections.deque(itertools.islice(batches, size))
    while queue:
        yield queue.popleft()
        queue.extend(itertools.islice(batches, 1))


def shaped_train_batch(batch: BatchPlan, image_size: int, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """The training batch every source yields, as ShapeDtypeStructs with its sharding: what ahead-of-time
    compilation lowers the step with (as MaxText's `get_shaped_batch`)."""
    sharding = mesh_lib.batch_sharding(mesh)
    size = batch.global_batch_size
    return {"images": jax.ShapeDtypeStruct((size, image_size, image_size, 3), jnp.uint8, sharding=sharding),
            "labels": jax.ShapeDtypeStruct((size,), jnp.int32, sharding=sharding)}


def shaped_eval_batch(batch: BatchPlan, image_size: int, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """The evaluation batch every source yields (`pad_batch`'s `mask` included), as ShapeDtypeStructs."""
    sharding = mesh_lib.batch_sharding(mesh)
    size = batch.eval_global_batch_size
    return {"images": jax.ShapeDtypeStruct((size, image_size, image_size, 3), jnp.uint8, sharding=sharding),
            "labels": jax.ShapeDtypeStruct((size,), jnp.int32, sharding=sharding),
            "mask": jax.ShapeDtypeStruct((size,), jnp.bool_, sharding=sharding)}
