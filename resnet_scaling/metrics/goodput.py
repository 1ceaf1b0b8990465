"""Goodput across every launch of a run, as MaxText reports it, and the rest (badput) by cause.

Goodput: the fraction of wall time since the first launch's start (restarts and gaps included) spent in
productive steps: training-clock seconds minus input waiting minus recomputed steps. Process 0 rewrites
each launch's account (seconds by `LAUNCH_BUCKETS` cause, its first and last step, training seconds at
each checkpoint it saved) into WORKDIR/goodput.json at every log point, evaluation and checkpoint, so a
launch that dies keeps it up to there. From the earlier launches' accounts, the next launch adds:

- *recomputed steps*: resuming at step k after an earlier launch reached m > k (a crash, a lost
  checkpoint) redoes k+1..m; their training seconds in the earlier launch are badput;
- *restart gaps*: an earlier launch's last recorded moment to the next one's start (a preempted job's
  wait, plus the unrecorded end of a launch that died);
- *other*: the rest (logging, writing summaries, host work between steps outside the clocks).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

from etils import epath

from resnet_scaling.job import workdir as workdir_lib

GOODPUT_FILENAME = "goodput.json"
# Per-launch seconds by cause, as each launch records them.
LAUNCH_BUCKETS = ("initialization", "compilation", "training", "input_wait", "evaluation", "checkpointing")


class GoodputRecorder:
    """This launch's account, and the run's goodput over it and every earlier launch in the workdir.

    Args:
      workdir: the run's workdir (its goodput.json holds the earlier launches).
      start_step: 0 or the restored checkpoint's step; None until known (`started`), so that a launch
        that dies in its set-up is on record.
      launch_start_wall: `time.time()` at the start of `train_and_evaluate`.
      write: whether this process writes goodput.json (process 0).
    """

    def __init__(self, workdir: str, start_step: int | None, launch_start_wall: float,
                 write: bool = True) -> None:
        self._path = workdir_lib.as_path(workdir) / GOODPUT_FILENAME
        self._write = write
        # From step 0 too: a launch that died before its first checkpoint trained steps this one redoes.
        self.earlier = _read_launches(self._path)
        self.launch: dict[str, Any] = {
            "start_wall": launch_start_wall, "last_wall": launch_start_wall, "start_step": None,
            "last_step": None, "sec": dict.fromkeys(LAUNCH_BUCKETS, 0.0), "training_sec_at": {}}
        if start_step is None:
            self._write_accounts()
        else:
            self.started(start_step)

    def started(self, start_step: int) -> None:
        """Records the step this launch starts from, once its state is restored."""
        self.launch.update(start_step=int(start_step), last_step=int(start_step))
        self.record(start_step, {})  # A launch that dies before its first log point still counts.

    def forget(self) -> None:
        """Takes this launch off the record: it had nothing to do (a finished run, a refused config)."""
        self._write_accounts(include_this_launch=False)

    def record(self, step: int, sec: Mapping[str, float], checkpoint: bool = False) -> None:
        """Writes this launch's account at `step` (its seconds so far by cause); `checkpoint`: saved there."""
        self.launch.update(last_wall=time.time(), last_step=int(step))
        self.launch["sec"] = {k: float(sec.get(k, 0.0)) for k in LAUNCH_BUCKETS}
        if checkpoint:
            self.launch["training_sec_at"][str(int(step))] = self.launch["sec"]["training"]
        self._write_accounts()

    def _write_accounts(self, include_this_launch: bool = True) -> None:
        if not self._write:
            return
        launches = [*self.earlier, self.launch] if include_this_launch else self.earlier
        if not launches:
            self._path.unlink(missing_ok=True)
            return
        # A reader (the next launch) never sees half a file.
        workdir_lib.write_text_atomically(self._path, json.dumps({"launches": launches}, indent=1))

    def summary(self) -> dict[str, Any]:
        """The summary's `goodput` section over every launch."""
        return goodput_summary([*self.earlier, self.launch])


def goodput_summary(launches: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Goodput and badput by cause over `launches` (oldest first), as `GoodputRecorder.summary`. A launch
    that died before it knew its start step trained nothing: its time is in the restart gaps."""
    wall = launches[-1]["last_wall"] - launches[0]["start_wall"]
    gaps = sum(max(0.0, b["start_wall"] - a["last_wall"]) for a, b in itertools.pairwise(launches))
    recomputed_steps, recomputed_sec = 0, 0.0
    trained = [launch for launch in launches if launch["start_step"] is not None]
    for earlier, later in itertools.pairwise(trained):
        lost = earlier["last_step"] - later["start_step"]
        if lost > 0:
            recomputed_steps += lost
            recomputed_sec += earlier["sec"]["training"] - _training_sec_at(earlier, later["start_step"])
    sums = {k: sum(launch["sec"][k] for launch in launches) for k in LAUNCH_BUCKETS}
    productive = max(0.0, sums["training"] - sums["input_wait"] - recomputed_sec)
    badput = {
        "initialization_sec": sums["initialization"], "compilation_sec": sums["compilation"],
        "input_wait_sec": sums["input_wait"], "evaluation_sec": sums["evaluation"],
        "checkpointing_sec": sums["checkpointing"], "recomputed_steps_sec": recomputed_sec,
        "restart_gaps_sec": gaps}
    badput["other_sec"] = max(0.0, wall - productive - sum(badput.values()))
    return {"total_wall_sec": wall, "productive_sec": productive,
            "goodput": productive / wall if wall > 0 else None, "launches": len(launches),
            "recomputed_steps": recomputed_steps, **badput}


def _training_sec_at(launch: Mapping[str, Any], step: int) -> float:
    """Training seconds `launch` had spent when it reached `step`: at a checkpoint it saved there, 0 at or
    before its start; otherwise pro rata over its steps (a checkpoint written by another launch)."""
    saved = launch["training_sec_at"].get(str(step))
    if saved is not None:
        return float(saved)
    if step <= launch["start_step"]:
        return 0.0
    done = launch["last_step"] - launch["start_step"]
    return launch["sec"]["training"] * (step - launch["start_step"]) / done if done > 0 else 0.0


def _read_launches(path: epath.Path) -> list[dict[str, Any]]:
    """The earlier launches' accounts; none where the file is missing, and none (the file set aside with a
    warning) where it is damaged or not an account this module wrote."""
    consequence = "goodput counts from this launch on."
    record = workdir_lib.read_json(path, consequence)
    if record is None:
        return []
    launches = record.get("launches") if isinstance(record, dict) else None
    if not isinstance(launches, list) or not all(_is_launch(launch) for launch in launches):
        workdir_lib.set_aside(path, "does not hold launch accounts", consequence)
        return []
    return launches


def _is_launch(launch: Any) -> bool:
    numbers = (int, float)
    try:
        steps = (launch["start_step"], launch["last_step"])
        return (all(isinstance(launch[k], numbers) for k in ("start_wall", "last_wall"))
                and (all(isinstance(s, int) for s in steps) or steps == (None, None))
                and all(isinstance(launch["sec"][k], numbers) for k in LAUNCH_BUCKETS)
                and isinstance(launch["training_sec_at"], dict))
    except (KeyError, TypeError):
        return False
