"""Training metrics kept on the device and fetched every N steps, throughput, and writers.

The host never waits for the device per step: step metrics stay as device arrays in a `MetricsBuffer`
until the trainer asks for their mean, every `log_every_steps`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

logger = logging.getLogger(__name__)


class MetricsBuffer:
    """Per-step metric dicts of device scalars, fetched from the device only when asked.

    `fetch()` copies what is pending to the host (one transfer) and returns those steps' records, so the
    caller can check them (a non-finite loss) before a checkpoint; `mean()` averages every step since the
    last `mean()`.
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


def first_non_finite_step(records: list[dict[str, float]], key: str = "loss") -> int | None:
    """The step of the first record whose `key` is NaN or infinite, else None."""
    for record in records:
        if not np.isfinite(record[key]):
            return int(record["step"])
    return None


def summarize_eval(sums: Mapping[str, Any]) -> dict[str, float]:
    """Turns summed eval metrics (`loss_sum`, `top1_sum`, `top5_sum`, `count`) into means."""
    count = float(sums["count"])
    return {
        "eval_loss": float(sums["loss_sum"]) / count,
        "eval_top1": float(sums["top1_sum"]) / count,
        "eval_top5": float(sums["top5_sum"]) / count,
        "eval_count": count,
    }


class ThroughputTimer:
    """Images/sec between log points, from a clock that the caller pauses around evaluation and saves.

    `total_sec` keeps the whole training time (it is saved in checkpoints, so it survives restarts).
    """

    def __init__(self, images_per_step: int, total_sec: float = 0.0) -> None:
        self.images_per_step = images_per_step
        self.total_sec = total_sec
        self._interval_sec = 0.0
        self._mark: float | None = None
        self._steps = 0

    def start(self) -> None:
        self._mark = time.perf_counter()

    def pause(self) -> None:
        if self._mark is not None:
            elapsed = time.perf_counter() - self._mark
            self._interval_sec += elapsed
            self.total_sec += elapsed
            self._mark = None

    def count(self, steps: int = 1) -> None:
        self._steps += steps

    def read_and_reset(self) -> dict[str, float]:
        """images/sec and sec/step since the last call (the clock keeps running if it was running)."""
        running = self._mark is not None
        self.pause()
        seconds, steps = self._interval_sec, self._steps
        self._interval_sec, self._steps = 0.0, 0
        if running:
            self.start()
        if steps == 0 or seconds <= 0:
            return {}
        return {"images_per_sec": steps * self.images_per_step / seconds, "sec_per_step": seconds / steps}


class JsonLinesWriter:
    """Appends one JSON object per write to `path` (for machines; one line per step logged)."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        record = {"step": int(step), "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardWriter:
    """Scalars as TensorBoard event files through clu (imported lazily: it pulls in TensorFlow)."""

    def __init__(self, logdir: str) -> None:
        from clu import metric_writers

        self._writer = metric_writers.SummaryWriter(logdir)

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in values.items() if isinstance(v, int | float)}
        self._writer.write_scalars(int(step), scalars)

    def close(self) -> None:
        self._writer.close()


class MetricWriters:
    """Fans each record out to JSON lines and, where clu and TensorBoard are installed, event files."""

    def __init__(self, workdir: str, tensorboard: bool = True) -> None:
        self._writers: list[Any] = [JsonLinesWriter(os.path.join(workdir, "metrics.jsonl"))]
        if tensorboard:
            try:
                self._writers.append(TensorBoardWriter(os.path.join(workdir, "tensorboard")))
            except ImportError as e:
                logger.warning("TensorBoard summaries off (%s); metrics.jsonl has every record.", e)

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        for writer in self._writers:
            writer.write(step, values)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


def format_duration(seconds: float) -> str:
    """A compact human duration: 42s, 3m07s, 2h05m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
