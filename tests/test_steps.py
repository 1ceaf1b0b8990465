"""Train and eval steps: 1 device vs 8 devices, no retracing, exact eval sums, loss scaling."""

import itertools

import jax
import numpy as np
import pytest

from resnet_scaling import data, mesh, models, optim, steps
from resnet_scaling import plan as plan_lib
from tests.helpers import random_arrays, tiny_config


def _setup(config, num_devices, step_fn=steps.train_step):
    m = mesh.create_mesh(num_devices)
    source = data.create_data_source(config, m, random_arrays())
    plan = plan_lib.derive(config, source.num_train_examples, m.size)
    lr_fn = optim.create_learning_rate_schedule(config, plan)
    state = steps.create_train_state(jax.random.key(0), models.model_from_config(config),
                                     optim.create_optimizer(config, lr_fn), config.data.image_size, m,
                                     optim.create_dynamic_scale(config))
    step_config = steps.StepConfig.from_config(config)
    train = steps.jit_train_step(state, m, lr_fn, step_config, step_fn=step_fn)
    return m, source, state, train, step_config


def _run(config, num_devices, num_steps=3):
    _, source, state, train, _ = _setup(config, num_devices)
    losses = []
    for batch in itertools.islice(source.train_batches(), num_steps):
        state, metrics = train(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state)


# XLA's default optimisations (as real runs compile) as well as the tests' fast compiles; one optimizer
# there: compiling with them takes seconds per program.
@pytest.mark.parametrize("optimizer, xla_optimizations",
                         [("sgd", "off"), ("lars", "off"), ("sgd", "default")],
                         indirect=["xla_optimizations"])
def test_one_device_and_eight_devices_agree_for_the_same_global_batch(optimizer, xla_optimizations):
    config = tiny_config(optimizer__name=optimizer, optimizer__base_learning_rate=0.5)
    losses_1, state_1 = _run(config, 1)
    losses_8, state_8 = _run(config, 8)
    # Measured largest differences after 3 steps, fast compiles / default optimisations: losses 0 / 2.4e-7,
    # parameters 3e-8 / 6e-8, BN statistics 2.4e-7 / 2.4e-7.
    np.testing.assert_allclose(losses_8, losses_1, rtol=1e-4)
    assert losses_1[-1] != losses_1[0]  # The parameters really moved.
    for a, b in zip(jax.tree.leaves(state_1.params), jax.tree.leaves(state_8.params), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5)
    # Batch norm statistics are over the global batch, so the running averages agree too.
    for a, b in zip(jax.tree.leaves(state_1.batch_stats), jax.tree.leaves(state_8.batch_stats),
                    strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5)


def test_train_step_traces_once_and_keeps_state_replicated_on_the_mesh():
    traces = []

    def counted_train_step(state, batch, **kwargs):
        traces.append(1)  # Runs at trace time only.
        return steps.train_step(state, batch, **kwargs)

    m, source, state, train, _ = _setup(tiny_config(), 8, step_fn=counted_train_step)
    for batch in itertools.islice(source.train_batches(), 4):
        assert batch["images"].sharding.spec == mesh.batch_sharding(m).spec
        state, metrics = train(state, batch)
    assert len(traces) == 1
    assert int(state.step) == 4
    leaf = jax.tree.leaves(state.params)[0]
    assert leaf.sharding.is_fully_replicated and len(leaf.sharding.device_set) == 8
    assert set(metrics) == {"loss", "top1", "top5", "learning_rate"}


def test_eval_step_sums_only_unmasked_examples_and_matches_numpy():
    config = tiny_config()
    m, source, state, _, step_config = _setup(config, 8)
    eval_fn = steps.jit_eval_step(state, m, step_config)
    batch = next(source.eval_batches())
    mask = np.array(batch["mask"])
    mask[5:] = False
    batch = {**batch, "mask": jax.device_put(mask, mesh.batch_sharding(m))}
    sums = jax.device_get(eval_fn(state, batch))

    images = steps.normalize_images(batch["images"], step_config.mean_rgb, step_config.stddev_rgb)
    logits = np.asarray(state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                                       images, train=False))
    labels = np.asarray(batch["labels"])[:5]
    logits = logits[:5]
    log_probs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    assert sums["count"] == 5
    np.testing.assert_allclose(sums["loss_sum"], -log_probs[np.arange(5), labels].sum(), rtol=1e-5)
    assert sums["top1_sum"] == (logits.argmax(1) == labels).sum()


def test_bfloat16_step_keeps_float32_parameters():
    _, state = _run(tiny_config(model__compute_dtype="bfloat16"), 8, num_steps=2)
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {np.dtype("float32")}


def test_float16_uses_dynamic_loss_scaling_and_skips_overflowing_steps():
    config = tiny_config(model__compute_dtype="float16")
    _, source, state, train, _ = _setup(config, 8)
    assert float(state.dynamic_scale.scale) == 2.0**16  # flax's DynamicScale starts there.
    batches = source.train_batches()
    state, metrics = train(state, next(batches))
    assert float(metrics["loss_scale"]) == 2.0**16 and np.isfinite(float(metrics["loss"]))
    # A loss scale beyond float16's range overflows the gradients: the step must change nothing
    # but lower the scale.
    state = state.replace(dynamic_scale=state.dynamic_scale.replace(scale=np.float32(2.0**40)))
    before = jax.device_get(state.params)
    state, metrics = train(state, next(batches))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state.params)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(metrics["loss_scale"]) == 2.0**39  # Halved: flax's back-off factor.


def test_the_initialiser_compiles_unoptimised_on_the_cpu_to_the_same_state(monkeypatch):
    config = tiny_config()
    model, m = models.model_from_config(config), mesh.create_mesh(2)
    tx = optim.create_optimizer(config, lambda step: 0.1)
    options_seen = []
    real_compile = jax.stages.Lowered.compile

    def compile_and_record(self, compiler_options=None, **kwargs):
        options_seen.append(compiler_options)
        return real_compile(self, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_and_record)
    state = steps.create_train_state(jax.random.key(0), model, tx, config.data.image_size, m)
    assert options_seen == [steps.RUN_ONCE_CPU_COMPILER_OPTIONS]
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))
    optimised = jax.jit(steps.train_state_init_fn(model, tx, config.data.image_size))(jax.random.key(0))
    for ours, reference in zip(jax.tree.leaves(state), jax.tree.leaves(optimised), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), rtol=1e-6, atol=1e-7)
