"""The run's time accounting in one object: the training clock, the steady state, time-to-accuracy, the
seconds spent evaluating and checkpointing, and the wall time of the training loop over every launch.

Its `state_dict()` goes into every checkpoint and a resumed run starts from it, so that the totals
survive restarts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from resnet_scaling.metrics.accuracy import TimeToAccuracy
from resnet_scaling.metrics.throughput import SteadyStateThroughput, ThroughputTimer


class RunClock:
    """Clocks of one run, restored from a checkpoint's saved state when there is one.

    Attributes:
      timer: the training clock (paused around evaluation and checkpoints) and images/sec per interval.
      steady: the steady-state throughput after the timing warm-up.
      time_to_accuracy: when the target top-1 was first reached.
      eval_sec, checkpoint_sec: seconds spent evaluating and saving, over every launch.
    """

    def __init__(self, global_batch_size: int, timing_warmup_steps: int, target_top1: float,
                 saved: Mapping[str, Any] | None = None) -> None:
        saved = saved or {}
        self.timer = ThroughputTimer(global_batch_size, total_sec=float(saved.get("train_sec", 0.0)))
        self.steady = SteadyStateThroughput(global_batch_size, timing_warmup_steps)
        self.steady.load_state_dict(saved.get("steady_state"))
        self.time_to_accuracy = TimeToAccuracy(target_top1)
        self.time_to_accuracy.load_state_dict(saved.get("time_to_accuracy"))
        self.eval_sec = float(saved.get("eval_sec", 0.0))
        self.checkpoint_sec = float(saved.get("checkpoint_sec", 0.0))
        self._wall_sec_before = float(saved.get("wall_sec", 0.0))
        self._loop_start: float | None = None

    def start(self) -> None:
        """Starts the wall clock and the training clock: the training loop begins."""
        self._loop_start = time.perf_counter()
        self.timer.start()

    def wall_sec(self) -> float:
        """MLPerf's clock: the training loop's wall time over every launch of the run."""
        if self._loop_start is None:
            return self._wall_sec_before
        return self._wall_sec_before + time.perf_counter() - self._loop_start

    def timed_sec(self) -> float:
        """Training seconds in the timed region (after the timing warm-up)."""
        return self.steady.timed_sec(self.timer.total_sec)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves, so that a resumed run continues these totals."""
        return {"train_sec": self.timer.total_sec, "eval_sec": self.eval_sec,
                "checkpoint_sec": self.checkpoint_sec, "wall_sec": self.wall_sec(),
                "steady_state": self.steady.state_dict(),
                "time_to_accuracy": self.time_to_accuracy.state_dict()}

    def time_summary(self, compile_sec: float) -> dict[str, float]:
        """The summary's `time` section."""
        return {"compile_sec": compile_sec, "train_sec": float(self.timer.total_sec),
                "eval_sec": float(self.eval_sec), "checkpoint_sec": float(self.checkpoint_sec),
                "wall_sec": float(self.wall_sec())}
