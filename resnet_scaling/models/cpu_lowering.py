"""Forms of ResNet's layers that XLA's CPU backend runs faster: the model's "cpu" lowering.

Each has the parameters and values of the layer it stands for (`nn.Conv`, `nn.max_pool`; tests compare
forward and gradients): `PointwiseConv` (1x1 convolutions as matrix products), `max_pool_3x3_s2` (strided
maxima), `PatchGradConv` (strided convolutions, the stem's 7x7 and first blocks' 3x3s, whose weight
gradient is one product over patches). Timings here: a 2-core x86-64 machine, jax 0.10.2
(benchmarks/README.md). Accelerators get `nn.Conv` and `nn.max_pool` (the "xla" lowering) directly.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# He initialisation with fan-out, as torchvision's kaiming_normal_(mode="fan_out").
conv_kernel_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class PointwiseConv(nn.Module):
    """A 1x1 convolution as a matrix product over channels (same `kernel` [1, 1, in, out]).

    XLA:CPU runs 1x1 convolutions, above all their weight gradients, several times slower than the dot
    (weight gradient 6 vs 44 GFLOP/s, benchmarks/README.md); GPUs and TPUs lower both to the same units.
    """

    features: int
    strides: int = 1
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: Any = conv_kernel_init

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (1, 1, x.shape[-1], self.features), self.param_dtype)
        if self.strides > 1:  # A strided 1x1 convolution without padding reads every s-th pixel.
            x = x[:, :: self.strides, :: self.strides, :]
        x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
        return pointwise_dot(x, kernel[0, 0])


def _channel_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


@jax.custom_vjp
def pointwise_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out], whose weight gradient transposes the operand with fewer channels."""
    return _channel_dot(x, w)


def _pointwise_dot_fwd(x, w):
    return _channel_dot(x, w), (x, w)


def _pointwise_dot_bwd(residuals, g):
    # The weight gradient contracts the activations' major axis, so XLA:CPU transposes one operand, often
    # the wider (a 64 -> 256 expansion's output gradient); the narrower is up to 4x fewer bytes.
    x, w = residuals
    dx = jax.lax.dot_general(g, w, (((g.ndim - 1,), (1,)), ((), ())))
    xf, gf = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    if xf.shape[1] <= gf.shape[1]:
        dw = jax.lax.dot_general(xf, gf, (((0,), (0,)), ((), ())))
    else:
        dw = jax.lax.dot_general(gf, xf, (((0,), (0,)), ((), ()))).T
    return dx, dw


pointwise_dot.defvjp(_pointwise_dot_fwd, _pointwise_dot_bwd)


def max_pool_3x3_s2(x: jax.Array) -> jax.Array:
    """3x3 max pooling, stride 2, padding 1 (as torchvision), as strided maxima.

    `nn.max_pool`'s values, but the gradient is elementwise selects, not select-and-scatter (~6x slower on
    CPUs; accelerators fuse either). Separable: max of 3 strided rows, then columns (4 maxima, not 8).
    """
    height, width = -(-x.shape[1] // 2), -(-x.shape[2] // 2)
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-jnp.inf)
    rows = [padded[:, i : i + 2 * height : 2] for i in range(3)]
    rows = jnp.maximum(jnp.maximum(rows[0], rows[1]), rows[2])
    cols = [rows[:, :, j : j + 2 * width : 2] for j in range(3)]
    return jnp.maximum(jnp.maximum(cols[0], cols[1]), cols[2])


Padding = tuple[tuple[int, int], tuple[int, int]]


def _conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding: Padding) -> jax.Array:
    return jax.lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_patches(x: jax.Array, kernel_size: tuple[int, int], strides: tuple[int, int],
                 padding: Padding) -> jax.Array:
    """The input window of every output pixel: [N, H', W', KH * KW * C], taps in HWIO's (kh, kw, c) order."""
    (kh_size, kw_size), (sh, sw) = kernel_size, strides
    padded = jnp.pad(x, ((0, 0), *padding, (0, 0)))
    out_h = (padded.shape[1] - kh_size) // sh + 1
    out_w = (padded.shape[2] - kw_size) // sw + 1
    taps = [padded[:, kh : kh + sh * (out_h - 1) + 1 : sh, kw : kw + sw * (out_w - 1) + 1 : sw]
            for kh in range(kh_size) for kw in range(kw_size)]
    return jnp.concatenate(taps, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def patch_grad_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding: Padding) -> jax.Array:
    """An NHWC x HWIO convolution whose weight gradient is one matrix product over `conv_patches`."""
    return _conv(x, w, strides, padding)


def _patch_grad_conv_fwd(x, w, strides, padding):
    return _conv(x, w, strides, padding), (x, w)


def _patch_grad_conv_bwd(strides, padding, residuals, g):
    # XLA:CPU's weight gradient of a strided convolution (a stride-dilated convolution) is slower than one
    # product of patches and output gradient: ResNet-50's stem 60 -> 40 ms, its stride-2 3x3s 1.17x faster
    # with input gradients, batch 16, 2 cores (benchmarks/cpu_lowering.py). Input gradient: XLA's (dead
    # for the stem).
    x, w = residuals
    _, input_vjp = jax.vjp(lambda x: _conv(x, w, strides, padding), x)
    (dx,) = input_vjp(g)
    patches = conv_patches(x, w.shape[:2], strides, padding)
    patches, g_rows = patches.reshape(-1, patches.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = jax.lax.dot_general(patches, g_rows, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return dx, dw.reshape(w.shape).astype(w.dtype)


patch_grad_conv.defvjp(_patch_grad_conv_fwd, _patch_grad_conv_bwd)


class PatchGradConv(nn.Module):
    """A bias-free convolution with explicit padding whose weight gradient is `patch_grad_conv`'s (the
    same `kernel` [KH, KW, in, out] as `nn.Conv`)."""

    features: int
    kernel_size: tuple[int, int]
    strides: tuple[int, int]
    padding: Padding
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: Any = conv_kernel_init

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (*self.kernel_size, x.shape[-1], self.features),
                            self.param_dtype)
        x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
        return patch_grad_conv(x, kernel, tuple(self.strides), tuple(map(tuple, self.padding)))
