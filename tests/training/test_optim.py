"""Tests for the loss and metrics helpers (`resnet_scaling.training.steps`) and
`resnet_scaling.training.optim`.

References are NumPy hand computations (float64) of the formulas the docstrings state, and NumPy
transcriptions of the reference code the pod's recipe comes from (each names its file and commit): LARS as
TensorFlow 1.12.0 shipped it and as TensorFlow >= 1.13 / MLPerf / flax.optim define it, tensorflow/tpu
r1.12's learning-rate schedules.
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import dynamic_scale as dynamic_scale_lib

from resnet_scaling import models
from resnet_scaling.config import get_base_config
from resnet_scaling.config.plan import derive
from resnet_scaling.training import sections
from resnet_scaling.training.optim import (
    create_dynamic_scale,
    create_learning_rate_schedule,
    create_optimizer,
    kernel_mask,
)
from resnet_scaling.training.steps import cross_entropy_loss, normalize_images, topk_correct

CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"

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
    tx = create_optimizer(sections.read(config).optimizer, lr)
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
    tx = create_optimizer(sections.read(config).optimizer, 1.0)
    state = tx.init(params)
    first, state = tx.update(grads, state, params)
    second, _ = tx.update(grads, state, params)
    np.testing.assert_allclose(np.asarray(first["w"]), -1.0)
    np.testing.assert_allclose(np.asarray(second["w"]), -1.9, rtol=1e-6)


def _np_optax_lars_kernel_update(w, g, lr, wd, eta):
    # optax.lars: add_decayed_weights -> scale_by_trust_ratio (eta * ||w|| / ||u||, u = g + wd * w) -> -lr.
    u = g + wd * w
    trust = eta * np.linalg.norm(w.ravel()) / np.linalg.norm(u.ravel())
    return -lr * trust * u


def test_optax_lars_by_name_is_optax_formula():
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

    updates = _one_step(_optimizer_config("optax_lars", wd, trust=eta), to_jax(params), to_jax(grads), lr)
    for layer in ("conv", "classifier"):
        expected = _np_optax_lars_kernel_update(params[layer]["kernel"], grads[layer]["kernel"], lr, wd, eta)
        np.testing.assert_allclose(np.asarray(updates[layer]["kernel"]), expected, rtol=1e-4, err_msg=layer)
    for layer, name in (("bn", "scale"), ("bn", "bias"), ("classifier", "bias")):
        np.testing.assert_allclose(np.asarray(updates[layer][name]), -lr * grads[layer][name], rtol=1e-5)


# --------------------------------------------------------------------------- LARS against its references

# NumPy transcriptions, per variable, with TensorFlow's variable names deciding the skip list, as the
# references do (`skip_list=['batch_normalization', 'bias']`: a substring of the variable's name).
SKIP_LIST = ("batch_normalization", "bias")
N_IMAGENET = 1_281_167


def _tf_name(path: tuple[str, ...]) -> str:
    # The library's batch-norm layers are named bn*, stem_bn, downsample_bn; TensorFlow's resnet_model.py
    # names them batch_normalization*; dense and conv leaves keep "kernel" and "bias".
    return "/".join("batch_normalization" if "bn" in part else part for part in path)


def _np_trust_ratio(var, grad, wd, eeta, epsilon):
    """compute_lr's trust ratio, the same in every reference: 1 where either norm is 0."""
    w_norm = np.linalg.norm(var.ravel())
    g_norm = np.linalg.norm(grad.ravel())
    return eeta * w_norm / (g_norm + wd * w_norm + epsilon) if w_norm > 0 and g_norm > 0 else 1.0


def _np_tf112_step(name, var, accum, grad, lr, momentum, wd, eeta=0.001, epsilon=0.0):
    """TensorFlow 1.12.0 (wheel tensorflow-1.12.0-cp36-cp36m-manylinux1_x86_64.whl, sha256
    531619ad1c17b4084d09f442a9171318af813e81aae748e5de8274d561461749):
    tensorflow/contrib/opt/python/training/lars_optimizer.py LARSOptimizer.compute_lr and _apply_dense
    (training_ops.apply_momentum: accum = accum * momentum + grad; var -= lr * accum), with the gradient of
    tensorflow/tpu r1.12 resnet_main.py's loss term `weight_decay * l2_loss(v)` for every variable whose
    name lacks 'batch_normalization'. Returns (var - new var, new accum)."""
    if "batch_normalization" not in name:
        grad = grad + wd * var
    scaled_lr = lr
    if not any(s in name for s in SKIP_LIST):
        scaled_lr = lr * _np_trust_ratio(var, grad, wd, eeta, epsilon)
    accum = accum * momentum + grad
    return -scaled_lr * accum, accum


