"""ResNet v1.5 family: shapes, exact parameter counts (no compute), v1.5 strides, init, dtypes."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling import models
from resnet_scaling.models import cpu_lowering


def _abstract_variables(model, image_size=224):
    return jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)), train=False)
    )


def _count(tree):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_resnet50_has_exactly_the_published_parameter_and_bn_statistic_counts():
    variables = _abstract_variables(models.create_model("resnet50", 1000))
    assert _count(variables["params"]) == 25_557_032
    # mean and var for each of the 26,560 BN channels.
    assert _count(variables["batch_stats"]) == 53_120


@pytest.mark.parametrize(
    "name, expected",
    [("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet101", 44_549_160),
     ("resnet152", 60_192_808)],
)
def test_family_parameter_counts_match_torchvision(name, expected):
    assert _count(_abstract_variables(models.create_model(name, 1000))["params"]) == expected


def test_resnet200_builds_with_bottlenecks():
    variables = _abstract_variables(models.create_model("resnet200", 1000), image_size=64)
    assert "conv3" in variables["params"]["stage3_block36"]
    assert "stage2_block24" in variables["params"]


def test_logits_shape_and_dtype_for_every_architecture():
    for name in models.ARCHITECTURES:
        model = models.create_model(name, 7, num_filters=8)
        logits = jax.eval_shape(
            lambda m=model: m.init_with_output(jax.random.key(0), jnp.zeros((2, 64, 64, 3)), train=False)[0]
        )
        assert logits.shape == (2, 7) and logits.dtype == jnp.float32, name


def test_v1_5_strides_on_the_3x3_conv_of_the_first_bottleneck():
    model = models.create_model("resnet50", 1000)

    def intermediates():
        x = jnp.zeros((1, 224, 224, 3))
        variables = model.init(jax.random.key(0), x, train=False)
        _, state = model.apply(variables, x, train=False, capture_intermediates=True,
                               mutable=["intermediates"])
        return state["intermediates"]

    acts = jax.eval_shape(intermediates)["stage2_block1"]
    assert acts["conv1"]["__call__"][0].shape == (1, 56, 56, 128)  # 1x1: no stride (v1 had it here).
    assert acts["conv2"]["__call__"][0].shape == (1, 28, 28, 128)  # 3x3: stride 2.
    assert acts["downsample_conv"]["__call__"][0].shape == (1, 28, 28, 512)


def test_zero_init_of_last_bn_scale_is_switchable():
    conv = functools.partial(nn.Conv, use_bias=False)
    norm = functools.partial(nn.BatchNorm, use_running_average=True)
    x = jnp.zeros((1, 8, 8, 16))
    for zero_init, expected in ((True, 0.0), (False, 1.0)):
        block = models.BottleneckBlock(4, 1, conv, norm, zero_init_last_bn_scale=zero_init)
        params = block.init(jax.random.key(0), x)["params"]
        np.testing.assert_array_equal(params["bn3"]["scale"], expected)
        np.testing.assert_array_equal(params["bn1"]["scale"], 1.0)
    # The flag travels from the model to its blocks.
    model = models.create_model("resnet_tiny", 10, num_filters=8, zero_init_last_bn_scale=True)
    params = jax.jit(model.init, static_argnames="train")(
        jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)["params"]
    np.testing.assert_array_equal(params["stage2_block1"]["bn2"]["scale"], 0.0)
    np.testing.assert_array_equal(params["stage2_block1"]["downsample_bn"]["scale"], 1.0)


def test_conv_init_is_he_fan_out():
    model = models.create_model("resnet_tiny", 10, num_filters=64)
    init = jax.jit(model.init, static_argnames="train")
    params = init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)["params"]
    kernel = np.asarray(params["stage4_block1"]["conv2"]["kernel"])  # 3x3x512x512
    fan_out = 3 * 3 * 512
    assert kernel.std() == pytest.approx(np.sqrt(2.0 / fan_out), rel=0.02)
    assert abs(kernel.mean()) < 1e-3


def test_bn_uses_momentum_and_epsilon_from_arguments():
    model = models.create_model("resnet_tiny", 10, num_filters=8, bn_momentum=0.9, bn_epsilon=1e-5)
    bns = [m for m in _modules(model) if isinstance(m, nn.BatchNorm)]
    assert bns and all(bn.momentum == 0.9 and bn.epsilon == 1e-5 for bn in bns)


def _modules(model):
    found = []

    def interceptor(next_fun, args, kwargs, context):
        found.append(context.module)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=True))
    return found


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_computes_low_but_keeps_parameters_and_statistics_float32(dtype):
    model = models.create_model("resnet_tiny", 10, num_filters=8, dtype=dtype)
    x = jnp.ones((2, 32, 32, 3))
    variables = jax.jit(model.init, static_argnames="train")(jax.random.key(0), x, train=False)
    assert {v.dtype for v in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
    apply = jax.jit(functools.partial(model.apply, train=True, mutable=["batch_stats", "intermediates"],
                                      capture_intermediates=True))
    logits, state = apply(variables, x)
    assert logits.dtype == jnp.float32
    assert state["intermediates"]["stage1_block1"]["conv1"]["__call__"][0].dtype == jnp.dtype(dtype)
    assert {v.dtype for v in jax.tree.leaves(state["batch_stats"])} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("dtype, select_and_scatter",
                         [("float32", True), ("bfloat16", True), ("float16", False)])
def test_float16_pools_as_strided_maxima_on_accelerators_too(dtype, select_and_scatter):
    """XLA's GPU partitioner all-gathers a float16 select-and-scatter (the max pool's gradient) to the
    global batch (tests/planning/test_gpu_compile.py); float16 pools as strided maxima, whose gradient is
    elementwise, while float32 and bfloat16 keep `nn.max_pool` (their programs unchanged)."""
    model = models.create_model("resnet_tiny", 10, num_filters=8, dtype=dtype, lowering="xla")
    x = jnp.ones((2, 32, 32, 3))
    variables = jax.jit(model.init, static_argnames="train")(jax.random.key(0), x, train=False)

    def loss(params, x):
        logits, _ = model.apply({**variables, "params": params}, x, train=True, mutable=["batch_stats"])
        return logits.sum()

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=1))(variables["params"], x))
    assert ("select_and_scatter" in jaxpr) == select_and_scatter


def test_unknown_model_name_is_refused():
    with pytest.raises(ValueError, match="resnet50"):
        models.create_model("resnet51", 10)


@pytest.mark.parametrize("size", [8, 9, 112])
def test_max_pool_matches_flax_max_pool_values_and_gradient_mass(size):
    x = jax.random.normal(jax.random.key(size), (2, size, size, 3))
    expected = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    np.testing.assert_array_equal(cpu_lowering.max_pool_3x3_s2(x), expected)
    grad = jax.grad(lambda x: cpu_lowering.max_pool_3x3_s2(x).sum())(x)
    expected_grad = jax.grad(lambda x: nn.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1))).sum())(x)
    np.testing.assert_allclose(grad, expected_grad)  # No ties in random normals: the same argmax.


def test_pointwise_conv_equals_a_1x1_convolution_with_stride():
    x = jax.random.normal(jax.random.key(0), (2, 9, 9, 4))
    conv = cpu_lowering.PointwiseConv(6, strides=2)
    variables = conv.init(jax.random.key(1), x)
    assert variables["params"]["kernel"].shape == (1, 1, 4, 6)
    reference = nn.Conv(6, (1, 1), (2, 2), padding="VALID", use_bias=False).apply(variables, x)
    np.testing.assert_allclose(conv.apply(variables, x), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_features, out_features", [(4, 12), (12, 4), (6, 6)])
def test_pointwise_dot_gradients_equal_autodiff_of_the_plain_product(in_features, out_features):
    """The custom weight gradient (either operand transposed, whichever is narrower) is the same sum."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 3, in_features))
    w = jax.random.normal(jax.random.key(1), (in_features, out_features))
    g = jax.random.normal(jax.random.key(2), (2, 5, 3, out_features))

    def plain(x, w):
        return jnp.einsum("nhwc,cd->nhwd", x, w, precision="highest")

    def loss(f):
        return lambda x, w: jnp.vdot(f(x, w), g)

    np.testing.assert_allclose(cpu_lowering.pointwise_dot(x, w), plain(x, w), rtol=1e-5, atol=1e-5)
    got = jax.jit(jax.grad(loss(cpu_lowering.pointwise_dot), argnums=(0, 1)))(x, w)
    expected = jax.grad(loss(plain), argnums=(0, 1))(x, w)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, stride, pad, size, channels", [
    (3, 2, 1, 9, 5), (3, 2, 1, 8, 4), (7, 2, 3, 16, 3), (3, 1, 1, 5, 2), (2, 3, 0, 11, 3)])
