"""The flax ImageNet example's ResNet-50 training step, rebuilt for a side-by-side benchmark.

Written after google/flax `examples/imagenet` (models.py and train.py): `nn.Conv` for every convolution
(SAME padding but for the 7x7 stem), `nn.max_pool`, BN with `axis_name='batch'`, L2 weight decay added
to the loss, `optax.sgd(momentum=0.9, nesterov=True)`, `pmap` with a `pmean` of the gradients, and
float32 images normalised on the host. Only the step is rebuilt, not the example's input pipeline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec


class BottleneckResNetBlock(nn.Module):
    filters: int
    conv: Any
    norm: Any
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (1, 1))(x)
        y = nn.relu(self.norm()(y))
        y = self.conv(self.filters, (3, 3), self.strides)(y)
        y = nn.relu(self.norm()(y))
        y = self.conv(self.filters * 4, (1, 1))(y)
        y = self.norm(scale_init=nn.initializers.zeros_init())(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), self.strides, name="conv_proj")(residual)
            residual = self.norm(name="norm_proj")(residual)
        return nn.relu(residual + y)


class ResNet(nn.Module):
    stage_sizes: Sequence[int]
    num_classes: int
    num_filters: int = 64
    dtype: Any = jnp.float32
    bn_axis_name: str | None = "batch"  # pmap's axis; None under jit, where BN spans the global batch.

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                 dtype=self.dtype, axis_name=self.bn_axis_name)
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
        x = nn.relu(norm(name="bn_init")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, block_size in enumerate(self.stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = BottleneckResNetBlock(self.num_filters * 2**i, conv=conv, norm=norm, strides=strides)(x)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
        return jnp.asarray(x, self.dtype)


class TrainState(train_state.TrainState):
    batch_stats: Any


def _train_step(state: TrainState, batch: dict[str, jax.Array], learning_rate_fn: Callable) -> Any:
    def loss_fn(params):
        logits, new_model_state = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                                 batch["image"], mutable=["batch_stats"])
        one_hot = jax.nn.one_hot(batch["label"], 1000)
        loss = jnp.mean(optax.softmax_cross_entropy(logits, one_hot))
        weight_l2 = sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(params) if x.ndim > 1)
        return loss + 1e-4 * 0.5 * weight_l2, (new_model_state, logits)

    (loss, (new_model_state, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads = jax.lax.pmean(grads, axis_name="batch")
    metrics = jax.lax.pmean({"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
                             "learning_rate": learning_rate_fn(state.step)}, axis_name="batch")
    new_state = state.apply_gradients(grads=grads, batch_stats=new_model_state["batch_stats"])
    return new_state, metrics


def jit_train_step(state: TrainState, batch: dict[str, jax.Array], num_classes: int = 1000) -> Any:
    """The example's step for plain `jit` over a mesh (no pmap, no pmean: the sharded batch gives global
    BN statistics and gradients); weight decay left to the optimizer (LARS)."""
    def loss_fn(params):
        logits, new_model_state = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                                 batch["image"], mutable=["batch_stats"])
        loss = jnp.mean(optax.softmax_cross_entropy(logits.astype(jnp.float32),
                                                    jax.nn.one_hot(batch["label"], num_classes)))
        return loss, (new_model_state, logits)

    (loss, (new_model_state, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}
    return state.apply_gradients(grads=grads, batch_stats=new_model_state["batch_stats"]), metrics


def make_step(global_batch_size: int, image_size: int = 224, dtype: Any = jnp.float32,
              seed: int = 0) -> tuple[Callable, Any, Any]:
    """Returns (p_train_step, replicated state, device-resident sharded batch) for all local devices."""
    num_devices = jax.local_device_count()
    model = ResNet(stage_sizes=(3, 4, 6, 3), num_classes=1000, dtype=dtype)
    learning_rate_fn = optax.constant_schedule(0.1)
    variables = jax.jit(functools.partial(model.init, train=False))(
        jax.random.key(seed), jnp.ones((1, image_size, image_size, 3), dtype))
    state = TrainState.create(apply_fn=model.apply, params=variables["params"],
                              tx=optax.sgd(learning_rate_fn, momentum=0.9, nesterov=True),
                              batch_stats=variables["batch_stats"])
    # Leading device axis, laid out one slice per device (what device_put_replicated used to do).
    sharding = NamedSharding(Mesh(np.array(jax.local_devices()), ("devices",)), PartitionSpec("devices"))
    state = jax.device_put(jax.tree.map(lambda x: np.stack([np.asarray(x)] * num_devices), state), sharding)
    rng = np.random.default_rng(seed)
    per_device = global_batch_size // num_devices
    batch = {
        "image": rng.standard_normal((num_devices, per_device, image_size, image_size, 3), np.float32),
        "label": rng.integers(0, 1000, (num_devices, per_device)).astype(np.int32),
    }
    batch = jax.device_put(batch, sharding)
    p_train_step = jax.pmap(functools.partial(_train_step, learning_rate_fn=learning_rate_fn),
                            axis_name="batch")
    return p_train_step, state, batch
