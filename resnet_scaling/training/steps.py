"""The train state and the pure train and eval steps, plus their sharded, jitted forms.

Batches are dicts of `images` (uint8 NHWC), `labels` (int32) and, for evaluation, `mask` (bool: False
for padding). Images are normalised here, on the device, so that the host ships 4x fewer bytes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import dynamic_scale as dynamic_scale_lib
from flax.training import train_state
from jax.sharding import Mesh

from resnet_scaling.job import mesh as mesh_lib

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


class TrainState(train_state.TrainState):
    """Flax's TrainState (step, params, optimizer state) plus BN statistics and the loss scale."""

    batch_stats: Any = None
    dynamic_scale: dynamic_scale_lib.DynamicScale | None = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The constants a step needs, bound once outside traced code (never read from flags inside it);
    `sections.read(config).step` reads them from a config."""

    mean_rgb: tuple[float, float, float]
    stddev_rgb: tuple[float, float, float]
    num_classes: int
    label_smoothing: float = 0.0


def normalize_images(images: jax.Array, mean_rgb: Sequence[float], stddev_rgb: Sequence[float]) -> jax.Array:
    """uint8 images in [0, 255] -> float32 (x / 255 - mean) / stddev, per RGB channel."""
    if images.dtype != jnp.uint8:
        raise TypeError(f"Expected uint8 images, got {images.dtype}: data sources ship raw pixels.")
    mean = jnp.asarray(mean_rgb, jnp.float32) * 255.0
    stddev = jnp.asarray(stddev_rgb, jnp.float32) * 255.0
    return (images.astype(jnp.float32) - mean) / stddev


def cross_entropy_loss(logits: jax.Array, labels: jax.Array, num_classes: int,
                       label_smoothing: float = 0.0) -> jax.Array:
    """Per-example float32 softmax cross-entropy; smoothed targets (1 - s) * one_hot + s / num_classes."""
    targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    if label_smoothing > 0:
        targets = optax.smooth_labels(targets, label_smoothing)
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)


def topk_correct(logits: jax.Array, labels: jax.Array, k: int) -> jax.Array:
    """Per-example 1.0 where the label is among the k highest logits, else 0.0.

    Ties rank as in `lax.top_k`, lower class first, so top-1 is `argmax(logits) == label` and a constant
    model is right only on class 0. A NaN or infinite logit is a miss: a diverged model scores 0, not 100%.
    """
    num_classes = logits.shape[-1]
    label_logit = jnp.take_along_axis(logits, labels[:, None], axis=-1)
    before_label = jnp.arange(num_classes)[None, :] < labels[:, None]
    ranked_ahead = (logits > label_logit) | ((logits == label_logit) & before_label)
    finite = jnp.all(jnp.isfinite(logits), axis=-1)
    return ((jnp.sum(ranked_ahead, axis=-1) < k) & finite).astype(jnp.float32)


def check_batch(batch: Batch, function: str) -> None:
    """Raises a `KeyError` naming what a step's batch needs if "images" or "labels" is missing."""
    missing = [key for key in ("images", "labels") if key not in batch]
    if missing:
        raise KeyError(f"{function}: the batch needs 'images' (uint8 [N, H, W, 3]) and 'labels' (int [N]); "
                       f"it has {sorted(batch)}.")


def train_step(state: TrainState, batch: Batch, *, learning_rate_fn: optax.Schedule | None = None,
               step_config: StepConfig) -> tuple[TrainState, Metrics]:
    """One optimizer step on a (global) batch; returns the new state and scalar metrics.

    BN statistics span the whole batch given (under `jit`, the global batch). With a float16 loss scale, a
    step whose gradients overflow is skipped. `learning_rate_fn` only reports "learning_rate" (None: omitted).
    """
    check_batch(batch, "train_step")
    images = normalize_images(batch["images"], step_config.mean_rgb, step_config.stddev_rgb)
    labels = batch["labels"]

    def loss_fn(params):
        logits, new_model_state = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, images, train=True,
            mutable=["batch_stats"],
        )
        loss = jnp.mean(cross_entropy_loss(logits, labels, step_config.num_classes,
                                           step_config.label_smoothing))
        return loss, (logits, new_model_state["batch_stats"])

    if state.dynamic_scale is not None:
        grad_fn = state.dynamic_scale.value_and_grad(loss_fn, has_aux=True)
        dynamic_scale, is_finite, (loss, (logits, batch_stats)), grads = grad_fn(state.params)
    else:
        (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        dynamic_scale, is_finite = None, None

    new_state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
    if dynamic_scale is not None:
        # Keep the old parameters and optimizer state where the scaled gradients overflowed.
        keep_new = functools.partial(jax.tree.map, lambda new, old: jnp.where(is_finite, new, old))
        new_state = new_state.replace(
            params=keep_new(new_state.params, state.params),
            opt_state=keep_new(new_state.opt_state, state.opt_state),
            batch_stats=keep_new(new_state.batch_stats, state.batch_stats),
            dynamic_scale=dynamic_scale,
        )
    metrics = {
        "loss": loss,
        "top1": jnp.mean(topk_correct(logits, labels, 1)),
        "top5": jnp.mean(topk_correct(logits, labels, 5)),
    }
    if learning_rate_fn is not None:
        metrics["learning_rate"] = jnp.asarray(learning_rate_fn(state.step), jnp.float32)
    if dynamic_scale is not None:
        metrics["loss_scale"] = dynamic_scale.scale
    return new_state, metrics


def eval_step(state: TrainState, batch: Batch, *, step_config: StepConfig) -> Metrics:
    """Sums (not means: padded batches combine exactly) over unmasked examples: loss, top-1/5 hits, count."""
    check_batch(batch, "eval_step")
    images = normalize_images(batch["images"], step_config.mean_rgb, step_config.stddev_rgb)
    labels = batch["labels"]
    mask = batch.get("mask")
    mask = jnp.ones(labels.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
    logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats}, images,
                            train=False)
    loss = cross_entropy_loss(logits, labels, step_config.num_classes)
    return {
        "loss_sum": jnp.sum(loss * mask),
        "top1_sum": jnp.sum(topk_correct(logits, labels, 1) * mask),
        "top5_sum": jnp.sum(topk_correct(logits, labels, 5) * mask),
        "count": jnp.sum(mask),
    }


