"""Divergence: no checkpoint holds a diverged state, and the error names the newest sound one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from resnet_scaling.checkpointing import state_checks
from resnet_scaling.job.errors import RunError

if TYPE_CHECKING:
    from resnet_scaling.checkpointing import Checkpointer


class DivergenceError(RunError, FloatingPointError):
    """Training diverged (a non-finite loss, a non-finite or exploding state); the message names the step
    and the newest checkpoint that holds a sound state."""


def first_non_finite_step(records: list[dict[str, float]], key: str = "loss") -> int | None:
    """The step of the first record whose `key` is NaN or infinite, else None."""
    for record in records:
        if not np.isfinite(record[key]):
            return int(record["step"])
    return None


class DivergenceGuard:
    """Keeps diverged states out of checkpoints and says truthfully which checkpoint is sound.

    A checkpoint of step k holds the state after update k, which only step k+1's loss evaluates. So a state
    is saved only if finite with its parameter norm within `max_norm_growth` of the run's start, and a first
    non-finite loss at step j moves the checkpoints of steps j-1 on to WORKDIR/diverged_checkpoints/.
    """

    def __init__(self, state: Any, start_step: int, max_norm_growth: float,
                 checkpointer: Checkpointer | None) -> None:
        self._start_step = start_step
        self._max_norm_growth = max_norm_growth
        self._start_norm = state_checks.health(state)[1] if max_norm_growth else 0.0
        self._checkpointer = checkpointer

    def check_losses(self, records: list[dict[str, float]]) -> None:
        """Raises `DivergenceError` at the first non-finite loss in `records` (after discarding the
        checkpoints it disproves)."""
        bad_step = first_non_finite_step(records)
        if bad_step is None:
            return
        loss = next(r["loss"] for r in records if r["step"] == bad_step)
        if self._start_step > 0 and bad_step == self._start_step + 1:
            cause = (f"the state restored from the checkpoint of step {self._start_step} gives a loss of "
                     f"{loss} at the first step: that checkpoint holds a diverged state")
        else:
            cause = f"the training loss is {loss} at step {bad_step}"
        raise DivergenceError(f"Training diverged: {cause}. {self._keep_sound(bad_step - 1)} Lower the "
                              "learning rate, lengthen the warm-up or use float32/bfloat16 compute.")

    def check_state(self, step: int, state: Any) -> None:
        """Raises `DivergenceError` instead of saving a non-finite or exploding state."""
        finite, norm = state_checks.health(state)
        if not finite:
            problem = "holds NaN or infinite values"
        elif self._max_norm_growth and norm > self._max_norm_growth * self._start_norm:
            problem = (f"has a parameter norm {norm / self._start_norm:.3g}x that of step {self._start_step} "
                       f"(above training.max_param_norm_growth={self._max_norm_growth:g})")
        else:
            return
        raise DivergenceError(f"Training diverged: the state after step {step} {problem}; it was not "
                              f"saved. {self._keep_sound(step)} Lower the learning rate or lengthen the "
                              "warm-up.")

    def _keep_sound(self, first_unsound_step: int) -> str:
        """Discards the checkpoints from `first_unsound_step` on; names the one a rerun resumes from."""
        if self._checkpointer is None:
            return "Checkpoints are off."
        kept = self._checkpointer.discard_from(first_unsound_step, "saved from a diverged state")
        if kept is None:
            return "No sound checkpoint is left: a rerun starts from step 0."
        return (f"The newest sound checkpoint is step {kept} in {self._checkpointer.directory} (its next "
                "step's loss was finite); a rerun resumes from it.")
