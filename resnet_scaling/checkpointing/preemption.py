"""Preemption: every process stops at the same step after a SIGTERM or a Ctrl-C, so the run saves and ends."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)


class PreemptionWatcher:
    """Tells every process to stop at the same step after a SIGTERM (what TPU and spot VMs send) or a
    Ctrl-C (SIGINT), so that the run saves a checkpoint and ends cleanly; a second Ctrl-C stops at once.

    With several processes, jax's preemption sync point (from `jax.distributed.initialize`) picks the step;
    it listens for SIGTERM, so a Ctrl-C is passed on as one. A single process installs its own handlers.
    """

    def __init__(self) -> None:
        self._signalled = threading.Event()
        self.signal_name = "SIGTERM"
        self._previous_handlers: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only.
        if jax.process_count() == 1:
            self._previous_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        self._previous_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            if self._signalled.is_set():  # The second Ctrl-C: stop now, without a checkpoint.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            logger.warning("Ctrl-C: saving a checkpoint and stopping (press it again to stop at once).")
        self.signal_name = signal.Signals(signum).name
        self._signalled.set()
        if jax.process_count() > 1:  # Let jax's preemption notifier pick the common step.
            os.kill(os.getpid(), signal.SIGTERM)

    def reached(self, step: int) -> bool:
        """True at the step where every process should save and stop."""
        if jax.process_count() > 1:
            return ocp.utils.reached_preemption(step)
        return self._signalled.is_set()

    def close(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}
