"""The device mesh: sizes, clear errors, shardings, host-local batches assembled into global arrays; the
multislice ("dcn", "data") mesh, on 8 CPU devices as 2 pretend slices of 4."""

import itertools
import types

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from resnet_scaling.config import ConfigError, validate
from resnet_scaling.job import mesh
from resnet_scaling.training import training_setup
from tests.helpers import random_arrays, tiny_config


def test_mesh_uses_every_device_by_default_or_the_first_n():
    assert mesh.create_mesh().shape == {"data": 8}
    four = mesh.create_mesh(4)
    assert four.shape == {"data": 4}
    assert list(four.devices.flat) == jax.devices()[:4]


def test_asking_for_more_devices_than_exist_names_the_field_and_the_fix():
    with pytest.raises(ValueError, match=r"config.mesh.num_devices: asked for 512 devices but only 8.*=-1"):
        mesh.create_mesh(512)


def test_host_local_batch_becomes_a_global_array_sharded_over_data():
    m = mesh.create_mesh(8)
    assert mesh.process_layout(m) == (8, 1)  # One process holds every device here.
    local = {"images": np.arange(64 * 2, dtype=np.uint8).reshape(64, 2), "labels": np.arange(64)}
    batch = mesh.host_local_to_global(local, m)
    assert batch["images"].shape == (64, 2)
    assert batch["images"].sharding == mesh.batch_sharding(m)
    shard_rows = sorted(int(s.data[0, 0]) // 2 for s in batch["images"].addressable_shards)
    assert shard_rows == list(range(0, 64, 8))  # Each device holds 8 consecutive rows.
    np.testing.assert_array_equal(jax.device_get(batch["labels"]), local["labels"])
    assert mesh.replicated_sharding(m).is_fully_replicated


# --------------------------------------------------------------------------- multislice


def test_two_slices_on_cpu_are_two_rows_of_four_consecutive_devices():
    """Devices without a `slice_index` (CPU) form pretend slices of consecutive devices, so the multislice
    mesh and its programs run on one host; the batch splits slice-major over ("dcn", "data")."""
    m = mesh.create_mesh(num_slices=2)
    assert dict(m.shape) == {"dcn": 2, "data": 4}
    assert [list(row) for row in m.devices] == [jax.devices()[:4], jax.devices()[4:]]
    assert mesh.num_mesh_slices(m) == 2 and mesh.device_slices(m) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert mesh.batch_sharding(m).spec == PartitionSpec(("dcn", "data"))
    local = {"labels": np.arange(64)}
    batch = mesh.host_local_to_global(local, m)
    # Device (slice s, position i) holds rows [8 (4 s + i), 8 (4 s + i) + 8): a slice holds half the batch.
    for s, row in enumerate(m.devices):
        for i, device in enumerate(row):
            shard = next(x for x in batch["labels"].addressable_shards if x.device == device)
            assert int(shard.data[0]) == 8 * (4 * s + i)


def test_one_slice_keeps_the_one_axis_mesh():
    assert mesh.create_mesh(8, num_slices=1) == mesh.create_mesh(8)
    assert mesh.batch_sharding(mesh.create_mesh(num_slices=1)).spec == PartitionSpec("data")
    one = mesh.create_mesh()
    assert mesh.num_mesh_slices(one) == 1 and set(mesh.device_slices(one)) == {0}


@pytest.mark.parametrize("num_devices, num_slices, message", [
    (4, 2, r"config.system.num_slices: 2 slices need every device of the job.*num_devices=-1"),
    (-1, 3, r"config.system.num_slices: 3 slices need every device.*divisor"),
])
def test_slices_that_do_not_split_the_devices_are_refused(num_devices, num_slices, message):
    with pytest.raises(ValueError, match=message):
        mesh.create_mesh(num_devices, num_slices=num_slices)


def test_devices_of_several_tpu_slices_need_num_slices_to_say_so():
    # As libtpu describes v4 ahead of time: one device per TensorCore, 2 per chip, 2 chips per slice.
    devices = [types.SimpleNamespace(id=i, slice_index=i // 4, process_index=i // 4, platform="tpu",
                                     device_kind="TPU v4", coords=((i // 2) % 2, 0, 0), core_on_chip=i % 2)
               for i in range(8)]
    assert mesh.device_slice_count(devices) == 2
    with pytest.raises(ValueError, match=r"config.system.num_slices: the devices come from 2 TPU slices; set "
                                         r"--config.system.num_slices=2"):
        mesh.create_mesh(devices=devices, num_slices=1)
    # create_hybrid_device_mesh wants one device per chip: the slices keep the given order instead.
    grid = mesh.hybrid_device_grid(devices[4:] + devices[:4], 2)
    assert [[d.id for d in row] for row in grid] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _train(num_slices, num_steps=3):
    config = tiny_config(model__bn_group_size=4)  # 2 devices per group: inside a slice of 4.
    config.system.num_slices = num_slices
    run = training_setup.setup(config, arrays=random_arrays())
    state, losses = run.state, []
    for batch in itertools.islice(run.source.train_batches(), num_steps):
        state, step_metrics = run.train_step(state, batch)
        losses.append(float(step_metrics["loss"]))
    return run, losses, jax.device_get(state)


def test_two_slices_train_as_one_slice_does_for_the_same_global_batch():
    one_run, losses_1, state_1 = _train(1)
    two_run, losses_2, state_2 = _train(2)
    assert dict(one_run.mesh.shape) == {"data": 8} and dict(two_run.mesh.shape) == {"dcn": 2, "data": 4}
    assert two_run.plan.per_device_batch_size == one_run.plan.per_device_batch_size == 2
    assert losses_1[-1] != losses_1[0]  # The parameters really moved.
    np.testing.assert_allclose(losses_2, losses_1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves((state_1.params, state_1.batch_stats)),
                    jax.tree.leaves((state_2.params, state_2.batch_stats)), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides, message", [
    ({"model__bn_group_size": 16}, r"config.model.bn_group_size: groups of 16 images would span two of the 2 "
                                   r"slices \(each holds 8 of the 16 images per step\)"),
    ({"model__bn_group_size": 8, "training__global_batch_size": 24, "mesh__num_devices": 12},
     r"config.model.bn_group_size: groups of 8 images would span two of the 2 slices \(each holds 12"),
    ({"system__num_slices": 0}, r"config.system.num_slices: use 1"),
    ({"mesh__num_devices": 5}, r"config.mesh.num_devices: 5 devices do not split evenly into 2 slices"),
])
def test_config_refuses_batch_norm_groups_across_slices_and_uneven_slices(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_config(**{"system__num_slices": 2, **overrides}))
    # Per device, one device, two devices, a whole slice of 4, and the global batch (it spans the slices
    # by definition, and evaluation sets it) are fine.
    for group_size in (0, 2, 4, 8, -1):
        validate(tiny_config(system__num_slices=2, model__bn_group_size=group_size), num_devices=8)
