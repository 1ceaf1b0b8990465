"""Time and cost to MLPerf's ResNet-50 target on a system, predicted from its compiled step.

The model, every figure labelled with where it comes from:

- epochs to 75.90% top-1 at the system's global batch: MLPerf's reference convergence points
  (`convergence.py`; "published");
- steps = ceil(epochs x training images / global batch);
- step time: libtpu's estimate of the AOT-compiled real step for the system's topology (`aot.py`,
  `optimal_seconds`; "compiled"), uncompensated: no factor for how far real runs fall short of it (the v2
  Pod's published 7.9 minutes ran at 72% of it, benchmarks/README.md);
- time to target = steps x step time: training only, the case study's clock. Evaluation, set-up and the
  input pipeline's host cores are not modelled yet, so MLPerf's clock (which counts them) is not given;
- cost = chips x hours x the price per chip-hour the user gives, with its source and date ("given"); none
  without one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from resnet_scaling.analysis import convergence


@dataclasses.dataclass(frozen=True)
class Price:
    """A price per chip-hour in US dollars, with where and when it was read."""

    usd_per_chip_hour: float
    source: str


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One system's predicted time and cost to the target; None where a figure is not predicted."""

    system: str
    device_kind: str
    num_chips: int
    global_batch: int
    epochs: float
    epochs_source: str
    steps: int
    step_sec: float | None
    step_source: str
    images_per_sec: float | None
    train_sec: float | None
    cost_usd: float | None
    price_source: str | None


def predict(report: Mapping[str, Any], price: Price | None = None) -> Prediction:
    """The prediction for one compile report (`aot.CompileReport` as a dict: the compile command's JSON).

    Raises:
      ValueError: a global batch above MLPerf's largest reference (no epochs to the target).
    """
    batch = int(report["global_batch_size"])
    epochs = convergence.epochs_to_target(batch)
    steps = math.ceil(epochs.epochs * int(report["num_train_examples"]) / batch)
    step_sec = report.get("estimated_step_sec")
    train_sec = steps * step_sec if step_sec else None
    chips = int(report["num_chips"])
    return Prediction(
        system=report.get("system") or report.get("model", "?"), device_kind=report["device_kind"],
        num_chips=chips, global_batch=batch, epochs=epochs.epochs,
        epochs_source=f"published: MLPerf's reference runs, {epochs.source}", steps=steps,
        step_sec=step_sec,
        step_source="compiled: libtpu's estimate" if step_sec else "not predicted: no compiler estimate",
        images_per_sec=batch / step_sec if step_sec else None, train_sec=train_sec,
        cost_usd=chips * train_sec / 3600 * price.usd_per_chip_hour if price and train_sec else None,
        price_source=f"given: {price.source}" if price else None)