def _np_reference_step(name, var, accum, grad, lr, momentum, wd, eeta=0.001, epsilon=0.0):
    """flax.optim.LARS.apply_param_gradient (flax 0.3, used by the MLPerf v0.7 Google JAX submission) and
    tf.contrib.opt.LARSOptimizer from TensorFlow 1.13 on (compute_lr adds `weight_decay * var` to the
    gradient; apply_momentum with lr 1 and `grad * scaled_lr`), skipped variables plain momentum."""
    scaled_lr = lr
    if not any(s in name for s in SKIP_LIST):
        scaled_lr = lr * _np_trust_ratio(var, grad, wd, eeta, epsilon)
        grad = grad + wd * var
    accum = accum * momentum + grad * scaled_lr
    return -accum, accum


def _np_poly_rate_schedule(step, batch, num_images, train_steps, plr, w_epochs):
    """tensorflow/tpu models/official/resnet/lars_util.py poly_rate_schedule (branch r1.12, commit
    3e61779b1bea; same formula on master), with resnet_main.py's float32 current_epoch, and
    tf.train.polynomial_decay(plr, max(1, step - w_steps), train_steps - w_steps + 1, power=2.0,
    end_learning_rate=0.0001 (its default))."""
    steps_per_epoch = np.float32(num_images / batch)
    current_epoch = np.float32(step) / steps_per_epoch
    wrate = plr * current_epoch / w_epochs
    w_steps = int(w_epochs * num_images // batch)
    decay_steps = train_steps - w_steps + 1
    global_step = min(max(1, step - w_steps), decay_steps)
    poly_rate = (plr - 0.0001) * (1 - global_step / decay_steps) ** 2.0 + 0.0001
    return wrate if current_epoch <= w_epochs else poly_rate


def _np_piecewise_schedule(step, batch, num_images, base_learning_rate=0.1):
    """tensorflow/tpu r1.12 models/official/resnet/resnet_main.py learning_rate_schedule with LR_SCHEDULE
    [(1.0, 5), (0.1, 30), (0.01, 60), (0.001, 80)]."""
    scaled_lr = base_learning_rate * (batch / 256.0)
    current_epoch = np.float32(step) / np.float32(num_images / batch)
    schedule = [(1.0, 5), (0.1, 30), (0.01, 60), (0.001, 80)]
    decay_rate = scaled_lr * schedule[0][0] * current_epoch / schedule[0][1]
    for mult, start_epoch in schedule:
        decay_rate = decay_rate if current_epoch < start_epoch else scaled_lr * mult
    return decay_rate


def _load_shipped(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, CONFIGS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _relative_error(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    scale = np.linalg.norm(expected.ravel())
    return np.linalg.norm((got - expected).ravel()) / (scale if scale > 0 else 1.0)


@pytest.mark.parametrize("name, batch, train_steps, plr, w_epochs", [
    ("pod", 32_768, 3_558, 34.0, 12),
    ("tpu_v2_128", 16_384, 7_116, 25.0, 5),
])
def test_case_study_lars_schedule_is_r1_12_lars_util_at_every_step(name, batch, train_steps, plr, w_epochs):
    config = _load_shipped(name)
    plan = derive(config, N_IMAGENET, num_devices=config.mesh.num_devices)
    assert (plan.global_batch_size, plan.total_steps) == (batch, train_steps)
    fn = jax.jit(create_learning_rate_schedule(sections.read(config).schedule, plan))
    steps = np.arange(train_steps)
    got = np.asarray(jax.vmap(fn)(jnp.asarray(steps)))
    expected = np.asarray([_np_poly_rate_schedule(int(t), batch, N_IMAGENET, train_steps, plr, w_epochs)
                           for t in steps])
    rel = np.abs(got - expected) / np.abs(expected).clip(min=1e-12)
    assert rel[1:].max() < 1e-5, (int(rel[1:].argmax()) + 1, rel[1:].max())
    assert got[0] == expected[0] == 0.0
    # The peak and the last step, as lars_util puts them.
    w_steps = w_epochs * N_IMAGENET // batch
    assert got[w_steps] == pytest.approx(plr * w_steps / (w_epochs * N_IMAGENET / batch), rel=1e-6)
    assert got[-1] == pytest.approx(1e-4 + (plr - 1e-4) * (1 - (train_steps - 1 - w_steps)
                                                           / (train_steps - w_steps + 1)) ** 2, rel=1e-5)


def test_case_study_momentum_schedule_is_r1_12_resnet_main_at_every_step():
    config = _load_shipped("tpu_v2_8")
    plan = derive(config, N_IMAGENET, num_devices=8)
    fn = jax.jit(jax.vmap(create_learning_rate_schedule(sections.read(config).schedule, plan)))
    steps = np.arange(plan.total_steps)
    got = np.asarray(fn(jnp.asarray(steps)))
    expected = np.asarray([_np_piecewise_schedule(int(t), 1024, N_IMAGENET) for t in steps])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    # The boundaries fall on the first step at or past the fractional epoch: 30 x 1251.14 = 37534.2.
    assert got[37_534] == pytest.approx(0.4) and got[37_535] == pytest.approx(0.04)


def _lars_params():
    """A resnet_tiny parameter tree with the leaves the references treat specially: a kernel of zeros, a
    kernel whose gradient is always zero, and zero-initialised last BN scales (model init)."""
    model = models.create_model("resnet_tiny", 10, num_filters=4)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), variables["params"])
    params["stage2_block1"]["conv1"]["kernel"] = np.zeros_like(params["stage2_block1"]["conv1"]["kernel"])
    assert not params["stage1_block1"]["bn2"]["scale"].any()  # zero-init last BN gamma
    return params


@pytest.mark.parametrize("config_name, variant, oracle", [
    ("pod", "tf1.12", _np_tf112_step),
    ("tensorflow_tpu_lars", "reference", _np_reference_step),
])
def test_lars_matches_its_reference_per_leaf_through_warmup_and_decay(config_name, variant, oracle):
    from flax import traverse_util

    from resnet_scaling.config import recipes

    config = _load_shipped("pod")
    if config_name == "tensorflow_tpu_lars":
        recipes.use_tensorflow_tpu_lars(config)
    assert config.optimizer.lars_variant == variant
    # The pod's recipe on a 144,000-image epoch: 400 steps with a 52.7-step warm-up (12 or 14 epochs
    # of 4.39 steps), so that a few hundred steps cross warm-up and the whole decay.
    num_images = 144_000
    plan = derive(config, num_images, num_devices=512)
    assert plan.total_steps == 400
    schedule = create_learning_rate_schedule(sections.read(config).schedule, plan)
    tx = create_optimizer(sections.read(config).optimizer, schedule)
    update = jax.jit(tx.update)

    rng = np.random.default_rng(7)
    params = _lars_params()
    flat_names = {path: _tf_name(path) for path in traverse_util.flatten_dict(params)}
    state = tx.init(params)
    accums = {path: np.zeros(v.shape) for path, v in traverse_util.flatten_dict(params).items()}
    momentum, wd = config.optimizer.momentum, config.optimizer.weight_decay
    table = _np_poly_rate_schedule if variant == "tf1.12" else None
    worst = 0.0
    ratios = []
    for step in range(plan.total_steps):
        flat_params = traverse_util.flatten_dict(params)
        # Gradients whose size against wd * |w| sweeps 0.01..10 across steps; one kernel's is always 0.
        scale = 10.0 ** rng.uniform(-5, -1)
        grads = {path: (rng.normal(size=v.shape) * scale).astype(np.float32)
                 for path, v in flat_params.items()}
        zero = ("stage3_block1", "conv2", "kernel")
        grads[zero] = np.zeros_like(grads[zero])
        if table is not None:
            lr = table(step, 32_768, num_images, 400, 34.0, 12)
        else:
            lr = _np_poly_rate_schedule(step, 32_768, num_images, 400, 32.0, 14)
        assert float(schedule(step)) == pytest.approx(lr, rel=1e-5, abs=1e-12)
        updates, state = update(traverse_util.unflatten_dict(grads), state, params)
        flat_updates = traverse_util.flatten_dict(updates)
        flat_momentum = traverse_util.flatten_dict(state.momentum)
        for path, w in flat_params.items():
            expected_update, accums[path] = oracle(flat_names[path], w.astype(np.float64), accums[path],
                                                   grads[path].astype(np.float64), lr, momentum, wd)
            err = _relative_error(flat_updates[path], expected_update)
            worst = max(worst, err)
            assert err < 1e-5, (step, path, err)
            assert _relative_error(flat_momentum[path], accums[path]) < 1e-5, (step, path)
            if path[-1] == "kernel" and np.linalg.norm(grads[path]) > 0:
                ratios.append(wd * np.linalg.norm(w) / np.linalg.norm(grads[path]))
            # Keep the library's trajectory and the reference's accumulators in step with each other.
            accums[path] = np.asarray(flat_momentum[path], np.float64)
        params = jax.tree.map(lambda w, u: (w + np.asarray(u)).astype(np.float32), params, updates)
    assert worst < 1e-5
    assert min(ratios) < 0.01 and max(ratios) > 1.0  # the sweep covered the regimes that differ


def test_lars_variants_differ_where_the_references_differ():
    # One kernel, wd * |w| / |g| = 1: optax's trust ratio divides by |g + wd * w|, the references by
    # |g| + wd * |w|; and a zero gradient: the reference keeps trust 1, TF 1.12 sees the L2 gradient.
    w = np.ones((4, 4), np.float32)
    wd, lr, eta = 1e-4, 1.0, 1e-3
    g_zero = np.zeros_like(w)
    results = {}
    for name in ("lars", "optax_lars"):
        config = _optimizer_config(name, wd, momentum=0.0, trust=eta)
        config.optimizer.lars_variant = "reference"
        results[name] = np.asarray(_one_step(config, {"k": jnp.asarray(w)}, {"k": jnp.asarray(g_zero)},
                                             lr)["k"])
    np.testing.assert_allclose(results["lars"], -lr * wd * w, rtol=1e-6)  # trust 1, update lr * wd * w
    np.testing.assert_allclose(results["optax_lars"], -lr * eta * w, rtol=1e-5)  # trust eta / wd = 10
    config = _optimizer_config("lars", wd, momentum=0.0, trust=eta)
    config.optimizer.lars_variant = "tf1.12"
    tf112 = np.asarray(_one_step(config, {"k": jnp.asarray(w)}, {"k": jnp.asarray(g_zero)}, lr)["k"])
    np.testing.assert_allclose(tf112, -lr * (eta / (2 * wd)) * wd * w, rtol=1e-5)  # trust eta / (2 wd)


def test_lars_refuses_unknown_variant_and_missing_params():
    from resnet_scaling.training.optim import lars

    with pytest.raises(ValueError, match="variant"):
        lars(0.1, variant="tf2")
    tx = lars(0.1)
    params = {"k": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))


