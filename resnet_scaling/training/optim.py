"""Optimizers, learning-rate schedules, weight-decay masks and loss scaling, on optax and flax.

LARS is an optax `GradientTransformation` here, as its references define it (`optax.lars` computes its
trust ratio differently; it stays available as "optax_lars"):

- "reference": `tf.contrib.opt.LARSOptimizer` from TF 1.13 (r1.15: tensorflow/contrib/opt/python/training/
  lars_optimizer.py), tensorflow/tpu's models/official/efficientnet/lars_optimizer.py, MLPerf's reference
  (mlcommons/training image_classification/tensorflow2/lars_optimizer.py), `flax.optim.LARS`: trust ratio
  `eta * |w| / (|g| + wd * |w| + eps)` on the raw gradient, then `g + wd * w`, times the layer's LR inside
  the momentum accumulator.
- "tf1.12": TensorFlow 1.12.0's `LARSOptimizer` (tensorflow/tpu's r1.12 ran on it): weight decay is in the
  loss (`wd * l2_loss` of every non-batch-norm variable, r1.12 resnet_main.py), so the trust ratio sees
  `g + wd * w`; no decay in the optimizer; `apply_momentum` scales the whole accumulator by the layer's LR.

Both skip BN parameters and biases (`skip_list=['batch_normalization', 'bias']`): trust ratios on kernels.
Schedules count as tensorflow/tpu: epoch = fractional `step * batch / examples`; warm-up rises linearly
from 0 to the (fractional) warm-up length; decay counts from whole step `warmup_epochs * examples // batch`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from flax.training import dynamic_scale as dynamic_scale_lib

from resnet_scaling.config.fields import LARS_VARIANTS
from resnet_scaling.config.plan import TrainingPlan


def kernel_mask(params: Any) -> Any:
    """True for convolution and dense kernels (rank >= 2), False for BN parameters and biases."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def non_batchnorm_mask(params: Any) -> Any:
    """True for every leaf but batch-norm parameters (layers holding a "scale"): kernels and biases, the
    leaves tensorflow/tpu's ResNet puts into its L2 loss."""
    flat = traverse_util.flatten_dict(params)
    batchnorm_layers = {path[:-1] for path in flat if path[-1] == "scale"}
    return traverse_util.unflatten_dict({path: path[:-1] not in batchnorm_layers for path in flat})


def weight_decay_mask(weight_decay_on: str) -> Any:
    """The mask function `weight_decay_on` names: "kernels" or "non_batchnorm"."""
    return {"kernels": kernel_mask, "non_batchnorm": non_batchnorm_mask}[weight_decay_on]


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer `config.optimizer` describes (`sections.read`); the peak learning rate is the plan's."""

    name: str = "sgd"  # One of config_fields.OPTIMIZERS.
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    weight_decay_on: str = "kernels"  # One of config_fields.WEIGHT_DECAY_LEAVES.
    lars_trust_coefficient: float = 0.001
    lars_epsilon: float = 0.0
    lars_variant: str = "reference"  # One of LARS_VARIANTS.


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate decay `config.schedule` describes (`sections.read`); warm-up and peak: the plan's."""

    name: str = "cosine"  # One of config_fields.SCHEDULES.
    end_learning_rate: float = 0.0
    polynomial_power: float = 2.0
    boundary_epochs: tuple[float, ...] = (30.0, 60.0, 80.0)
    decay_factor: float = 0.1


class LarsState(NamedTuple):
    """LARS's state: the step (for the learning-rate schedule) and one momentum buffer per parameter."""

    count: jax.Array
    momentum: optax.Updates


def lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float = 1e-4,
    trust_coefficient: float = 1e-3,
    momentum: float = 0.9,
    epsilon: float = 0.0,
    nesterov: bool = False,
    variant: str = "reference",
    trust_ratio_mask: Any = kernel_mask,
    weight_decay_mask: Any = None,
) -> optax.GradientTransformation:
    """Layer-wise Adaptive Rate Scaling (You et al. 2017) as the references compute it (module docstring).

    Args:
      learning_rate: a float or an optax schedule of the step.
      weight_decay: L2 coefficient; also the `wd * |w|` term of the trust ratio's denominator.
      trust_coefficient: eta.
      epsilon: added to the trust ratio's denominator.
      variant: "reference" or "tf1.12" (module docstring).
      trust_ratio_mask: pytree or function of the params: True where a trust ratio applies.
      weight_decay_mask: where weight decay applies; default: the trust-ratio leaves for "reference" (its
        decay sits inside the trust-ratio branch), every non-batch-norm leaf for "tf1.12" (its L2 loss).

    Returns:
      The transformation; add its updates to the params (optax.apply_updates).
    """
    if variant not in LARS_VARIANTS:
        raise ValueError(f"lars: unknown variant {variant!r}; one of {LARS_VARIANTS}.")
    if weight_decay_mask is None:
        weight_decay_mask = trust_ratio_mask if variant == "reference" else non_batchnorm_mask
    schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

    def init_fn(params):
        return LarsState(count=jnp.zeros([], jnp.int32), momentum=jax.tree.map(jnp.zeros_like, params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("lars needs the params: tx.update(grads, state, params).")
        lr = jnp.asarray(schedule(state.count), jnp.float32)
        trust_leaves = trust_ratio_mask(params) if callable(trust_ratio_mask) else trust_ratio_mask
        decay_leaves = weight_decay_mask(params) if callable(weight_decay_mask) else weight_decay_mask

        def leaf(g, w, m, trusted, decayed):
            g = g.astype(jnp.float32)
            w32 = w.astype(jnp.float32)
            if variant == "tf1.12" and decayed:  # The L2 loss's gradient, before the trust ratio sees it.
                g = g + weight_decay * w32
            scaled_lr = lr
            if trusted:
                w_norm = jnp.linalg.norm(w32.ravel())
                g_norm = jnp.linalg.norm(g.ravel())
                ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + epsilon)
                scaled_lr = lr * jnp.where((w_norm > 0) & (g_norm > 0), ratio, 1.0)
            if variant == "reference":
                if decayed:
                    g = g + weight_decay * w32
                step = scaled_lr * g
                new_m = momentum * m + step
                delta = step + momentum * new_m if nesterov else new_m
            else:  # tf1.12: TensorFlow's apply_momentum, the learning rate outside the accumulator.
                new_m = momentum * m + g
                delta = scaled_lr * (g + momentum * new_m if nesterov else new_m)
            return (-delta).astype(w.dtype), new_m.astype(m.dtype)

        out = jax.tree.map(leaf, updates, params, state.momentum, trust_leaves, decay_leaves)
        treedef = jax.tree.structure(updates)
        pairs = treedef.flatten_up_to(out)
        new_updates = treedef.unflatten([u for u, _ in pairs])
        new_momentum = treedef.unflatten([m for _, m in pairs])
        return new_updates, LarsState(count=optax.safe_int32_increment(state.count), momentum=new_momentum)

    return optax.GradientTransformation(init_fn, update_fn)


def create_learning_rate_schedule(schedule: ScheduleConfig, plan: TrainingPlan) -> optax.Schedule:
    """Linear warm-up from 0 to `plan.peak_learning_rate`, then the decay `schedule.name` names.

    Warm-up while `step < plan.warmup_exact_steps`; decay from the whole step `plan.warmup_steps`.
    - "cosine": to `end_learning_rate` over `total_steps - warmup_steps`.
    - "polynomial": (1 - t)^power to `end_learning_rate` over `plan.polynomial_decay_steps` (lars_util's,
      power 2).
    - "piecewise": x `decay_factor` from each of `boundary_epochs` on (resnet_main.py's: fractional epoch >=
      boundary); a boundary inside warm-up applies once it ends; boundaries on one epoch compound.
    - "constant": the peak.
    """
    s = schedule
    peak = plan.peak_learning_rate
    warmup_length = float(plan.warmup_exact_steps)
    origin = plan.warmup_steps
    exact_steps_per_epoch = plan.epoch_length.exact_steps_per_epoch  # As resnet_main.py: unrounded.
    if s.name == "cosine":
        cosine = optax.cosine_decay_schedule(peak, max(1, plan.total_steps - origin),
                                             alpha=s.end_learning_rate / peak if peak else 0.0)
        def decay(step):
            return cosine(step - origin)
    elif s.name == "polynomial":
        span = plan.polynomial_decay_steps
        def decay(step):
            # (span - t) / span, not optax's 1 - t / span: exact in float32 near the end (a small difference).
            remaining = jnp.asarray(span - jnp.clip(step - origin, 0, span), jnp.float32) / span
            return s.end_learning_rate + (peak - s.end_learning_rate) * remaining ** s.polynomial_power
    elif s.name == "piecewise":
        boundaries = jnp.asarray(sorted(s.boundary_epochs), jnp.float32)
        def decay(step):
            epoch = jnp.asarray(step, jnp.float32) / exact_steps_per_epoch
            return peak * jnp.asarray(s.decay_factor, jnp.float32) ** jnp.sum(epoch >= boundaries)
    elif s.name == "constant":
        def decay(step):
            return jnp.full([], peak, jnp.float32)
    else:
        raise ValueError(f"config.schedule.name: unknown schedule {s.name!r}.")
    if warmup_length <= 0:
        return decay

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        return jnp.where(step < warmup_length, peak * step / warmup_length, decay(count))

    return schedule


def create_optimizer(
    optimizer: OptimizerConfig, learning_rate: optax.ScalarOrSchedule
) -> optax.GradientTransformation:
    """SGD with (Nesterov) momentum and L2 weight decay, or LARS, per `optimizer` (`config.optimizer`).

    Decay applies to `weight_decay_on`: "kernels" (LARS's trust-ratio leaves, which its references decay) or
    "non_batchnorm" (kernels and biases: tensorflow/tpu's L2 loss, Goyal et al.'s decay of all but BN).
    """
    o = optimizer
    if o.name == "sgd":
        return optax.chain(
            optax.add_decayed_weights(o.weight_decay, mask=weight_decay_mask(o.weight_decay_on)),
            optax.sgd(learning_rate, momentum=o.momentum, nesterov=o.nesterov),
        )
    if o.name == "lars":
        return lars(learning_rate, weight_decay=o.weight_decay, trust_coefficient=o.lars_trust_coefficient,
                    momentum=o.momentum, epsilon=o.lars_epsilon, nesterov=o.nesterov, variant=o.lars_variant,
                    weight_decay_mask=weight_decay_mask(o.weight_decay_on))
    if o.name == "optax_lars":  # optax's variant: trust ratio eta * |w| / |g + wd * w|.
        return optax.lars(
            learning_rate,
            weight_decay=o.weight_decay,
            weight_decay_mask=kernel_mask,
            trust_coefficient=o.lars_trust_coefficient,
            eps=o.lars_epsilon,
            trust_ratio_mask=kernel_mask,
            momentum=o.momentum,
            nesterov=o.nesterov,
        )
    raise ValueError(f"config.optimizer.name: unknown optimizer {o.name!r}.")


def create_dynamic_scale(compute_dtype: str) -> dynamic_scale_lib.DynamicScale | None:
    """Dynamic loss scaling for float16 compute (its range needs it); None for float32 and bfloat16.

    Args:
      compute_dtype: `config.model.compute_dtype` ("float32", "bfloat16" or "float16").
    """
    if compute_dtype == "float16":
        return dynamic_scale_lib.DynamicScale()
    return None