def test_patch_grad_conv_equals_the_convolution_and_its_autodiff(kernel, stride, pad, size, channels):
    """The weight gradient over patches is XLA's own, whether or not the windows tile the image."""
    x = jax.random.normal(jax.random.key(0), (2, size, size, channels))
    w = jax.random.normal(jax.random.key(1), (kernel, kernel, channels, 6))
    strides, padding = (stride, stride), ((pad, pad), (pad, pad))

    def plain(x, w):
        return jax.lax.conv_general_dilated(x, w, strides, padding, precision="highest",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    out = cpu_lowering.patch_grad_conv(x, w, strides, padding)
    np.testing.assert_allclose(out, plain(x, w), rtol=1e-5, atol=1e-5)
    g = jax.random.normal(jax.random.key(2), out.shape)
    got = jax.jit(jax.grad(lambda x, w: jnp.vdot(cpu_lowering.patch_grad_conv(x, w, strides, padding), g),
                           argnums=(0, 1)))(x, w)
    expected = jax.grad(lambda x, w: jnp.vdot(plain(x, w), g), argnums=(0, 1))(x, w)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_cpu_lowering_uses_the_patch_gradient_for_strided_convolutions_only():
    model = models.create_model("resnet50", 10, num_filters=8, lowering="cpu")
    images = jnp.zeros((2, 32, 32, 3))
    jaxpr = str(jax.make_jaxpr(lambda v: model.apply(v, images, train=False))(
        jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))))
    # The stem and the 3x3 of stages 2-4's first blocks; the other 3x3s and the 1x1s are not.
    assert jaxpr.count("name=patch_grad_conv") == 4
    assert jaxpr.count("name=pointwise_dot") == 36


