"""ResNet v1.5 in Flax (NHWC), the family from ResNet-18 to ResNet-200 plus a tiny test model.

v1.5 (as in torchvision and the MLPerf reference) puts the stride of a stage's first bottleneck on its
3x3 convolution rather than on its first 1x1. Convolutions pad symmetrically, as TF's `fixed_padding`
and PyTorch do, so that torchvision weights give the same outputs here (see `weights.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

ModuleDef = Any

# He initialisation with fan-out, as torchvision's kaiming_normal_(mode="fan_out").
conv_kernel_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# The MLPerf reference initialises the classifier with a small normal.
dense_kernel_init = nn.initializers.normal(stddev=0.01)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34)."""

    filters: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef
    zero_init_last_bn_scale: bool

    expansion = 1

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)),
                      name="conv1")(x)
        y = nn.relu(self.norm(name="bn1")(y))
        y = self.conv(self.filters, (3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
        last_scale_init = nn.initializers.zeros if self.zero_init_last_bn_scale else nn.initializers.ones
        y = self.norm(scale_init=last_scale_init, name="bn2")(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), (self.strides, self.strides), padding="VALID",
                                 name="downsample_conv")(residual)
            residual = self.norm(name="downsample_bn")(residual)
        return nn.relu(residual + y)


class BottleneckBlock(nn.Module):
    """1x1 reduce, 3x3 (strided, v1.5), 1x1 expand by 4 (ResNet-50 and deeper)."""

    filters: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef
    zero_init_last_bn_scale: bool

    expansion = 4

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (1, 1), name="conv1")(x)
        y = nn.relu(self.norm(name="bn1")(y))
        y = self.conv(self.filters, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)),
                      name="conv2")(y)
        y = nn.relu(self.norm(name="bn2")(y))
        y = self.conv(self.filters * self.expansion, (1, 1), name="conv3")(y)
        last_scale_init = nn.initializers.zeros if self.zero_init_last_bn_scale else nn.initializers.ones
        y = self.norm(scale_init=last_scale_init, name="bn3")(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters * self.expansion, (1, 1), (self.strides, self.strides),
                                 padding="VALID", name="downsample_conv")(residual)
            residual = self.norm(name="downsample_bn")(residual)
        return nn.relu(residual + y)


class ResNet(nn.Module):
    """ResNet v1.5 classifier on NHWC images that are already normalised.

    Attributes:
      stage_sizes: blocks per stage.
      block_cls: `BasicBlock` or `BottleneckBlock`.
      num_classes: classifier width.
      num_filters: channels of the stem and of the first stage's blocks; doubled per stage.
      dtype: compute dtype of activations; parameters and BN statistics stay float32.
      bn_momentum: decay of the BN moving averages.
      bn_epsilon: added to the BN variance.
      zero_init_last_bn_scale: start each residual branch at zero (Goyal et al.).
    """

    stage_sizes: Sequence[int]
    block_cls: type[nn.Module]
    num_classes: int
    num_filters: int = 64
    dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    zero_init_last_bn_scale: bool = True

    @nn.compact
    def __call__(self, x, train: bool = True):
        """Returns float32 logits of shape [batch, num_classes]."""
        conv = functools.partial(
            nn.Conv, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32,
            kernel_init=conv_kernel_init,
        )
        norm = functools.partial(
            nn.BatchNorm,
            use_running_average=not train,
            momentum=self.bn_momentum,
            epsilon=self.bn_epsilon,
            dtype=self.dtype,
            param_dtype=jnp.float32,
        )
        x = x.astype(self.dtype)
        x = conv(self.num_filters, (7, 7), (2, 2), padding=((3, 3), (3, 3)), name="stem_conv")(x)
        x = nn.relu(norm(name="stem_bn")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage, num_blocks in enumerate(self.stage_sizes):
            for block in range(num_blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = self.block_cls(
                    filters=self.num_filters * 2**stage,
                    strides=strides,
                    conv=conv,
                    norm=norm,
                    zero_init_last_bn_scale=self.zero_init_last_bn_scale,
                    name=f"stage{stage + 1}_block{block + 1}",
                )(x)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32,
                     kernel_init=dense_kernel_init, name="classifier")(x)
        return x.astype(jnp.float32)


# name -> (stage sizes, block class)
ARCHITECTURES: dict[str, tuple[tuple[int, ...], type[nn.Module]]] = {
    "resnet_tiny": ((1, 1, 1, 1), BasicBlock),
    "resnet18": ((2, 2, 2, 2), BasicBlock),
    "resnet34": ((3, 4, 6, 3), BasicBlock),
    "resnet50": ((3, 4, 6, 3), BottleneckBlock),
    "resnet101": ((3, 4, 23, 3), BottleneckBlock),
    "resnet152": ((3, 8, 36, 3), BottleneckBlock),
    "resnet200": ((3, 24, 36, 3), BottleneckBlock),
}

DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def create_model(
    name: str,
    num_classes: int = 1000,
    *,
    num_filters: int = 64,
    dtype: Any = jnp.float32,
    **kwargs: Any,
) -> ResNet:
    """Builds a ResNet by name ("resnet50", ...); extra keyword arguments go to `ResNet`."""
    if name not in ARCHITECTURES:
        raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(ARCHITECTURES)}.")
    stage_sizes, block_cls = ARCHITECTURES[name]
    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    return ResNet(stage_sizes=stage_sizes, block_cls=block_cls, num_classes=num_classes,
                  num_filters=num_filters, dtype=dtype, **kwargs)


def model_from_config(config: ml_collections.ConfigDict) -> ResNet:
    """Builds the model a config's `model` section describes."""
    m = config.model
    return create_model(
        m.name,
        m.num_classes,
        num_filters=m.num_filters,
        dtype=m.compute_dtype,
        bn_momentum=m.bn_momentum,
        bn_epsilon=m.bn_epsilon,
        zero_init_last_bn_scale=m.zero_init_last_bn_scale,
    )


