"""A `jax.profiler` trace of a window of training steps, written where TensorBoard's profile plugin looks.

`config.training.profile_steps = (first, last)` traces steps first..last (inclusive; (0, 0): off) into
WORKDIR/tensorboard/plugins/profile/<time>/ (the "Profile" tab of `tensorboard --logdir WORKDIR/tensorboard`).
The window is on the training clock: keep it out of (or short in) a throughput measurement.

Not clu's `periodic_actions.Profile` (clu 0.0.12, the flax example's): it stops once its step count and a
minimum duration (3 s default) have passed, without waiting for the device, so with asynchronous dispatch
the trace can miss the window's last steps; and `clu.periodic_actions` imports TensorFlow, which runs on
arrays or synthetic data never need otherwise (the GPU image has neither).
"""

from __future__ import annotations

import logging
from typing import Any

import jax
from etils import epath

logger = logging.getLogger(__name__)


class StepWindowProfiler:
    """Starts a trace before step `first` is dispatched and stops it after step `last` has run."""

    def __init__(self, profile_steps: tuple[int, int], logdir: str, enabled: bool = True) -> None:
        self.first, self.last = (int(s) for s in profile_steps)
        self.logdir = logdir
        self.enabled = enabled and self.first > 0
        self._tracing = False

    def before_step(self, step: int) -> None:
        if self.enabled and step == self.first:
            epath.Path(self.logdir).mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(self.logdir)
            self._tracing = True
            logger.info("Profiling steps %d to %d into %s.", self.first, self.last, self.logdir)

    def after_step(self, step: int, state: Any, outputs: Any = None) -> None:
        if self._tracing and step >= self.last:
            jax.block_until_ready(state)  # The window's device work belongs in the trace.
            self.close()
            logger.info("Profile written: open it with `tensorboard --logdir %s` (Profile tab).", self.logdir)

    def close(self) -> None:
        """Ends a trace under way (the run ended or failed inside the window)."""
        if self._tracing:
            jax.profiler.stop_trace()
            self._tracing = False
