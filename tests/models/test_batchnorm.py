"""Batch norm over groups of images (`resnet_scaling.models.batchnorm`, `model.bn_group_size`), on 8 fake
devices.

The batch is 16 images sharded over 8 devices (2 per device): device d holds rows 2d and 2d+1.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling import config as config_lib
from resnet_scaling import models
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.models.batchnorm import GroupedBatchNorm
from resnet_scaling.planning import hlo
from resnet_scaling.training.trainer import train_and_evaluate
from tests.helpers import model_of, random_arrays, tiny_config

BATCH, CHANNELS = 16, 3
MOMENTUM, EPSILON = 0.9, 1e-5


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    # A different offset and spread per image, so that every grouping gives different statistics.
    x = rng.normal(size=(BATCH, 4, 4, CHANNELS)) * rng.uniform(0.5, 3, (BATCH, 1, 1, 1))
    return (x + np.arange(BATCH)[:, None, None, None]).astype(np.float32)


def _numpy_group_bn(x, group_size):
    """Reference: per-group normalisation and the running-average update (from mean 0, var 1)."""
    groups = x.reshape(-1, group_size, *x.shape[1:]).astype(np.float64)
    mean = groups.mean(axis=(1, 2, 3), keepdims=True)
    var = groups.var(axis=(1, 2, 3), keepdims=True)
    y = ((groups - mean) / np.sqrt(var + EPSILON)).reshape(x.shape)
    ra_mean = (1 - MOMENTUM) * mean.mean(axis=(0, 1, 2, 3))
    ra_var = MOMENTUM + (1 - MOMENTUM) * var.mean(axis=(0, 1, 2, 3))
    return y, ra_mean, ra_var


def _sharded_apply(module, x, mesh):
    """Applies `module` in training mode under jit with the batch sharded over `data`."""
    variables = module.init(jax.random.key(0), x[:1], use_running_average=True)

    def apply(variables, x):
        return module.apply(variables, x, use_running_average=False, mutable=["batch_stats"])

    fn = jax.jit(apply, in_shardings=(mesh_lib.replicated_sharding(mesh), mesh_lib.batch_sharding(mesh)))
    y, updates = fn(variables, x)
    return np.asarray(y), jax.tree.map(np.asarray, updates["batch_stats"])


@pytest.mark.parametrize(
    "group_size, what",
    [(2, "per-device statistics (2 images)"), (4, "statistics over pairs of devices"),
     (16, "full-batch statistics")],
)
def test_grouped_batch_norm_on_8_devices_matches_numpy_per_group(group_size, what):
    mesh = mesh_lib.create_mesh(8)
    x = _inputs()
    y, stats = _sharded_apply(GroupedBatchNorm(group_size, momentum=MOMENTUM, epsilon=EPSILON), x, mesh)
    y_ref, mean_ref, var_ref = _numpy_group_bn(x, group_size)
    np.testing.assert_allclose(y, y_ref, atol=2e-4, err_msg=what)
    np.testing.assert_allclose(stats["mean"], mean_ref, rtol=1e-5, err_msg=what)
    np.testing.assert_allclose(stats["var"], var_ref, rtol=1e-5, err_msg=what)
    # The groupings really differ: per-device normalisation is not the full-batch one.
    if group_size < BATCH:
        assert np.abs(y - _numpy_group_bn(x, BATCH)[0]).max() > 0.1


def test_full_span_equals_flax_batch_norm_on_one_device():
    """One group over the whole batch gives nn.BatchNorm's outputs, variables and updates exactly."""
    x = jnp.asarray(_inputs())
    ours = GroupedBatchNorm(BATCH, momentum=MOMENTUM, epsilon=EPSILON, dtype=jnp.float32)
    flax_bn = nn.BatchNorm(momentum=MOMENTUM, epsilon=EPSILON, dtype=jnp.float32)
    v_ours = ours.init(jax.random.key(0), x, use_running_average=True)
    v_flax = flax_bn.init(jax.random.key(0), x, use_running_average=True)
    assert jax.tree.map(jnp.shape, v_ours) == jax.tree.map(jnp.shape, v_flax)
    variables = {"params": {"scale": jnp.arange(1.0, 4.0), "bias": jnp.arange(3.0)},
                 "batch_stats": {"mean": jnp.full(3, 0.5), "var": jnp.full(3, 2.0)}}
    y_ours, s_ours = ours.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
    y_flax, s_flax = flax_bn.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
    np.testing.assert_allclose(y_ours, y_flax, rtol=1e-6, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), s_ours, s_flax)
    # Evaluation uses the running averages, as nn.BatchNorm does.
    np.testing.assert_allclose(ours.apply(variables, x, use_running_average=True),
                               flax_bn.apply(variables, x, use_running_average=True), rtol=1e-6)


def test_grouped_batch_norm_refuses_a_batch_that_does_not_split():
    module = GroupedBatchNorm(3)
    x = jnp.ones((4, 2, 2, 1))
    variables = module.init(jax.random.key(0), x, use_running_average=True)
    with pytest.raises(ValueError, match="bn_group_size"):
        module.apply(variables, x, use_running_average=False, mutable=["batch_stats"])


