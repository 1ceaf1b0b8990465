"""Train and eval steps: 1 device vs 8 devices, no retracing, exact eval sums, loss scaling."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling import data, models
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import mesh
from resnet_scaling.training import optim, sections, steps
from tests.helpers import random_arrays, tiny_config


def _setup(config, num_devices, step_fn=steps.train_step):
    m = mesh.create_mesh(num_devices)
    parts = sections.read(config)
    source = data.create_data_source(parts.data, m, random_arrays(),
                                     batch=plan_lib.batch_plan_for_mesh(config, m))
    plan = plan_lib.derive(config, source.num_train_examples, m.size)
    lr_fn = optim.create_learning_rate_schedule(parts.schedule, plan)
    state = steps.create_train_state(jax.random.key(0), models.model_from_config(parts.model),
                                     optim.create_optimizer(parts.optimizer, lr_fn), config.data.image_size,
                                     m, optim.create_dynamic_scale(parts.model.compute_dtype))
    step_config = parts.step
    train = steps.jit_train_step(state, m, lr_fn, step_config, step_fn=step_fn)
    return m, source, state, train, step_config


def _run(config, num_devices, num_steps=3):
    _, source, state, train, _ = _setup(config, num_devices)
    losses = []
    for batch in itertools.islice(source.train_batches(), num_steps):
        state, metrics = train(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state)


# SGD compiled as real runs compile (XLA's default optimisations); LARS with the tests' fast compiles only:
# compiling with the default optimisations takes seconds per program.
@pytest.mark.parametrize("optimizer, xla_optimizations", [("sgd", "default"), ("lars", "off")],
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


# ------------------------------------------------------------------ a reference step, written apart

def _reference_loss(params, batch_stats, images, labels, *, num_classes, label_smoothing, bn_momentum=0.9,
                    bn_epsilon=1e-5):
    """resnet_tiny's training loss written from the architecture with plain lax ops (not the library's
    model, layers or loss): stem 7x7/2 conv + BN + ReLU, 3x3/2 max pool, four basic blocks (two 3x3
    convs, the first strided from stage 2 on, with a 1x1/2 projection there), global mean, dense. Batch
    norm in training mode: the batch's mean and biased variance, running averages moved by 1 - momentum.

    Returns:
      (mean smoothed cross-entropy, (logits, the new running BN statistics)).
    """
    new_stats = {}

    def conv(x, kernel, stride, padding):
        return jax.lax.conv_general_dilated(x, kernel, (stride, stride), padding,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            precision=jax.lax.Precision.HIGHEST)

    def bn(x, p, stats, path):
        mean = jnp.mean(x, axis=(0, 1, 2))
        var = jnp.mean((x - mean) ** 2, axis=(0, 1, 2))
        new_stats[path] = {"mean": bn_momentum * stats["mean"] + (1 - bn_momentum) * mean,
                           "var": bn_momentum * stats["var"] + (1 - bn_momentum) * var}
        return (x - mean) / jnp.sqrt(var + bn_epsilon) * p["scale"] + p["bias"]

    same = ((1, 1), (1, 1))
    x = conv(images, params["stem_conv"]["kernel"], 2, ((3, 3), (3, 3)))
    x = jax.nn.relu(bn(x, params["stem_bn"], batch_stats["stem_bn"], ("stem_bn",)))
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                              ((0, 0), (1, 1), (1, 1), (0, 0)))
    for stage in range(4):
        name, stride = f"stage{stage + 1}_block1", 1 if stage == 0 else 2
        p, stats = params[name], batch_stats[name]
        y = conv(x, p["conv1"]["kernel"], stride, same)
        y = jax.nn.relu(bn(y, p["bn1"], stats["bn1"], (name, "bn1")))
        y = bn(conv(y, p["conv2"]["kernel"], 1, same), p["bn2"], stats["bn2"], (name, "bn2"))
        if stage > 0:  # The width doubles: a projection of the block's input.
            x = conv(x, p["downsample_conv"]["kernel"], stride, "VALID")
            x = bn(x, p["downsample_bn"], stats["downsample_bn"], (name, "downsample_bn"))
        x = jax.nn.relu(x + y)
    logits = jnp.mean(x, axis=(1, 2)) @ params["classifier"]["kernel"] + params["classifier"]["bias"]
    targets = (1 - label_smoothing) * jax.nn.one_hot(labels, num_classes) + label_smoothing / num_classes
    loss = -jnp.mean(jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1))
    nested = {}
    for path, value in new_stats.items():
        node = nested
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return loss, (logits, nested)


def test_two_train_steps_match_a_reference_loss_gradient_and_momentum_sgd_written_apart():
    """The library's sharded step against jax.grad of the loss above and SGD written out in NumPy, as
    the config asks for it: L2 weight decay added to the gradient of conv and dense kernels only (not BN
    scales and offsets, not the classifier bias), momentum 0.9 as trace = gradient + 0.9 x trace (no
    Nesterov), the update -learning_rate x trace. Two steps, so that the second carries momentum."""
    learning_rate, weight_decay, momentum, smoothing = 0.5, 0.05, 0.9, 0.1
    config = tiny_config(schedule__name="constant", schedule__warmup_steps=0, optimizer__lr_scaling="none",
                         optimizer__base_learning_rate=learning_rate, optimizer__weight_decay=weight_decay,
                         optimizer__momentum=momentum, training__label_smoothing=smoothing,
                         model__zero_init_last_bn_scale=False)  # Every block's weights get a gradient.
    assert config.optimizer.name == "sgd" and not config.optimizer.nesterov
    _, source, state, train, _ = _setup(config, 8)
    grad_fn = jax.jit(jax.value_and_grad(functools.partial(
        _reference_loss, num_classes=config.model.num_classes, label_smoothing=smoothing), has_aux=True))
    mean = np.asarray(config.data.mean_rgb, np.float32)
    stddev = np.asarray(config.data.stddev_rgb, np.float32)

    def decayed(path, value):  # Kernels by name: the optimizer's mask is a rule about ranks.
        return weight_decay * value if path[-1].key == "kernel" else np.zeros_like(value)

    trace = None
    for batch in itertools.islice(source.train_batches(), 2):
        before = jax.device_get(state)
        images = (np.asarray(jax.device_get(batch["images"]), np.float32) / 255 - mean) / stddev
        labels = np.asarray(jax.device_get(batch["labels"]))
        (loss, (logits, batch_stats)), grads = jax.device_get(
            grad_fn(before.params, before.batch_stats, images, labels))
        gradient = jax.tree_util.tree_map_with_path(lambda path, g, p: g + decayed(path, p), grads,
                                                    before.params)
        trace = gradient if trace is None else jax.tree.map(lambda g, t: g + momentum * t, gradient, trace)
        state, metrics = train(state, batch)
        after = jax.device_get(state)

        assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-5)
        assert float(metrics["top1"]) == np.mean(np.argmax(logits, -1) == labels)
        assert float(metrics["learning_rate"]) == learning_rate
        # Measured largest differences: 3e-5 of a layer's largest update, 4e-7 in the BN statistics.
        flat_after = jax.tree_util.tree_leaves_with_path(after.params)
        for (path, new), old, t in zip(flat_after, jax.tree.leaves(before.params), jax.tree.leaves(trace),
                                       strict=True):
            expected = -learning_rate * t
            np.testing.assert_allclose(new - old, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max(),
                                       err_msg=jax.tree_util.keystr(path))
        assert jax.tree.structure(after.batch_stats) == jax.tree.structure(batch_stats)
        for ours, reference in zip(jax.tree.leaves(after.batch_stats), jax.tree.leaves(batch_stats),
                                   strict=True):
            np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-6)
    assert int(state.step) == 2


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
    parts = sections.read(config)
    model, m = models.model_from_config(parts.model), mesh.create_mesh(2)
    tx = optim.create_optimizer(parts.optimizer, lambda step: 0.1)
    options_seen = []
    real_compile = jax.stages.Lowered.compile

    def compile_and_record(self, compiler_options=None, **kwargs):
        options_seen.append(compiler_options)
        return real_compile(self, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_and_record)
    state = steps.create_train_state(jax.random.key(0), model, tx, config.data.image_size, m)
    assert options_seen == [steps.RUN_ONCE_CPU_COMPILER_OPTIONS]
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))
    # The oracle: flax's initialiser and the optimizer's, run eagerly (op by op, no program of the library's).
    size = config.data.image_size
    variables = model.init(jax.random.key(0), jnp.zeros((1, size, size, 3), model.dtype), train=False)
    expected = {"params": variables["params"], "batch_stats": variables["batch_stats"],
                "opt_state": tx.init(variables["params"])}
    assert int(state.step) == 0
    for name, tree in expected.items():
        for ours, reference in zip(jax.tree.leaves(getattr(state, name)), jax.tree.leaves(tree), strict=True):
            np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), rtol=1e-6, atol=1e-7)
