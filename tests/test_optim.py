"""Tests for the loss and metrics helpers (`resnet_scaling.steps`) and `resnet_scaling.optim`.

References are NumPy hand computations (float64) of the formulas the docstrings state; the LARS one
follows optax.lars: add_decayed_weights -> masked scale_by_trust_ratio -> scale by -lr -> trace.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import dynamic_scale as dynamic_scale_lib

from resnet_scaling import models
from resnet_scaling.config import get_base_config
from resnet_scaling.optim import (
    create_dynamic_scale,
    create_learning_rate_schedule,
    create_optimizer,
    kernel_mask,
)
from resnet_scaling.plan import derive
from resnet_scaling.steps import cross_entropy_loss, normalize_images, topk_correct

# --------------------------------------------------------------------------- loss and metrics


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_cross_entropy_loss_with_label_smoothing(smoothing):
    rng = np.random.default_rng(0)
    num_classes = 7
    logits = rng.normal(size=(5, num_classes)) * 3
    labels = np.array([0, 3, 6, 2, 3])
    onehot = np.eye(num_classes)[labels]
    targets = (1 - smoothing) * onehot + smoothing / num_classes
    expected = -(targets * _np_log_softmax(logits)).sum(axis=-1)

    loss = cross_entropy_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(labels), num_classes,
                              label_smoothing=smoothing)
    assert loss.shape == (5,)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5, atol=1e-6)


def test_cross_entropy_loss_without_smoothing_is_plain_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 10)).astype(np.float32)
    labels = rng.integers(0, 10, size=6)
    expected = -_np_log_softmax(logits.astype(np.float64))[np.arange(6), labels]
    loss = cross_entropy_loss(jnp.asarray(logits), jnp.asarray(labels), 10)
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5)
    # Smoothing really changes the loss (guards against it being ignored).
    smoothed = cross_entropy_loss(jnp.asarray(logits), jnp.asarray(labels), 10, label_smoothing=0.1)
    assert not np.allclose(np.asarray(smoothed), expected, rtol=1e-3)


def test_cross_entropy_loss_is_float32_for_low_precision_logits():
    logits = jnp.asarray([[2.0, 0.0, -1.0]], jnp.bfloat16)
    loss = cross_entropy_loss(logits, jnp.asarray([0]), 3)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(loss), -_np_log_softmax(np.array([[2.0, 0.0, -1.0]]))[:, 0],
                               rtol=1e-5)


def test_top1_is_argmax_and_constant_or_non_finite_models_score_no_better_than_chance():
    labels = jnp.asarray([0, 1, 2, 3])
    constant = jnp.zeros((4, 10))
    np.testing.assert_array_equal(topk_correct(constant, labels, 1), [1, 0, 0, 0])  # argmax is class 0
    np.testing.assert_array_equal(topk_correct(constant, labels, 5), [1, 1, 1, 1])  # classes 0-4 first
    broken = jnp.asarray(np.random.default_rng(0).normal(size=(4, 10)), jnp.float32).at[:, 3].set(jnp.nan)
    np.testing.assert_array_equal(topk_correct(broken, labels, 1), [0, 0, 0, 0])
    np.testing.assert_array_equal(topk_correct(jnp.full((4, 10), jnp.inf), labels, 5), [0, 0, 0, 0])
    random_logits = jnp.asarray(np.random.default_rng(1).normal(size=(64, 10)), jnp.float32)
    random_labels = jnp.asarray(np.random.default_rng(2).integers(0, 10, 64))
    np.testing.assert_array_equal(topk_correct(random_logits, random_labels, 1),
                                  np.asarray(jnp.argmax(random_logits, -1) == random_labels, np.float32))


def test_topk_correct_hand_made_example():
    # Ranking as argmax / lax.top_k rank: of equal logits the lower class index comes first.
    logits = jnp.asarray(
        [
            [0.1, 0.5, 0.2, 0.9],  # label 1: one class (3) higher -> rank 2
            [0.1, 0.5, 0.2, 0.9],  # label 3: the maximum -> rank 1
            [0.1, 0.5, 0.2, 0.9],  # label 0: three classes higher -> rank 4
            [1.0, 1.0, 0.0, 0.0],  # label 1: tied with class 0, which comes first -> rank 2
            [2.0, 1.0, 1.0, 1.0],  # label 3: one class higher, two tied ahead of it -> rank 4
            [3.0, 3.0, 3.0, 3.0],  # label 2: all tied, classes 0 and 1 first -> rank 3
        ],
        jnp.float32,
    )
    labels = jnp.asarray([1, 3, 0, 1, 3, 2])
    expected = {
        1: [0, 1, 0, 0, 0, 0],
        2: [1, 1, 0, 1, 0, 0],
        3: [1, 1, 0, 1, 0, 1],
        4: [1, 1, 1, 1, 1, 1],
    }
    for k, values in expected.items():
        got = topk_correct(logits, labels, k)
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), np.asarray(values, np.float32), err_msg=f"k={k}")


def test_normalize_images_matches_numpy():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(2, 4, 5, 3), dtype=np.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expected = (images / 255.0 - np.asarray(mean)) / np.asarray(std)
    out = normalize_images(jnp.asarray(images), mean, std)
    assert out.dtype == jnp.float32
    assert out.shape == images.shape
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_normalize_images_refuses_non_uint8(dtype):
    with pytest.raises(TypeError, match="uint8"):
        normalize_images(jnp.zeros((1, 4, 4, 3), dtype), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


# --------------------------------------------------------------------------- weight-decay masks


def test_kernel_mask_on_resnet_params():
    model = models.create_model("resnet_tiny", 10, num_filters=8)
    variables = jax.eval_shape(functools.partial(model.init, train=False), jax.random.key(0),
                               jnp.zeros((1, 32, 32, 3)))
    params = variables["params"]
    mask = kernel_mask(params)
    leaves = jax.tree_util.tree_flatten_with_path(mask)[0]
    shapes = dict(jax.tree_util.tree_flatten_with_path(params)[0])

    kinds = {"conv_kernel": 0, "classifier_kernel": 0, "bn": 0, "classifier_bias": 0}
    for path, value in leaves:
        names = [k.key for k in path]
        rank = len(shapes[path].shape)
        if names[-1] == "kernel" and names[-2] == "classifier":
            kinds["classifier_kernel"] += 1
            assert rank == 2 and value, names
        elif names[-1] == "kernel":
            kinds["conv_kernel"] += 1
            assert rank == 4 and value, names
        elif names[-2] == "classifier":
            assert names[-1] == "bias"
            kinds["classifier_bias"] += 1
            assert not value, names
        else:
            assert names[-1] in ("scale", "bias") and "bn" in names[-2], names
            kinds["bn"] += 1
            assert not value, names
    # stem + 4 blocks x 2 convs + 3 downsample convs; scale and bias of the matching 12 BN layers.
    assert kinds == {"conv_kernel": 12, "classifier_kernel": 1, "bn": 24, "classifier_bias": 1}


def _small_params():
    return {
        "conv": {"kernel": jnp.ones((3, 3, 2, 2), jnp.float32)},
        "bn": {"scale": jnp.ones((2,), jnp.float32), "bias": jnp.ones((2,), jnp.float32)},
    }


def _optimizer_config(name, weight_decay=0.1, momentum=0.0, trust=0.001):
    config = get_base_config()
    config.optimizer.name = name
    config.optimizer.momentum = momentum
    config.optimizer.weight_decay = weight_decay
    config.optimizer.lars_trust_coefficient = trust
    return config


def _one_step(config, params, grads, lr):
    tx = create_optimizer(config, lr)
    updates, _ = tx.update(grads, tx.init(params), params)
    return updates


def test_sgd_weight_decay_skips_batch_norm():
    lr, wd = 0.5, 0.1
    params = _small_params()
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates = _one_step(_optimizer_config("sgd", wd), params, zero_grads, lr)

    np.testing.assert_allclose(np.asarray(updates["conv"]["kernel"]), -lr * wd * np.ones((3, 3, 2, 2)),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(updates["bn"]["scale"]), np.zeros(2))
    np.testing.assert_array_equal(np.asarray(updates["bn"]["bias"]), np.zeros(2))

    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.asarray(new["conv"]["kernel"]), np.full((3, 3, 2, 2), 1 - lr * wd),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(new["bn"]["scale"]), np.ones(2))
    np.testing.assert_array_equal(np.asarray(new["bn"]["bias"]), np.ones(2))


def test_sgd_step_with_gradients_and_schedule():
    lr, wd = 0.3, 0.01
    rng = np.random.default_rng(3)
    params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), _small_params())
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates = _one_step(_optimizer_config("sgd", wd), params, grads, lambda step: lr)
    w, g = np.asarray(params["conv"]["kernel"]), np.asarray(grads["conv"]["kernel"])
    np.testing.assert_allclose(np.asarray(updates["conv"]["kernel"]), -lr * (g + wd * w), rtol=1e-5)
    for name in ("scale", "bias"):
        np.testing.assert_allclose(np.asarray(updates["bn"][name]), -lr * np.asarray(grads["bn"][name]),
                                   rtol=1e-6)


def test_sgd_momentum_accumulates():
    config = _optimizer_config("sgd", weight_decay=0.0, momentum=0.9)
    params = {"w": jnp.ones((2, 2))}
    grads = {"w": jnp.ones((2, 2))}
    tx = create_optimizer(config, 1.0)
    state = tx.init(params)
    first, state = tx.update(grads, state, params)
    second, _ = tx.update(grads, state, params)
    np.testing.assert_allclose(np.asarray(first["w"]), -1.0)
    np.testing.assert_allclose(np.asarray(second["w"]), -1.9, rtol=1e-6)


def _np_lars_kernel_update(w, g, lr, wd, eta):
    # optax.scale_by_trust_ratio: trust = eta * ||w|| / ||u|| (1 where either norm is 0), u = g + wd * w.
    u = g + wd * w
    trust = eta * np.linalg.norm(w.ravel()) / np.linalg.norm(u.ravel())
    return -lr * trust * u


def test_lars_zero_gradients_decay_kernels_only():
    lr, wd, eta = 0.5, 0.1, 0.001
    params = _small_params()
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates = _one_step(_optimizer_config("lars", wd, trust=eta), params, zero_grads, lr)
    w = np.ones((3, 3, 2, 2))
    # u = wd * w, trust = eta / wd, so the update is -lr * eta * w.
    expected = _np_lars_kernel_update(w, np.zeros_like(w), lr, wd, eta)
    np.testing.assert_allclose(expected, -lr * eta * w)
    np.testing.assert_allclose(np.asarray(updates["conv"]["kernel"]), expected, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(updates["bn"]["scale"]), np.zeros(2))
    np.testing.assert_array_equal(np.asarray(updates["bn"]["bias"]), np.zeros(2))


def test_lars_trust_ratio_on_kernels_plain_step_elsewhere():
    lr, wd, eta = 0.5, 0.1, 0.02
    rng = np.random.default_rng(4)
    params = {
        "conv": {"kernel": rng.normal(size=(3, 3, 2, 2))},
        "bn": {"scale": rng.normal(size=(2,)), "bias": rng.normal(size=(2,))},
        "classifier": {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=(3,))},
    }
    grads = jax.tree.map(lambda p: rng.normal(size=p.shape) * 0.1, params)
    def to_jax(tree):
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)

    updates = _one_step(_optimizer_config("lars", wd, trust=eta), to_jax(params), to_jax(grads), lr)

    for layer in ("conv", "classifier"):
        expected = _np_lars_kernel_update(params[layer]["kernel"], grads[layer]["kernel"], lr, wd, eta)
        got = np.asarray(updates[layer]["kernel"])
        np.testing.assert_allclose(got, expected, rtol=1e-4, err_msg=layer)
        # The trust ratio really scales the step (far from the plain -lr * (g + wd * w)).
        plain = -lr * (grads[layer]["kernel"] + wd * params[layer]["kernel"])
        assert not np.allclose(got, plain, rtol=0.1)
    # BN parameters and the classifier bias: no decay and no trust ratio, the update is -lr * g.
    for layer, name in (("bn", "scale"), ("bn", "bias"), ("classifier", "bias")):
        np.testing.assert_allclose(np.asarray(updates[layer][name]), -lr * grads[layer][name], rtol=1e-5,
                                   err_msg=f"{layer}/{name}")


def test_create_optimizer_refuses_unknown_name():
    config = _optimizer_config("sgd")
    config.optimizer.name = "adam"
    with pytest.raises(ValueError, match="optimizer.name"):
        create_optimizer(config, 0.1)


# --------------------------------------------------------------------------- schedules

# 102,400 examples at batch 1024: 100 steps per epoch, 90 epochs = 9000 steps, 5-epoch warm-up = 500
# steps, peak 0.1 * 1024 / 256 = 0.4. The decay spans steps 500..9000 (8500 steps; midpoint 4750).
NUM_EXAMPLES = 102_400
PEAK = 0.4


def _schedule(name, **overrides):
    config = get_base_config()
    config.schedule.name = name
    for key, value in overrides.items():
        config.schedule[key] = value
    plan = derive(config, NUM_EXAMPLES, num_devices=8)
    assert (plan.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (100, 9000, 500)
    assert plan.peak_learning_rate == pytest.approx(PEAK)
    fn = create_learning_rate_schedule(config, plan)
    return lambda step: float(fn(step))


@pytest.mark.parametrize("name", ["cosine", "polynomial", "piecewise", "constant"])
def test_linear_warmup(name):
    lr = _schedule(name)
    assert lr(0) == 0.0
    assert lr(100) == pytest.approx(PEAK / 5)
    assert lr(250) == pytest.approx(PEAK / 2)
    assert lr(499) == pytest.approx(PEAK * 499 / 500)
    assert lr(500) == pytest.approx(PEAK)


def test_cosine_decay():
    lr = _schedule("cosine", end_learning_rate=0.0)
    assert lr(500) == pytest.approx(PEAK)
    assert lr(500 + 8500 // 4) == pytest.approx(PEAK * (1 + np.cos(np.pi / 4)) / 2, rel=1e-5)
    assert lr(4750) == pytest.approx(PEAK / 2, rel=1e-5)
    assert lr(9000) == pytest.approx(0.0, abs=1e-7)
    assert lr(9500) == pytest.approx(0.0, abs=1e-7)


def test_cosine_decay_to_end_learning_rate():
    end = 1e-3
    lr = _schedule("cosine", end_learning_rate=end)
    assert lr(500) == pytest.approx(PEAK)
    assert lr(4750) == pytest.approx((PEAK - end) / 2 + end, rel=1e-5)
    assert lr(9000) == pytest.approx(end, rel=1e-4)


def test_polynomial_decay():
    end = 1e-4
    lr = _schedule("polynomial", end_learning_rate=end, polynomial_power=2.0)
    assert lr(500) == pytest.approx(PEAK)
    assert lr(4750) == pytest.approx((PEAK - end) * 0.25 + end, rel=1e-5)
    assert lr(500 + 8500 // 4) == pytest.approx((PEAK - end) * 0.75**2 + end, rel=1e-5)
    assert lr(9000) == pytest.approx(end, rel=1e-4)


def test_piecewise_decay():
    lr = _schedule("piecewise", boundary_epochs=(30.0, 60.0, 80.0), decay_factor=0.1)
    expected = {
        500: PEAK,
        2999: PEAK,
        3000: PEAK * 0.1,
        5999: PEAK * 0.1,
        6000: PEAK * 0.01,
        7999: PEAK * 0.01,
        8000: PEAK * 0.001,
        8999: PEAK * 0.001,
    }
    for step, value in expected.items():
        assert lr(step) == pytest.approx(value, rel=1e-5), step


def test_piecewise_boundary_at_or_inside_warmup_still_applies():
    # Regression: boundaries at or before the end of warm-up used to be dropped silently.
    lr = _schedule("piecewise", boundary_epochs=(5.0, 60.0), decay_factor=0.1)
    assert lr(499) == pytest.approx(PEAK * 499 / 500)  # the warm-up still ramps to the peak
    assert lr(500) == pytest.approx(PEAK * 0.1)
    assert lr(5999) == pytest.approx(PEAK * 0.1)
    assert lr(6000) == pytest.approx(PEAK * 0.01)
    lr = _schedule("piecewise", boundary_epochs=(2.0, 60.0), decay_factor=0.1)
    assert lr(500) == pytest.approx(PEAK * 0.1)
    assert lr(6000) == pytest.approx(PEAK * 0.01)


def test_piecewise_boundaries_on_the_same_step_compound():
    lr = _schedule("piecewise", boundary_epochs=(30.0, 30.0), decay_factor=0.5)
    assert lr(2999) == pytest.approx(PEAK)
    assert lr(3000) == pytest.approx(PEAK * 0.25)


def test_constant_schedule():
    lr = _schedule("constant")
    for step in (500, 4750, 8999, 9000):
        assert lr(step) == pytest.approx(PEAK)


def test_schedule_without_warmup_starts_at_peak():
    config = get_base_config()
    config.schedule.warmup_steps = 0
    plan = derive(config, NUM_EXAMPLES, num_devices=8)
    fn = create_learning_rate_schedule(config, plan)
    assert float(fn(0)) == pytest.approx(PEAK)
    assert float(fn(4500)) == pytest.approx(PEAK / 2, rel=1e-5)  # midpoint of 9000 decay steps


def test_schedule_refuses_unknown_name():
    config = get_base_config()
    plan = derive(config, NUM_EXAMPLES, num_devices=8)
    config.schedule.name = "exponential"
    with pytest.raises(ValueError, match="schedule.name"):
        create_learning_rate_schedule(config, plan)


# --------------------------------------------------------------------------- loss scaling


@pytest.mark.parametrize(("dtype", "scaled"), [("float32", False), ("bfloat16", False), ("float16", True)])
def test_create_dynamic_scale(dtype, scaled):
    config = get_base_config()
    config.model.compute_dtype = dtype
    result = create_dynamic_scale(config)
    if scaled:
        assert isinstance(result, dynamic_scale_lib.DynamicScale)
    else:
        assert result is None