@pytest.mark.parametrize("group_size, devices_per_group", [(2, None), (4, 2), (16, 8)])
def test_collectives_span_only_the_devices_of_a_group(group_size, devices_per_group):
    """Per-device groups normalise with no cross-device reduction; larger groups reduce within a group."""
    mesh = mesh_lib.create_mesh(8)
    module = GroupedBatchNorm(group_size, momentum=MOMENTUM, epsilon=EPSILON)
    x = jnp.asarray(_inputs())
    variables = module.init(jax.random.key(0), x[:1], use_running_average=True)
    # The normalised activations only: the running-average update is checked separately below.
    fn = jax.jit(lambda v, x: module.apply(v, x, use_running_average=False, mutable=["batch_stats"])[0],
                 in_shardings=(mesh_lib.replicated_sharding(mesh), mesh_lib.batch_sharding(mesh)),
                 out_shardings=mesh_lib.batch_sharding(mesh))
    collectives = hlo.find_collectives(fn.lower(variables, x).compile().as_text(), num_devices=8)
    assert {c.kind for c in collectives} <= {"all-reduce"}, "the batch must not move between devices"
    sizes = [c.group_size for c in collectives]
    if devices_per_group is None:
        assert sizes == [], f"per-device groups need no all-reduce, found groups of {sizes}"
    else:
        assert sizes and set(sizes) == {devices_per_group}, sizes
        # Only statistics move: a mean and a mean of squares per channel.
        assert sum(c.num_elements for c in collectives) == 2 * CHANNELS


def test_model_per_device_groups_on_8_devices_equal_the_same_groups_on_1_device():
    """Group semantics do not depend on the device count: 2-image groups on 8 devices or on 1."""
    grouped = models.create_model("resnet_tiny", 10, num_filters=8, bn_group_size=2)
    whole = models.create_model("resnet_tiny", 10, num_filters=8)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(BATCH, 32, 32, 3)), jnp.float32)
    variables = grouped.init(jax.random.key(0), x[:1], train=False)

    def apply(variables, x):
        return {name: model.apply(variables, x, train=True, mutable=["batch_stats"])
                for name, model in (("grouped", grouped), ("whole", whole))}

    results = []
    for n in (1, 8):
        mesh = mesh_lib.create_mesh(n)
        fn = jax.jit(apply, in_shardings=(mesh_lib.replicated_sharding(mesh), mesh_lib.batch_sharding(mesh)))
        results.append(jax.tree.map(np.asarray, fn(variables, x)))
    on_1, on_8 = results
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), on_8, on_1)
    # ... and 2-image groups give other statistics than the whole batch.
    diffs = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), on_1["grouped"][1], on_1["whole"][1])
    assert max(jax.tree.leaves(diffs)) > 1e-3


def test_grouped_resnet50_keeps_the_parameter_and_statistic_counts():
    model = models.create_model("resnet50", 1000, bn_group_size=128)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False))
    count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
    assert count(variables["params"]) == 25_557_032
    assert count(variables["batch_stats"]) == 53_120
    plain = jax.eval_shape(lambda: models.create_model("resnet50", 1000).init(
        jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False))
    assert jax.tree.structure(variables) == jax.tree.structure(plain)


# --------------------------------------------------------------------------- config


def _config(bn_group_size, global_batch_size=16):
    config = config_lib.get_base_config()
    config.training.global_batch_size = global_batch_size
    config.model.bn_group_size = bn_group_size
    return config


@pytest.mark.parametrize(
    "bn_group_size, num_devices, expected",
    [(-1, 8, None), (0, 8, 2), (0, 1, None), (4, 8, 4), (16, 8, None), (8, None, 8)],
)
def test_resolve_bn_group_size(bn_group_size, num_devices, expected):
    config = _config(bn_group_size)
    config_lib.validate(config, num_devices)
    assert plan_lib.resolve_bn_group_size(bn_group_size, 16, num_devices) == expected
    if num_devices is not None:
        plan = plan_lib.batch_plan(config, num_devices)
        assert plan.bn_group_size == expected
        assert model_of(config, plan).bn_group_size == expected


def test_per_device_groups_need_the_device_count():
    with pytest.raises(ValueError, match="num_devices"):
        plan_lib.resolve_bn_group_size(0, 16, None)


def test_model_without_a_plan_is_the_inference_model_of_any_config():
    """Inference normalises with the running averages, so no plan (and no device count) is needed, even
    where training uses per-device groups; its outputs equal the training model's in evaluation mode."""
    config = _config(0)
    config.model.name, config.model.num_classes, config.model.num_filters = "resnet_tiny", 10, 8
    inference = model_of(config)
    training = model_of(config, plan_lib.batch_plan(config, 8))
    assert inference.bn_group_size is None and training.bn_group_size == 2
    images = jax.random.normal(jax.random.key(1), (16, 32, 32, 3))
    variables = training.init(jax.random.key(0), images, train=False)
    np.testing.assert_array_equal(inference.apply(variables, images, train=False),
                                  training.apply(variables, images, train=False))


@pytest.mark.parametrize(
    "bn_group_size, num_devices, fragment",
    [(-2, None, "use -1 (global batch), 0 (per device)"),
     (6, None, "do not divide the global batch of 16"),
     (1, 8, "would split a device's 2 images; use a multiple of the per-device batch (2, 4, ...)")],
)
def test_validate_refuses_bad_bn_group_size(bn_group_size, num_devices, fragment):
    with pytest.raises(config_lib.ConfigError, match="model.bn_group_size") as info:
        config_lib.validate(_config(bn_group_size), num_devices)
    assert fragment in str(info.value)


def test_trainer_resolves_per_device_groups_from_the_mesh(tmp_path):
    """bn_group_size=0 (per device) on 8 devices trains with 2-image groups (16 images / 8 devices)."""
    config = tiny_config(model__bn_group_size=0, training__num_train_steps=1, eval__global_batch_size=8)
    if "checkpoint" in config:
        config.checkpoint.enabled = False
    result = train_and_evaluate(config, str(tmp_path), arrays=random_arrays(num_train=16, num_eval=8))
    assert result.state.apply_fn.__self__.bn_group_size == 2
    assert np.isfinite(result.train_history[-1]["loss"])