def test_create_optimizer_refuses_unknown_name():
    config = _optimizer_config("sgd")
    config.optimizer.name = "adam"
    with pytest.raises(ValueError, match="optimizer.name"):
        create_optimizer(sections.read(config).optimizer, 0.1)


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
    fn = create_learning_rate_schedule(sections.read(config).schedule, plan)
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
    # lars_util's count: polynomial_decay(peak, step - 500, 9000 - 500 + 1, power=2), so the last step
    # (8999) stays (2 / 8501)^2 of the way above the end.
    end = 1e-4
    lr = _schedule("polynomial", end_learning_rate=end, polynomial_power=2.0)
    assert lr(500) == pytest.approx(PEAK)
    assert lr(4750) == pytest.approx((PEAK - end) * (4251 / 8501) ** 2 + end, rel=1e-5)
    assert lr(500 + 8500 // 4) == pytest.approx((PEAK - end) * (6376 / 8501) ** 2 + end, rel=1e-5)
    assert lr(8999) == pytest.approx((PEAK - end) * (2 / 8501) ** 2 + end, rel=1e-5)
    assert lr(9600) == pytest.approx(end, rel=1e-6)


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
    fn = create_learning_rate_schedule(sections.read(config).schedule, plan)
    assert float(fn(0)) == pytest.approx(PEAK)
    assert float(fn(4500)) == pytest.approx(PEAK / 2, rel=1e-5)  # midpoint of 9000 decay steps


def test_schedule_refuses_unknown_name():
    config = get_base_config()
    plan = derive(config, NUM_EXAMPLES, num_devices=8)
    config.schedule.name = "exponential"
    with pytest.raises(ValueError, match="schedule.name"):
        create_learning_rate_schedule(sections.read(config).schedule, plan)


# --------------------------------------------------------------------------- loss scaling


@pytest.mark.parametrize(("dtype", "scaled"), [("float32", False), ("bfloat16", False), ("float16", True)])
def test_create_dynamic_scale(dtype, scaled):
    config = get_base_config()
    config.model.compute_dtype = dtype
    result = create_dynamic_scale(config.model.compute_dtype)
    if scaled:
        assert isinstance(result, dynamic_scale_lib.DynamicScale)
    else:
        assert result is None