# The initialiser runs once, yet XLA:CPU optimises it like the step: an inlined threefry + inverse-erf per
# parameter, ~70 ms of compile each. Unoptimised, ResNet-50 compiles in 3.7 s, not 6.4, and runs in 0.85 s,
# not 0.2; the demo's ResNet-18 compiles in 1.3 s, not 3.9; values differ by at most 1.3e-7 relative
# (`python benchmarks/init_compile.py --repeats=3`, 2026-12-01).
RUN_ONCE_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def train_state_init_fn(
    model: nn.Module,
    tx: optax.GradientTransformation,
    image_size: int,
    dynamic_scale: dynamic_scale_lib.DynamicScale | None = None,
) -> Callable[[jax.Array], TrainState]:
    """`rng -> TrainState`: the state's initialiser, to jit (`create_train_state`) or `jax.eval_shape`."""

    def init(rng):
        variables = model.init(rng, jnp.zeros((1, image_size, image_size, 3), model.dtype),
                               train=False)
        state = TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                                  batch_stats=variables["batch_stats"], dynamic_scale=dynamic_scale)
        # Strongly typed leaves (step and loss scale start as weakly typed Python numbers), as a restored
        # state's: a fresh state's step must be the resumed run's program, or the compilation cache misses.
        return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.asarray(x).dtype), state)

    return init


def create_train_state(
    rng: jax.Array,
    model: nn.Module,
    tx: optax.GradientTransformation,
    image_size: int,
    mesh: Mesh,
    dynamic_scale: dynamic_scale_lib.DynamicScale | None = None,
) -> TrainState:
    """Initialises the state directly into its replicated sharding on `mesh` (no host copy)."""
    init = train_state_init_fn(model, tx, image_size, dynamic_scale)
    lowered = jax.jit(init, out_shardings=mesh_lib.replicated_sharding(mesh)).lower(rng)
    on_cpu = all(d.platform == "cpu" for d in mesh.devices.flat)
    return lowered.compile(compiler_options=RUN_ONCE_CPU_COMPILER_OPTIONS if on_cpu else None)(rng)


def abstract_train_state(
    rng: jax.Array,
    model: nn.Module,
    tx: optax.GradientTransformation,
    image_size: int,
    mesh: Mesh,
    dynamic_scale: dynamic_scale_lib.DynamicScale | None = None,
) -> TrainState:
    """The state `create_train_state` would make, as ShapeDtypeStructs carrying its shardings: nothing is
    allocated, so it describes a state for devices this machine does not have (ahead-of-time compiles)."""
    shapes = jax.eval_shape(train_state_init_fn(model, tx, image_size, dynamic_scale), rng)

    def abstract(x, sharding):
        # weak_type too, as the real state's leaves have it, or the program differs.
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=x.weak_type)

    return jax.tree.map(abstract, shapes, state_sharding(shapes, mesh))


def state_sharding(state: TrainState, mesh: Mesh) -> Any:
    """The sharding of every leaf of the state: replicated (data parallelism)."""
    replicated = mesh_lib.replicated_sharding(mesh)
    return jax.tree.map(lambda _: replicated, state)


def jit_train_step(
    state: TrainState, mesh: Mesh, learning_rate_fn: optax.Schedule | None, step_config: StepConfig,
    step_fn: Callable[..., tuple[TrainState, Metrics]] = train_step,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`train_step` jitted for `mesh`: batch sharded on `data`, state replicated and donated."""
    shardings = state_sharding(state, mesh)
    return jax.jit(
        functools.partial(step_fn, learning_rate_fn=learning_rate_fn, step_config=step_config),
        in_shardings=(shardings, mesh_lib.batch_sharding(mesh)),
        out_shardings=(shardings, mesh_lib.replicated_sharding(mesh)),
        donate_argnums=(0,),
    )


def jit_eval_step(
    state: TrainState, mesh: Mesh, step_config: StepConfig
) -> Callable[[TrainState, Batch], Metrics]:
    """`eval_step` jitted for `mesh`: batch sharded on `data`, sums replicated."""
    return jax.jit(
        functools.partial(eval_step, step_config=step_config),
        in_shardings=(state_sharding(state, mesh), mesh_lib.batch_sharding(mesh)),
        out_shardings=mesh_lib.replicated_sharding(mesh),
    )
