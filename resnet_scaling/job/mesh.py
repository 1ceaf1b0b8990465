"""The device mesh, its shardings, and host-local batches turned into global arrays.

Data parallelism for 1 to 512+ devices: batches sharded over every device, the train state replicated. One
slice (or GPU host, or CPU) gets a 1-D `data` mesh. Multislice (`config.system.num_slices` > 1) gets ("dcn",
"data"), a row per slice, the batch split slice-major so batch-norm groups of whole devices stay in a slice.
XLA's gradient all-reduce on TPU reduces within each slice over ICI before crossing DCN (see aot.py and
docs/multihost.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from resnet_scaling.job.errors import ConfigError

DATA_AXIS = "data"  # Devices of one slice (ICI); the only axis of a single-slice mesh.
DCN_AXIS = "dcn"  # Slices, joined by the data-center network; present when there are several.


def mesh_size(num_devices: int, num_available: int) -> int:
    """Devices a mesh of `config.mesh.num_devices` = `num_devices` holds (-1: all `num_available`)."""
    return num_available if num_devices == -1 else num_devices


def device_slice_count(devices: Sequence[jax.Device]) -> int:
    """TPU slices the devices come from (their `slice_index`); 1 for devices without one (CPU, GPU)."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def create_mesh(num_devices: int = -1, devices: list[jax.Device] | None = None,
                num_slices: int | None = None) -> Mesh:
    """Returns the data-parallel mesh over `num_devices` devices (-1: all of `jax.devices()`).

    Args:
      num_devices: `config.mesh.num_devices`; fewer than the job's (single-process, single-slice): the first.
      devices: default the job's; a TPU topology's for ahead-of-time compiles.
      num_slices: `config.system.num_slices`; None: as many as the devices come from. Above 1: the grid of
        `hybrid_device_grid` (TPU) or `fake_slices_device_grid` (e.g. 8 CPU devices as 2 slices of 4).

    Returns:
      A 1-D mesh (axis `data`) for one slice, else a 2-D mesh (`dcn`, `data`).

    Raises:
      ConfigError: a device or slice count these devices cannot give, naming the field to change.
    """
    devices = list(devices if devices is not None else jax.devices())
    num_devices = mesh_size(num_devices, len(devices))
    if num_devices <= 0:
        raise ConfigError(f"config.mesh.num_devices: use -1 (all devices) or a positive count, got "
                          f"{num_devices}.")
    if num_devices > len(devices):
        raise ConfigError(
            f"config.mesh.num_devices: asked for {num_devices} devices but only {len(devices)} are "
            f"visible ({devices[0].platform}); set --config.mesh.num_devices=-1 to use them all. A config "
            "made for a larger system is checked without it by compiling for its topology here: "
            "python -m resnet_scaling.compile --config=CONFIG (needs the [tpu] extra).")
    if num_devices < len(devices) and jax.process_count() > 1:
        raise ConfigError(
            "config.mesh.num_devices: a multi-process job must use every device; set it to -1."
        )
    device_slices = device_slice_count(devices)
    if num_slices is None:
        num_slices = device_slices
    if device_slices > 1 and num_slices != device_slices:
        raise ConfigError(f"config.system.num_slices: the devices come from {device_slices} TPU slices; set "
                         f"--config.system.num_slices={device_slices}.")
    if num_slices == 1:
        return Mesh(np.array(devices[:num_devices]), (DATA_AXIS,))
    if num_slices < 1 or num_devices != len(devices) or num_devices % num_slices:
        raise ConfigError(
            f"config.system.num_slices: {num_slices} slices need every device of the job, split evenly "
            f"between them ({num_devices} of {len(devices)} devices asked for); set "
            f"--config.mesh.num_devices=-1, or num_slices to a divisor of the device count.")
    if device_slices > 1:
        grid = hybrid_device_grid(devices, num_slices)
    else:
        grid = fake_slices_device_grid(devices, num_slices)
    return Mesh(grid, (DCN_AXIS, DATA_AXIS))


def hybrid_device_grid(devices: Sequence[jax.Device], num_slices: int) -> np.ndarray:
    """[num_slices, devices per slice] of TPU devices: row s holds slice s's devices, in the ICI order
    `mesh_utils.create_hybrid_device_mesh` picks (a ring through the slice's torus), or in the given order
    where it cannot lay them out (e.g. one device per TensorCore on v4)."""
    from jax.experimental import mesh_utils

    per_slice = len(devices) // num_slices
    try:
        return mesh_utils.create_hybrid_device_mesh((1, per_slice), (num_slices, 1), devices)
    except (AssertionError, NotImplementedError, ValueError):
        by_slice = sorted(devices, key=lambda d: d.slice_index)  # stable: the given order within a slice
        return np.array(by_slice).reshape(num_slices, per_slice)


def fake_slices_device_grid(devices: Sequence[jax.Device], num_slices: int) -> np.ndarray:
    """[num_slices, devices per slice] of devices that have no slices (CPU, GPU): consecutive devices form
    one pretend slice, so the multislice mesh and its programs run and are tested on one host."""
    return np.array(devices).reshape(num_slices, len(devices) // num_slices)


def num_mesh_slices(mesh: Mesh) -> int:
    """Slices along the mesh's `dcn` axis (1 for a single-slice mesh)."""
    return dict(mesh.shape).get(DCN_AXIS, 1)


def device_slices(mesh: Mesh) -> list[int]:
    """The slice of each device of the mesh, in `mesh.devices.flat` order (the order of the device
    assignment a jitted program over the mesh gets, so the ids in its `replica_groups`)."""
    per_slice = mesh.size // num_mesh_slices(mesh)
    return [position // per_slice for position in range(mesh.size)]


def batch_axes(mesh: Mesh) -> str | tuple[str, ...]:
    """The mesh axes the batch dimension is split over: `data`, or (`dcn`, `data`) slice-major."""
    return DATA_AXIS if mesh.axis_names == (DATA_AXIS,) else tuple(mesh.axis_names)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over every device (`batch_axes`), other dimensions whole."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))


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

    Each process passes its `BatchPlan.per_process_batch_size` rows; together they form the global batch.
    """
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
