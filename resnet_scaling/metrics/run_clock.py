"""Time accounting: training clock, steady state, time-to-accuracy, eval/checkpoint seconds, loop wall time.

The host dispatches steps ahead of the device, so `pause(wait_for=state)` waits for the device before it
stops the training clock (as big_vision's `chrono.pause(wait_for=...)`): training steps' device time never
counts as evaluation or checkpoint time. Nothing waits per step. Checkpointed (`state_dict()`), totals
survive restarts; given a `GoodputRecorder`, each interval's and paused block's end writes its account.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import jax

from resnet_scaling.metrics.accuracy import TimeToAccuracy
from resnet_scaling.metrics.goodput import GoodputRecorder
from resnet_scaling.metrics.throughput import SteadyStateThroughput, ThroughputTimer

T = TypeVar("T")


class RunClock:
    """Clocks of one run, restored from a checkpoint's saved state when there is one.

    Attributes:
      timer: the training clock (paused around evaluation and checkpoints) and images/sec per interval.
      steady: the steady-state throughput after the timing warm-up.
      time_to_accuracy: when the target top-1 was first reached.
      eval_sec, checkpoint_sec: seconds spent evaluating and saving, over every launch.
      mlperf_stop_step: where an MLPerf-mode run hit the target and stopped (None before); a launch
        resumed from there has nothing left to train.
    """

    def __init__(self, global_batch_size: int, timing_warmup_steps: int, target_top1: float,
                 saved: Mapping[str, Any] | None = None, launch_start_wall: float | None = None,
                 goodput: GoodputRecorder | None = None) -> None:
        saved = saved or {}
        self._goodput = goodput
        self._launch_start_wall = time.time() if launch_start_wall is None else launch_start_wall
        self._saved = {k: float(saved.get(k, 0.0)) for k in ("train_sec", "eval_sec", "checkpoint_sec")}
        self._launch_input_wait_sec = 0.0
        self._launch_compile_sec = 0.0
        self._launch_init_sec = 0.0
        self.timer = ThroughputTimer(global_batch_size, total_sec=float(saved.get("train_sec", 0.0)))
        self.steady = SteadyStateThroughput(global_batch_size, timing_warmup_steps)
        self.steady.load_state_dict(saved.get("steady_state"))
        self.time_to_accuracy = TimeToAccuracy(target_top1)
        self.time_to_accuracy.load_state_dict(saved.get("time_to_accuracy"))
        self.eval_sec = float(saved.get("eval_sec", 0.0))
        self.checkpoint_sec = float(saved.get("checkpoint_sec", 0.0))
        self._wall_sec_before = float(saved.get("wall_sec", 0.0))
        self.mlperf_stop_step: int | None = saved.get("mlperf_stop_step")
        self._loop_start: float | None = None

    def start(self, compile_sec: float = 0.0) -> None:
        """Starts the loop's wall and training clocks; time before, less `compile_sec`, was initialisation."""
        self._loop_start = time.perf_counter()
        self._launch_compile_sec = compile_sec
        self._launch_init_sec = max(0.0, time.time() - self._launch_start_wall - compile_sec)
        self.timer.start()

    def next_batch(self, batches: Iterator[T], step: int) -> T:
        """Step `step`'s batch, the host's wait for it counted (on the training clock)."""
        start = time.perf_counter()
        batch = next(batches)
        seconds = time.perf_counter() - start
        self.steady.add_input_wait(step, seconds)
        self._launch_input_wait_sec += seconds
        return batch

    def launch_sec(self) -> dict[str, float]:
        """This launch's seconds by cause so far, for goodput (`training` includes input waiting)."""
        return {"initialization": self._launch_init_sec, "compilation": self._launch_compile_sec,
                "training": self.timer.read_total_sec() - self._saved["train_sec"],
                "input_wait": self._launch_input_wait_sec,
                "evaluation": self.eval_sec - self._saved["eval_sec"],
                "checkpointing": self.checkpoint_sec - self._saved["checkpoint_sec"]}

    def step_dispatched(self, step: int, outputs: Any) -> None:
        """Counts a dispatched step; at the warm-up's last, waits once for `outputs`: timed region starts."""
        self.timer.count()
        if step == self.steady.warmup_steps:
            jax.block_until_ready(outputs)
            self.steady.end_warmup(self.timer.read_total_sec())

    def end_interval(self, first_step: int, step: int) -> dict[str, float]:
        """Closes the log interval `first_step`..`step`: its timing record, which the steady state counts."""
        record = self.timer.read_and_reset()
        self.steady.add_interval(first_step, step, record.get("sec_per_step"))
        self.record(step)
        return record

    @contextlib.contextmanager
    def paused(self, wait_for: Any, step: int, checkpoint: bool = False) -> Iterator[None]:
        """The block off the training clock, counted as evaluation or (`checkpoint`) checkpointing, then the
        goodput account at `step`. An exception leaves the clock paused: the loop is over."""
        self.pause(wait_for)
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        if checkpoint:
            self.checkpoint_sec += seconds
        else:
            self.eval_sec += seconds
        self.record(step, checkpoint)
        self.resume()

    def evaluated(self, step: int, epoch: float, top1: float) -> bool:
        """Counts an evaluation's top-1 towards time-to-accuracy; True if it first reaches the target."""
        return self.time_to_accuracy.update(step, epoch, top1, self.timed_sec(), self.wall_sec())

    def record(self, step: int, checkpoint: bool = False) -> None:
        """Writes this launch's goodput account at `step` (if given a recorder); `checkpoint`: saved there."""
        if self._goodput is not None:
            self._goodput.record(step, self.launch_sec(), checkpoint=checkpoint)

    def accuracy_summary(self) -> dict[str, Any]:
        """The summary's `accuracy` section (the time to the target top-1)."""
        return self.time_to_accuracy.result()

    def throughput_summary(self, final_step: int) -> dict[str, Any]:
        """The summary's `throughput` section (the steady state's figures)."""
        return self.steady.summary(final_step, self.timer.total_sec)

    def pause(self, wait_for: Any = None) -> None:
        """Stops the training clock once the device has done the work `wait_for` (the state) depends on."""
        if wait_for is not None:
            jax.block_until_ready(wait_for)
        self.timer.pause()

    def resume(self) -> None:
        """Restarts the training clock after an evaluation or a checkpoint."""
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
                "time_to_accuracy": self.time_to_accuracy.state_dict(),
                "mlperf_stop_step": self.mlperf_stop_step}

    def time_summary(self, compile_sec: float) -> dict[str, float]:
        """The summary's `time` section."""
        return {"compile_sec": compile_sec, "train_sec": float(self.timer.total_sec),
                "eval_sec": float(self.eval_sec), "checkpoint_sec": float(self.checkpoint_sec),
                "wall_sec": float(self.wall_sec())}
