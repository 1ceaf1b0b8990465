"""What checking LARS and its schedule against the references changed, for the pod (32,768 images per step).

Prints two tables and writes JSON:

1. The learning rate at chosen steps: the library before (tensorflow/tpu's later table, 32 over 14 epochs;
   warm-up rounded to 547 steps, then optax's polynomial decay over `total - warmup` steps), the same table
   counted as tensorflow/tpu counts (which isolates the counting), and the case study's r1.12 recipe now
   (34 over 12 epochs).
2. The size of one kernel's first update (momentum empty) under `optax.lars` (the library's LARS before),
   `optim.lars` "reference" and "tf1.12", at ratios `wd * |w| / |g|` from 0.01 to 10 and for a zero
   gradient, as ratios to the reference's.

    python benchmarks/lars_reference.py --json_out=benchmarks/results/lars_reference.json

Deterministic: no timing, so one run is the figure.
"""

from __future__ import annotations

import argparse
import math

import harness  # Beside this script.
import jax.numpy as jnp
import numpy as np
import optax

from resnet_scaling.config import IMAGENET_NUM_TRAIN_EXAMPLES, get_base_config, recipes
from resnet_scaling.config.plan import derive
from resnet_scaling.training import optim, sections

BATCH = 32_768
STEPS_SHOWN = (1, 100, 468, 469, 470, 547, 548, 1000, 2000, 3000, 3400, 3555, 3556, 3557)


def _pod_config(recipe):
    config = get_base_config()
    config.training.global_batch_size = BATCH
    config.eval.global_batch_size = BATCH
    recipes.use_case_study_recipe(config)
    return recipe(config)


def _previous_schedule(total_steps: int) -> optax.Schedule:
    """The library's schedule before the check: later table, warm-up round(14 epochs) = 547 steps, then
    optax.polynomial_schedule over total - warmup."""
    peak, warmup_epochs = recipes.lars_learning_rate(BATCH)
    warmup = int(round(warmup_epochs * IMAGENET_NUM_TRAIN_EXAMPLES / BATCH))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup),
         optax.polynomial_schedule(peak, 1e-4, 2.0, total_steps - warmup)], [warmup])


def learning_rates() -> list[dict[str, float]]:
    now_config = _pod_config(lambda c: c)
    later_config = _pod_config(recipes.use_tensorflow_tpu_lars)
    plan = derive(now_config, IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=512)
    later_plan = derive(later_config, IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=512)
    before = _previous_schedule(plan.total_steps)
    later = optim.create_learning_rate_schedule(sections.read(later_config).schedule, later_plan)
    now = optim.create_learning_rate_schedule(sections.read(now_config).schedule, plan)
    rows = []
    for step in STEPS_SHOWN:
        b, c, n = float(before(step)), float(later(step)), float(now(step))
        rows.append({"step": step, "before": b, "later_table_reference_counting": c, "r1_12_now": n,
                     "counting_ratio": c / b if b else math.nan})
    return rows


def update_sizes() -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(3, 3, 256, 256)) * 0.02, jnp.float32)
    direction = jnp.asarray(rng.normal(size=w.shape), jnp.float32)
    wd, lr = 1e-4, 1.0
    transforms = {
        "optax_lars": optax.lars(lr, weight_decay=wd, trust_coefficient=1e-3, momentum=0.9),
        "reference": optim.lars(lr, weight_decay=wd, variant="reference"),
        "tf1.12": optim.lars(lr, weight_decay=wd, variant="tf1.12"),
    }
    rows = []
    for ratio in (0.01, 0.1, 1.0, 10.0, math.inf):
        if math.isinf(ratio):
            g = jnp.zeros_like(w)
        else:
            g = direction * (wd * jnp.linalg.norm(w) / (ratio * jnp.linalg.norm(direction)))
        norms = {}
        for name, tx in transforms.items():
            updates, _ = tx.update({"kernel": g}, tx.init({"kernel": w}), {"kernel": w})
            norms[name] = float(jnp.linalg.norm(updates["kernel"]))
        rows.append({"wd_w_over_g": "zero gradient" if math.isinf(ratio) else ratio, **norms,
                     "optax_over_reference": norms["optax_lars"] / norms["reference"],
                     "tf1_12_over_reference": norms["tf1.12"] / norms["reference"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json_out", default="")
    args = parser.parse_args()
    lrs, sizes = learning_rates(), update_sizes()
    print(f"Learning rate at {BATCH} images per step (3,558 steps)")
    print(f"{'step':>5} {'before':>12} {'later, ref. counting':>21} {'ratio':>7} {'r1.12 now':>12}")
    for r in lrs:
        print(f"{r['step']:>5} {r['before']:>12.6g} {r['later_table_reference_counting']:>21.6g} "
              f"{r['counting_ratio']:>7.4f} {r['r1_12_now']:>12.6g}")
    print("\nFirst update's norm of a 3x3x256x256 kernel (|w| = 15.4), lr 1, wd 1e-4, eta 1e-3")
    print(f"{'wd|w|/|g|':>14} {'optax.lars':>12} {'reference':>12} {'tf1.12':>12} {'optax/ref':>10} "
          f"{'tf1.12/ref':>10}")
    for r in sizes:
        print(f"{r['wd_w_over_g']!s:>14} {r['optax_lars']:>12.4g} {r['reference']:>12.4g} "
              f"{r['tf1.12']:>12.4g} {r['optax_over_reference']:>10.3f} {r['tf1_12_over_reference']:>10.3f}")
    if args.json_out:
        harness.write_json(args.json_out, {"learning_rates": lrs, "update_sizes": sizes,
                                           "environment": harness.environment()})


if __name__ == "__main__":
    main()
