"""The device mesh, its shardings, and host-local batches turned into global arrays.

One parallelism path for 1 to 512+ devices: a `Mesh` with a single `data` axis over every device of the
job; batches are sharded along it and the train state is replicated.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def mesh_size(num_devices: int, num_available: int) -> int:
    """Devices a mesh of `config.mesh.num_devices` = `num_devices` holds (-1: all `num_available`)."""
    return num_available if num_devices == -1 else num_devices


def create_mesh(num_devices: int = -1, devices: list[jax.Device] | None = None) -> Mesh:
    """Returns a 1-D mesh with axis `data` over `num_devices` devices (-1: all of `jax.devices()`).

    With fewer devices than the job has (single-process runs only), the first `num_devices` are used.
    """
    devices = list(devices if devices is not None else jax.devices())
    num_devices = mesh_size(num_devices, len(devices))
    if num_devices <= 0:
        raise ValueError(f"config.mesh.num_devices: use -1 (all devices) or a positive count, got "
                         f"{num_devices}.")
    if num_devices > len(devices):
        raise ValueError(
            f"config.mesh.num_devices: asked for {num_devices} devices but only {len(devices)} are "
            f"visible ({devices[0].platform}); set --config.mesh.num_devices=-1 to use them all."
        )
    if num_devices < len(devices) and jax.process_count() > 1:
        raise ValueError(
            "config.mesh.num_devices: a multi-process job must use every device; set it to -1."
        )
    return Mesh(np.array(devices[:num_devices]), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over the `data` axis, other dimensions whole."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (parameters, optimizer state, metrics)."""
    return NamedSharding(mesh, PartitionSpec())


def process_layout(mesh: Mesh) -> tuple[int, int]:
    """(this process's devices in the mesh, processes the mesh spans): how a global batch splits
    into the host-local batches each process's input pipeline makes."""
    local_devices = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
    return local_devices, len({d.process_index for d in mesh.devices.flat})


def host_local_to_global(batch: Any, mesh: Mesh) -> Any:
    """Assembles this process's part of a batch (a pytree of NumPy arrays) into global `jax.Array`s.

    Every process calls this with its own `BatchPlan.per_process_batch_size` rows; together they form the
    global batch, sharded over `data`.
    """
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
