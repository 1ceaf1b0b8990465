"""The device mesh: sizes, clear errors, shardings, host-local batches assembled into global arrays."""

import jax
import numpy as np
import pytest

from resnet_scaling import mesh


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
