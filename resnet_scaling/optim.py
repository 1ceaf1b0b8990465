"""Optimizers, learning-rate schedules, weight-decay masks and loss scaling, all from optax and flax.

Weight decay and LARS trust ratios apply to convolution and dense kernels only: batch-norm scales and
offsets and the classifier bias are left alone (Goyal et al. 2017; the MLPerf LARS reference).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax
from flax.training import dynamic_scale as dynamic_scale_lib

from resnet_scaling.plan import TrainingPlan

# The values `config.optimizer.name` and `config.schedule.name` accept (config.validate reads them).
OPTIMIZERS = ("sgd", "lars")
SCHEDULES = ("cosine", "polynomial", "piecewise", "constant")


def kernel_mask(params: Any) -> Any:
    """True for convolution and dense kernels (rank >= 2), False for BN parameters and biases."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def create_learning_rate_schedule(
    config: ml_collections.ConfigDict, plan: TrainingPlan
) -> optax.Schedule:
    """Linear warm-up from 0 to `plan.peak_learning_rate`, then the decay `config.schedule.name` names.

    - "cosine": cosine decay to `end_learning_rate` at the last step (Goyal et al. variant).
    - "polynomial": (1 - t)^power decay to `end_learning_rate` (the MLPerf LARS recipe, power 2).
    - "piecewise": multiply by `decay_factor` at each of `boundary_epochs`.
    - "constant": stay at the peak.
    """
    s = config.schedule
    peak = plan.peak_learning_rate
    warmup = plan.warmup_steps
    decay_steps = max(1, plan.total_steps - warmup)
    if s.name == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=s.end_learning_rate / peak)
    elif s.name == "polynomial":
        decay = optax.polynomial_schedule(peak, s.end_learning_rate, s.polynomial_power, decay_steps)
    elif s.name == "piecewise":
        # Boundaries are absolute epochs; the decay part of the schedule starts counting after warm-up.
        # A boundary at or before the end of warm-up applies from the first step after it (the warm-up
        # itself still ramps to the peak), and boundaries that land on the same step compound.
        boundaries: dict[int, float] = {}
        for e in s.boundary_epochs:
            b = max(0, plan.epochs_to_steps(e) - warmup)
            boundaries[b] = boundaries.get(b, 1.0) * s.decay_factor
        decay = optax.piecewise_constant_schedule(peak, boundaries)
    elif s.name == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise ValueError(f"config.schedule.name: unknown schedule {s.name!r}.")
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def create_optimizer(
    config: ml_collections.ConfigDict, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
    """SGD with (Nesterov) momentum and masked L2 weight decay, or LARS, per `config.optimizer`."""
    o = config.optimizer
    if o.name == "sgd":
        return optax.chain(
            optax.add_decayed_weights(o.weight_decay, mask=kernel_mask),
            optax.sgd(learning_rate, momentum=o.momentum, nesterov=o.nesterov),
        )
    if o.name == "lars":
        return optax.lars(
            learning_rate,
            weight_decay=o.weight_decay,
            weight_decay_mask=kernel_mask,
            trust_coefficient=o.lars_trust_coefficient,
            trust_ratio_mask=kernel_mask,
            momentum=o.momentum,
            nesterov=o.nesterov,
        )
    raise ValueError(f"config.optimizer.name: unknown optimizer {o.name!r}.")


def create_dynamic_scale(config: ml_collections.ConfigDict) -> dynamic_scale_lib.DynamicScale | None:
    """Dynamic loss scaling for float16 compute (its range needs it); None for float32 and bfloat16."""
    if config.model.compute_dtype == "float16":
        return dynamic_scale_lib.DynamicScale()
    return None