@pytest.mark.parametrize("name", ["resnet_tiny", "resnet50"])
def test_both_lowerings_have_the_same_parameters_outputs_and_gradients(name):
    """The CPU forms (1x1 convolutions as dots, max pooling as strided maxima) and XLA's own (nn.Conv,
    nn.max_pool) are one function: same variables, forward and gradients.

    Computed in float64, so that rounding is out of the question: in float32 the two forms' sums run in
    different orders, and how far apart that leaves ResNet-50's outputs depends on the CPU's vector width
    (on an AVX-512 machine 0.04% of a logit and 0.4% of a gradient leaf's largest value, past tolerances that
    had held on AVX2 ones). In float64 they agree to float32's last bit, where a wrong tap order is off by
    whole multiples.
    """
    # 64 pixels: ResNet-50's last stage is 2x2, so that training-mode BN normalises over 16 values a
    # channel, not over 4, whose tiny variances magnify any difference.
    size = 64
    with jax.enable_x64(True):
        cpu = models.create_model(name, 10, num_filters=8, lowering="cpu", dtype=jnp.float64)
        xla = models.create_model(name, 10, num_filters=8, lowering="xla", dtype=jnp.float64)
        images = jax.random.normal(jax.random.key(1), (4, size, size, 3), jnp.float64)
        shapes = jax.eval_shape(functools.partial(cpu.init, train=False), jax.random.key(0), images)
        xla_variables = jax.eval_shape(functools.partial(xla.init, train=False), jax.random.key(0), images)
        # Values drawn in NumPy, not the initialiser's (compiling ResNet-50's takes seconds, and it zeroes
        # each block's last BN scale, which would leave every residual branch's gradients zero, compared as
        # equal).
        rng = np.random.default_rng(0)

        def draw(path, leaf):
            name = path[-1].key
            if name == "kernel":  # He-scaled, so that the logits stay of order one through 50 layers.
                return rng.normal(0, np.sqrt(2 / np.prod(leaf.shape[:-1])), leaf.shape).astype(leaf.dtype)
            low, high = (0.5, 1.5) if name in ("scale", "var") else (-0.1, 0.1)
            return rng.uniform(low, high, leaf.shape).astype(leaf.dtype)

        variables = jax.tree_util.tree_map_with_path(draw, shapes)
        blocks = [block for key, block in variables["params"].items() if key.startswith("stage")]
        assert len(blocks) == (16 if name == "resnet50" else 4)
        assert jax.tree.structure(variables) == jax.tree.structure(xla_variables)
        assert [(a.shape, a.dtype) for a in jax.tree.leaves(variables)] == [
            (a.shape, a.dtype) for a in jax.tree.leaves(xla_variables)]

        def loss(params, model):
            logits, _ = model.apply({"params": params, "batch_stats": variables["batch_stats"]}, images,
                                    train=True, mutable=["batch_stats"])
            return jnp.sum(logits.astype(jnp.float64) ** 2), logits

        # One program per lowering: op by op, every layer shape of ResNet-50 would be compiled on its own.
        grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
        (_, logits_cpu), grads_cpu = grad(variables["params"], cpu)
        (_, logits_xla), grads_xla = grad(variables["params"], xla)
    # The logits and the (float32) parameters' gradients: float64 results rounded to float32 at the end.
    scale = float(np.max(np.abs(logits_xla)))
    assert 0.1 < scale < 100  # Of order one: differences below are measured against a live signal.
    np.testing.assert_allclose(logits_xla, logits_cpu, rtol=1e-6, atol=1e-7 * scale)
    # Every parameter takes part: no gradient is zero throughout (what a dead branch would give both forms).
    assert all(np.any(np.asarray(b) != 0) for b in jax.tree.leaves(grads_xla))
    for a, b in zip(jax.tree.leaves(grads_cpu), jax.tree.leaves(grads_xla), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7 * float(np.max(np.abs(b))))


