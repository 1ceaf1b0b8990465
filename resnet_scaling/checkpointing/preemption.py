"""Preemption: every process stops at the same step after a SIGTERM or a Ctrl-C, so the run saves and ends."""

from __future__ import annotations

import threading

import jax
import orbax.checkpoint as ocp

from resnet_scaling.job import stopping


class PreemptionWatcher:
    """Tells every process to stop at the same step after a SIGTERM (what TPU and spot VMs send) or a
    Ctrl-C (SIGINT), so that the run saves a checkpoint and ends cleanly; a second Ctrl-C stops at once.

    The signals are `stopping.StopSignals`'s: the command's, or (library code) one installed for the loop.
    With several processes, jax's preemption sync point (from `jax.distributed.initialize`) picks the step;
    it listens for SIGTERM, so a Ctrl-C is passed on as one.
    """

    def __init__(self) -> None:
        self._stop = stopping.StopSignals.current()
        self._installed = None
        if self._stop is None and threading.current_thread() is threading.main_thread():
            # Python delivers signals to the main thread only: elsewhere nothing is installed.
            self._stop = self._installed = stopping.StopSignals.install(
                exit_process=False, doing="training", take_sigterm=jax.process_count() == 1)
        if self._stop is not None:
            self._stop.forward_sigint_as_sigterm = jax.process_count() > 1

    @property
    def signal_name(self) -> str:
        """The signal that stopped the run (a process told by JAX's notice: SIGTERM)."""
        return (self._stop.signal_name if self._stop is not None else None) or "SIGTERM"

    def stop_requested(self) -> bool:
        """Whether a stop came in to this process, when it alone runs (a job's processes stop together)."""
        return jax.process_count() == 1 and self._stop is not None and self._stop.requested

    def reached(self, step: int) -> bool:
        """True at the step where every process should save and stop."""
        if jax.process_count() > 1:
            return ocp.utils.reached_preemption(step)
        return self._stop is not None and self._stop.requested

    def close(self) -> None:
        """Signals act as before the loop."""
        if self._installed is not None:
            self._installed.uninstall()
            self._installed = None
