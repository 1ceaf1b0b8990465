"""Batch norm over groups of images (the "distributed batch norm" of the TPU pod MLPerf submissions).

At 32k images per step the case study's authors normalised over groups of replicas (~128 images each).
Under `jit` the batch is one global array sharded over `data` (device d holds rows [d*b, (d+1)*b)), so
consecutive groups, [B, H, W, C] -> [G, B/G, H, W, C], are whole, consecutive devices; XLA's SPMD
partitioner reduces a group's statistics only over its devices: none for one device's images, else a
small all-reduce within the group (tests/models/test_batchnorm.py).

Same variables and numerics as `nn.BatchNorm`: parameter counts, checkpoints, torchvision import unchanged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class GroupedBatchNorm(nn.Module):
    """Batch norm whose training statistics are per group of `group_size` consecutive images.

    Each group gets its own mean and biased variance, in float32 as `nn.BatchNorm` (E[x^2] - E[x]^2,
    clipped at 0). Running averages move towards the global mean and the mean within-group variance.
    Evaluation (`use_running_average=True`) is `nn.BatchNorm`'s.

    Attributes:
      group_size: images per group; the training batch must be a multiple of it.
      dtype: output dtype (default: inferred, as `nn.BatchNorm`).
      scale_init: zeros for the last BN of a residual branch.
    """

    group_size: int
    use_running_average: bool | None = None
    momentum: float = 0.99
    epsilon: float = 1e-5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    scale_init: Any = nn.initializers.ones
    bias_init: Any = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
        """Normalises NHWC `x` over (images of a group, height, width) per channel."""
        use_running_average = nn.merge_param("use_running_average", self.use_running_average,
                                             use_running_average)
        features = x.shape[-1]
        # Created in the order and with the initialisers of nn.BatchNorm, so the variables match.
        ra_mean = self.variable("batch_stats", "mean", lambda s: jnp.zeros(s, jnp.float32), (features,))
        ra_var = self.variable("batch_stats", "var", lambda s: jnp.ones(s, jnp.float32), (features,))
        scale = self.param("scale", self.scale_init, (features,), self.param_dtype)
        bias = self.param("bias", self.bias_init, (features,), self.param_dtype)

        if use_running_average:
            mean, var = ra_mean.value, ra_var.value
            y = x
        else:
            batch = x.shape[0]
            if self.group_size <= 0 or batch % self.group_size:
                raise ValueError(
                    f"GroupedBatchNorm: a batch of {batch} images does not split into groups of "
                    f"{self.group_size}; set config.model.bn_group_size to a divisor of the batch.")
            num_groups = batch // self.group_size
            # Consecutive rows form a group: whole, consecutive devices (module docstring).
            y = x.reshape(num_groups, self.group_size, *x.shape[1:])
            reduction_axes = tuple(range(1, y.ndim - 1))
            stats_input = y.astype(jnp.promote_types(y.dtype, jnp.float32))
            mean = jnp.mean(stats_input, reduction_axes, keepdims=True)
            mean_of_squares = jnp.mean(jnp.square(stats_input), reduction_axes, keepdims=True)
            var = jnp.maximum(0.0, mean_of_squares - jnp.square(mean))
            if not self.is_initializing():
                flat_axes = tuple(range(y.ndim - 1))  # over groups (the others have size 1)
                ra_mean.value = (self.momentum * ra_mean.value
                                 + (1 - self.momentum) * jnp.mean(mean, flat_axes))
                ra_var.value = (self.momentum * ra_var.value
                                + (1 - self.momentum) * jnp.mean(var, flat_axes))

        # The same arithmetic as flax's _normalize, so the whole-batch group gives nn.BatchNorm's output.
        multiplier = jax.lax.rsqrt(var + self.epsilon) * scale
        out = (y - mean) * multiplier + bias
        dtype = self.dtype if self.dtype is not None else jnp.result_type(x, scale, bias)
        return jnp.asarray(out.reshape(x.shape), dtype)
