"""ResNet v1.5 in Flax (NHWC), ResNet-18 to ResNet-200 plus a tiny test model.

| module | job |
|---|---|
| `__init__.py` | `ResNet`, `ModelConfig`, `create_model`, `model_from_config` |
| `batchnorm.py` | batch norm over groups of images (`model.bn_group_size`) |
| `cpu_lowering.py` | the 1x1 convolutions and max pooling XLA's CPU backend runs fastest |
| `weights.py` | torchvision weights as this model's variables |

v1.5 (torchvision, MLPerf reference) strides a stage's first bottleneck on its 3x3, not its first 1x1.
Convolutions pad symmetrically (TF's `fixed_padding`, PyTorch): torchvision weights give the same outputs.
"""

from __future__ import annotations

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from resnet_scaling.config.fields import LOWERINGS
from resnet_scaling.config.plan import BatchPlan, TrainingPlan
from resnet_scaling.models.batchnorm import GroupedBatchNorm
from resnet_scaling.models.cpu_lowering import PatchGradConv, PointwiseConv, conv_kernel_init, max_pool_3x3_s2

ModuleDef = Any

# The MLPerf reference initialises the classifier with a small normal.
dense_kernel_init = nn.initializers.normal(stddev=0.01)


def resolve_lowering(lowering: str, platform: str | None = None) -> str:
    """"cpu" or "xla" for `lowering` on `platform` (default: JAX's default backend)."""
    if lowering not in LOWERINGS:
        raise ValueError(f"Unknown lowering {lowering!r}; choose one of {', '.join(LOWERINGS)}.")
    if lowering != "auto":
        return lowering
    return "cpu" if (platform or jax.default_backend()) == "cpu" else "xla"


def max_pool_3x3_s2_xla(x: jax.Array) -> jax.Array:
    """3x3 max pooling with stride 2 and padding 1 as one `reduce_window` (`nn.max_pool`)."""
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))


def make_conv(features: int, kernel_size: tuple[int, int], strides: tuple[int, int] = (1, 1), *,
              padding: Any = "SAME", dtype: Any = jnp.float32, name: str | None = None,
              lowering: str = "auto") -> nn.Module:
    """A bias-free He-initialised convolution; the "cpu" lowering makes unpadded 1x1 kernels `PointwiseConv`
    and strided, explicitly padded ones `PatchGradConv` (the same `kernel`)."""
    lowering = resolve_lowering(lowering)
    pointwise = tuple(kernel_size) == (1, 1) and padding in ("SAME", "VALID") and strides[0] == strides[1]
    if lowering == "cpu" and pointwise:
        return PointwiseConv(features, strides[0], dtype=dtype, name=name)
    if lowering == "cpu" and max(strides) > 1 and not isinstance(padding, str):
        return PatchGradConv(features, tuple(kernel_size), tuple(strides), padding, dtype=dtype, name=name)
    return nn.Conv(features, kernel_size, strides, padding=padding, use_bias=False, dtype=dtype,
                   param_dtype=jnp.float32, kernel_init=conv_kernel_init, name=name)


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
      block_cls: `BasicBlock` or `BottleneckBlock`.
      num_filters: channels of the stem and the first stage; doubled per stage.
      dtype: compute dtype of activations; parameters and BN statistics stay float32.
      zero_init_last_bn_scale: start each residual branch at zero (Goyal et al.).
      bn_group_size: images per BN group in training (`GroupedBatchNorm`); None: `nn.BatchNorm` over the
        whole batch given (under `jit`, the global batch).
      lowering: see `config_fields.LOWERINGS`; "auto" follows JAX's default backend when the model is traced.
    """

    stage_sizes: Sequence[int]
    block_cls: type[nn.Module]
    num_classes: int
    num_filters: int = 64
    dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    zero_init_last_bn_scale: bool = True
    bn_group_size: int | None = None
    lowering: str = "auto"

    @nn.compact
    def __call__(self, x, train: bool = True):
        """Returns float32 logits of shape [batch, num_classes]."""
        lowering = resolve_lowering(self.lowering)
        conv = functools.partial(make_conv, dtype=self.dtype, lowering=lowering)
        grouped = self.bn_group_size is not None
        norm = functools.partial(
            functools.partial(GroupedBatchNorm, group_size=self.bn_group_size) if grouped else nn.BatchNorm,
            use_running_average=not train,
            momentum=self.bn_momentum,
            epsilon=self.bn_epsilon,
            dtype=self.dtype,
            param_dtype=jnp.float32,
        )
        x = x.astype(self.dtype)
        x = conv(self.num_filters, (7, 7), (2, 2), padding=((3, 3), (3, 3)), name="stem_conv")(x)
        x = nn.relu(norm(name="stem_bn")(x))
        # float16 pools as strided maxima on every backend: XLA's GPU partitioner all-gathers a float16
        # select-and-scatter (the max pool's gradient) to the global batch (8x V100: 495 MiB more every
        # step, benchmarks/README.md); strided maxima stay per device. Same values and gradients.
        strided = lowering == "cpu" or self.dtype == jnp.float16
        x = max_pool_3x3_s2(x) if strided else max_pool_3x3_s2_xla(x)
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
    """Builds a ResNet by name ("resnet50", ...); kwargs go to `ResNet`, `lowering` resolved to cpu/xla."""
    if name not in ARCHITECTURES:
        raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(ARCHITECTURES)}.")
    stage_sizes, block_cls = ARCHITECTURES[name]
    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    kwargs["lowering"] = resolve_lowering(kwargs.get("lowering", "auto"), kwargs.pop("platform", None))
    return ResNet(stage_sizes=stage_sizes, block_cls=block_cls, num_classes=num_classes,
                  num_filters=num_filters, dtype=dtype, **kwargs)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The network `config.model` describes, and the weights it starts from (`sections.read`)."""

    name: str = "resnet50"  # One of config_fields.MODEL_NAMES.
    num_classes: int = 1000
    num_filters: int = 64
    compute_dtype: str = "float32"  # One of config_fields.COMPUTE_DTYPES.
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    zero_init_last_bn_scale: bool = True
    lowering: str = "auto"  # One of LOWERINGS.
    init_from: str = ""  # Initial weights (init_from.py); "": none.
    init_skip_classifier: bool = False


def model_from_config(model: ModelConfig, plan: TrainingPlan | BatchPlan | None = None,
                      platform: str | None = None) -> ResNet:
    """Builds the model a `ModelConfig` describes (`sections.read(config).model`).

    Args:
      plan: holds training's resolved BN groups (`config.model.bn_group_size`); without one, BN spans the
        whole batch given, all inference needs (it uses the running averages).
      platform: "cpu", "tpu" or "gpu", for `lowering="auto"` (default: JAX's default backend).
    """
    return create_model(
        model.name,
        model.num_classes,
        num_filters=model.num_filters,
        dtype=model.compute_dtype,
        bn_momentum=model.bn_momentum,
        bn_epsilon=model.bn_epsilon,
        zero_init_last_bn_scale=model.zero_init_last_bn_scale,
        bn_group_size=None if plan is None else plan.bn_group_size,
        lowering=model.lowering,
        platform=platform,
    )
