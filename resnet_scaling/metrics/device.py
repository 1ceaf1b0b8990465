"""Metrics kept on the device and fetched every N steps; the evaluation summary.

No per-step host wait: step metrics stay device arrays in a `MetricsBuffer` until `log_every_steps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


class MetricsBuffer:
    """Per-step metric dicts of device scalars, fetched from the device only when asked.

    `fetch()` (one transfer) lets the caller check the records (a non-finite loss) before a checkpoint.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, dict[str, jax.Array]]] = []
        self._fetched: list[dict[str, float]] = []

    def append(self, step: int, metrics: Mapping[str, jax.Array]) -> None:
        self._pending.append((step, dict(metrics)))

    def __len__(self) -> int:
        return len(self._pending) + len(self._fetched)

    def fetch(self) -> list[dict[str, float]]:
        """Host copies of the steps not fetched yet, each with its `step` (blocks until computed)."""
        if not self._pending:
            return []
        values = jax.device_get([m for _, m in self._pending])
        records = [{"step": step, **{k: float(v) for k, v in m.items()}}
                   for (step, _), m in zip(self._pending, values, strict=True)]
        self._pending = []
        self._fetched.extend(records)
        return records

    def mean(self) -> dict[str, float]:
        """Means over the steps since the last call (fetching what is pending), then starts afresh."""
        self.fetch()
        records, self._fetched = self._fetched, []
        if not records:
            return {}
        return {k: float(np.mean([r[k] for r in records])) for k in records[0] if k != "step"}


def summarize_eval(sums: Mapping[str, Any]) -> dict[str, float | int]:
    """Means of summed eval metrics, and `eval_count` (an integer: the device sums it as a float)."""
    count = float(sums["count"])
    return {
        "eval_loss": float(sums["loss_sum"]) / count,
        "eval_top1": float(sums["top1_sum"]) / count,
        "eval_top5": float(sums["top5_sum"]) / count,
        "eval_count": round(count),
    }
