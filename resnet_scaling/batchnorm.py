"""Batch norm over groups of images (the "distributed batch norm" of the TPU pod MLPerf submissions).

At 32k images per step the case study's authors normalised over groups of replicas (~128 images each)
rather than the whole batch. Under `jit` the batch is one global array sharded over the mesh's `data`
axis, device d holding rows [d*b, (d+1)*b); so splitting the batch axis into consecutive groups,
[B, H, W, C] -> [G, B/G, H, W, C], gives groups made of whole, consecutive devices. XLA's SPMD partitioner
then reduces each group's statistics only over the devices that hold it: none when a group is one
device's images, a small all-reduce within each group of devices otherwise (see tests/test_batchnorm.py).

`GroupedBatchNorm` has exactly `nn.BatchNorm`'s variables (params `scale`, `bias`; batch_stats `mean`,
`var`) and numerics, so parameter counts, checkpoints and the torchvision import are unchanged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class GroupedBatchNorm(nn.Module):
    """Batch norm whose training statistics are per group of `group_size` consecutive images.

    Training normalises each group with its own mean and (biased) variance, computed in float32 as
    `nn.BatchNorm` does (E[x^2] - E[x]^2, clipped at 0). The running averages move towards the mean over
    groups of the group statistics: the global mean, and the average within-group variance. Evaluation
    (`use_running_average=True`) is the same as `nn.BatchNorm`'s.

    Attributes:
      group_size: images per group; the batch given in training must be a multiple of it.
      use_running_average: normalise with the running averages (evaluation) instead of the batch.
      momentum: decay of the running averages.
      epsilon: added to the variance.
      dtype: dtype of the output (default: inferred, as `nn.BatchNorm`).
      param_dtype: dtype of `scale` and `bias`.
      scale_init: initialiser of `scale` (zeros for the last BN of a residual branch).
      bias_init: initialiser of `bias`.
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
            # Consecutive rows form a group; with the batch sharded over `data`, a group is a run of
            # consecutive devices.
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
