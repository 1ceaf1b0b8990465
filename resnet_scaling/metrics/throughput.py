"""Throughput on a training clock that skips compile, evaluation and checkpoints; the steady state.

The case study's steady state starts after a warm-up (the first epoch, or `training.timing_warmup_*`).
Step-time percentiles are over log intervals' mean sec/step: timing single steps needs a sync per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


class ThroughputTimer:
    """Images/sec between log points, from a clock that the caller pauses around evaluation and saves.

    `total_sec`: all training time (checkpointed, so it survives restarts); `clock`: injectable for tests.
    """

    def __init__(self, images_per_step: int, total_sec: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.images_per_step = images_per_step
        self.total_sec = total_sec
        self._clock = clock
        self._interval_sec = 0.0
        self._mark: float | None = None
        self._steps = 0

    @property
    def running(self) -> bool:
        return self._mark is not None

    def start(self) -> None:
        self._mark = self._clock()

    def pause(self) -> None:
        if self._mark is not None:
            elapsed = self._clock() - self._mark
            self._interval_sec += elapsed
            self.total_sec += elapsed
            self._mark = None

    def count(self, steps: int = 1) -> None:
        self._steps += steps

    def read_total_sec(self) -> float:
        """The training seconds so far, without stopping the clock."""
        if self._mark is not None:
            self.pause()
            self.start()
        return self.total_sec

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


class SteadyStateThroughput:
    """Steady-state figures of a run: images/sec after the warm-up, step-time percentiles, input wait.

    `end_warmup` comes where the device has caught up; checkpointed, the figures span restarts.

    Args:
      images_per_step: the global batch size.
      warmup_steps: steps before the timed region starts (0: it starts with the first step).
    """

    def __init__(self, images_per_step: int, warmup_steps: int) -> None:
        self.images_per_step = images_per_step
        self.warmup_steps = warmup_steps
        # Training-clock seconds at the end of the warm-up; 0 when there is none, None until reached.
        self.warmup_train_sec: float | None = 0.0 if warmup_steps == 0 else None
        self.interval_sec_per_step: list[float] = []
        self.input_wait_sec = 0.0

    def end_warmup(self, train_sec: float) -> None:
        """Marks the start of the timed region at `train_sec` on the training clock."""
        self.warmup_train_sec = train_sec

    def in_timed_region(self, step: int) -> bool:
        """Whether step `step` (1-based) runs after the warm-up."""
        return step > self.warmup_steps

    def timed_sec(self, train_sec: float) -> float:
        """Training-clock seconds since the end of the warm-up (0 before it ends)."""
        if self.warmup_train_sec is None:
            return 0.0
        return max(0.0, train_sec - self.warmup_train_sec)

    def add_interval(self, first_step: int, last_step: int, sec_per_step: float | None) -> None:
        """Records one log interval's mean sec/step if it lies wholly after the warm-up."""
        if sec_per_step is not None and self.in_timed_region(first_step) and last_step >= first_step:
            self.interval_sec_per_step.append(float(sec_per_step))

    def add_input_wait(self, step: int, seconds: float) -> None:
        """Adds host seconds spent waiting for step `step`'s batch (counted after the warm-up only)."""
        if self.in_timed_region(step):
            self.input_wait_sec += seconds

    def summary(self, final_step: int, train_sec: float) -> dict[str, Any]:
        """Steady-state figures at `final_step`, with `train_sec` the training clock's total.

        Returns:
          The figures; None without a timed region, percentiles None without a whole interval after it.
        """
        steps = max(0, final_step - self.warmup_steps)
        seconds = self.timed_sec(train_sec)
        timed = self.warmup_train_sec is not None and steps > 0 and seconds > 0
        intervals = np.asarray(self.interval_sec_per_step, dtype=np.float64)
        percentiles = {f"step_time_sec_p{q}": (float(np.percentile(intervals, q)) if intervals.size else None)
                       for q in (50, 90, 99)}
        return {
            "steady_state_steps": steps,
            "steady_state_sec": seconds,
            "images_per_sec": steps * self.images_per_step / seconds if timed else None,
            **percentiles,
            "input_wait_fraction": self.input_wait_sec / seconds if timed else None,
        }

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot (for the checkpoint's clocks)."""
        return {"warmup_steps": self.warmup_steps, "warmup_train_sec": self.warmup_train_sec,
                "interval_sec_per_step": list(self.interval_sec_per_step),
                "input_wait_sec": self.input_wait_sec}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restores a snapshot from `state_dict` (None or {} leaves a fresh one)."""
        if not state:
            return
        self.warmup_train_sec = state["warmup_train_sec"]
        self.interval_sec_per_step = [float(x) for x in state["interval_sec_per_step"]]
        self.input_wait_sec = float(state["input_wait_sec"])
