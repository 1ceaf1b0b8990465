"""Time-to-accuracy: the first evaluation reaching a target top-1 (default 76%, MLPerf 75.9%), on two clocks.

- The case study's (`time_to_accuracy_sec`): training seconds from the warm-up's end (the first epoch, or
  `training.timing_warmup_*`) to that evaluation; compile, evaluation and checkpointing are off it.
- MLPerf's (`mlperf_time_to_accuracy_sec`): wall seconds from the training loop's start to that evaluation's
  end, evaluation and checkpointing included; not the time from a preemption to the resume (unknown to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MLPERF_TARGET_TOP1 = 0.759
CASE_STUDY_TARGET_TOP1 = 0.76


class TimeToAccuracy:
    """Fed every evaluation; records the first at or above `target_top1`, and the best and final top-1.

    No clocks of its own (the caller passes both readings): testable on a script, saved in checkpoints.
    """

    def __init__(self, target_top1: float = CASE_STUDY_TARGET_TOP1) -> None:
        if not 0.0 < target_top1 <= 1.0:
            raise ValueError(f"target_top1 must lie in (0, 1], got {target_top1}.")
        self.target_top1 = float(target_top1)
        self.reached: dict[str, float] | None = None  # The first evaluation at or above the target.
        self.best_top1: float | None = None
        self.final_top1: float | None = None
        self.num_evals = 0

    def update(self, step: int, epoch: float, eval_top1: float, timed_sec: float, wall_sec: float) -> bool:
        """Records one evaluation.

        Args:
          epoch: step / steps per epoch.
          eval_top1: top-1 over the whole evaluation split, in [0, 1].
          timed_sec: training seconds in the timed region (after the warm-up) so far.
          wall_sec: wall seconds since training started, evaluations (this one too) included.

        Returns:
          True if this evaluation is the first to reach the target.
        """
        eval_top1 = float(eval_top1)
        self.num_evals += 1
        self.final_top1 = eval_top1
        self.best_top1 = eval_top1 if self.best_top1 is None else max(self.best_top1, eval_top1)
        if self.reached is not None or eval_top1 < self.target_top1:
            return False
        self.reached = {"step": int(step), "epoch": float(epoch), "eval_top1": eval_top1,
                        "timed_sec": float(timed_sec), "wall_sec": float(wall_sec)}
        return True

    def result(self) -> dict[str, Any]:
        """The headline figures (None where the target was not reached or nothing was evaluated)."""
        r = self.reached or {}
        return {
            "target_top1": self.target_top1,
            "reached": self.reached is not None,
            "time_to_accuracy_sec": r.get("timed_sec"),
            "mlperf_time_to_accuracy_sec": r.get("wall_sec"),
            "epochs_to_accuracy": r.get("epoch"),
            "steps_to_accuracy": r.get("step"),
            "final_eval_top1": self.final_top1,
            "best_eval_top1": self.best_top1,
            "num_evals": self.num_evals,
        }

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot (for the checkpoint's clocks)."""
        return {"target_top1": self.target_top1, "reached": self.reached, "best_top1": self.best_top1,
                "final_top1": self.final_top1, "num_evals": self.num_evals}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restores a snapshot; a snapshot for another target keeps only best/final top-1 and re-arms."""
        if not state:
            return
        self.best_top1, self.final_top1 = state["best_top1"], state["final_top1"]
        self.num_evals = int(state["num_evals"])
        # A resumed run with another target must not report the old target's time.
        same_target = abs(float(state["target_top1"]) - self.target_top1) < 1e-12
        self.reached = dict(state["reached"]) if same_target and state["reached"] else None