def test_auto_lowering_follows_the_platform():
    assert models.resolve_lowering("auto", "cpu") == "cpu"
    assert models.resolve_lowering("auto", "tpu") == models.resolve_lowering("auto", "gpu") == "xla"
    assert models.resolve_lowering("xla", "cpu") == "xla"
    assert models.create_model("resnet_tiny", 10).lowering == "cpu"  # The tests run on CPU devices.
    with pytest.raises(ValueError, match="lowering"):
        models.resolve_lowering("fast", "cpu")


@pytest.mark.parametrize("backend, pointwise_dots", [("cpu", 36), ("gpu", 0), ("tpu", 0)])
def test_a_resnet_built_directly_uses_the_forms_of_the_backend_it_runs_on(monkeypatch, backend,
                                                                          pointwise_dots):
    """Research code that builds `ResNet(...)` itself, not through create_model, gets the platform's forms:
    on an accelerator, XLA's own convolutions and pooling (the CPU forms there would be slower)."""
    stage_sizes, block_cls = models.ARCHITECTURES["resnet50"]
    model = models.ResNet(stage_sizes=stage_sizes, block_cls=block_cls, num_classes=10, num_filters=8)
    images = jnp.zeros((2, 32, 32, 3))
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    jaxpr = str(jax.make_jaxpr(lambda v: model.apply(v, images, train=False))(
        jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))))
    assert jaxpr.count("name=pointwise_dot") == pointwise_dots
    # XLA's max pooling is one reduce_window; the CPU form is strided maxima.
    assert ("reduce_window_max" in jaxpr) == (backend != "cpu")
