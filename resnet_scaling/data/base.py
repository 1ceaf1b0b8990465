"""The interface every data source implements, and what the sources share.

Sources yield global batches sharded by `mesh.batch_sharding`: `images` uint8 [B, H, W, 3], `labels` int32
[B]; evaluation batches add `mask` (False on padding), so each example counts once on any number of devices.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from resnet_scaling import mesh as mesh_lib
from resnet_scaling.errors import RunError
from resnet_scaling.plan import BatchPlan

__all__ = ["MLPERF_CROP_AREA_RANGE", "Batch", "DataError", "DataSource", "pad_batch",
           "prefetch", "process_share", "shaped_eval_batch", "shaped_train_batch"]

Batch = dict[str, jax.Array]
# MLPerf's training crop area (the reference's is 8-100%); MLPerf mode overrides `data.crop_area_range`.
MLPERF_CROP_AREA_RANGE = (0.05, 1.0)


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
