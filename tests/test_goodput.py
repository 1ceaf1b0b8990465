"""Goodput across launches: a run preempted, then crashed, then finished reports the recomputed steps and
the restart gaps as the test arranged them, and its seconds add up to the wall time."""

import json
import time

import pytest

from resnet_scaling import checkpointing, metrics, trainer
from tests.helpers import random_arrays, tiny_config

GAP_SEC = 100.0  # Each restart happens this long (on the injected wall clock) after the last launch ended.


def test_a_run_preempted_then_crashed_reports_recomputed_steps_and_restart_gaps(tmp_path, monkeypatch):
    offset = {"sec": 0.0}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + offset["sec"])
    config = tiny_config(training__num_train_steps=10, training__log_every_steps=1, checkpoint__enabled=True,
                         checkpoint__every_steps=4, checkpoint__async_save=False)
    arrays = random_arrays()

    # Launch 1: preempted (as by SIGTERM) at step 3, which it saves.
    real_reached = checkpointing.PreemptionWatcher.reached
    monkeypatch.setattr(checkpointing.PreemptionWatcher, "reached", lambda self, step: step == 3)
    first = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert first.preempted and int(first.state.step) == 3
    monkeypatch.setattr(checkpointing.PreemptionWatcher, "reached", real_reached)

    # Launch 2: resumes at 3, saves step 4, reaches step 8 and dies while saving it: steps 5-8 are lost.
    offset["sec"] += GAP_SEC
    real_save = checkpointing.Checkpointer.save

    def save_or_die(self, step, state, clock):
        if step == 8:
            raise RuntimeError("the machine went away")
        return real_save(self, step, state, clock)

    monkeypatch.setattr(checkpointing.Checkpointer, "save", save_or_die)
    with pytest.raises(RuntimeError, match="went away"):
        trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", real_save)

    # Launch 3: resumes at 4 and finishes.
    offset["sec"] += GAP_SEC
    third = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert third.start_step == 4 and int(third.state.step) == 10

    goodput = third.summary["goodput"]
    assert metrics.check_summary(third.summary) == []
    assert goodput["launches"] == 3
    assert goodput["recomputed_steps"] == 4  # 5, 6, 7 and 8, done again by launch 3.
    # The arranged gaps, plus the moments between one launch's last record and the next one's start.
    assert 2 * GAP_SEC <= goodput["restart_gaps_sec"] < 2 * GAP_SEC + 10
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    second = launches[1]
    assert (second["start_step"], second["last_step"]) == (3, 8)
    assert goodput["recomputed_steps_sec"] == pytest.approx(
        second["sec"]["training"] - second["training_sec_at"]["4"])
    assert goodput["recomputed_steps_sec"] > 0
    causes = [k for k in goodput if k.endswith("_sec") and k not in ("total_wall_sec", "productive_sec")]
    assert goodput["productive_sec"] + sum(goodput[k] for k in causes) == pytest.approx(
        goodput["total_wall_sec"])
    assert goodput["total_wall_sec"] > 2 * GAP_SEC and 0 < goodput["goodput"] < 0.1


def test_a_fresh_run_in_a_new_workdir_starts_a_new_account(tmp_path):
    result = trainer.train_and_evaluate(tiny_config(), str(tmp_path), arrays=random_arrays())
    goodput = result.summary["goodput"]
    assert goodput["launches"] == 1 and goodput["recomputed_steps"] == 0 and goodput["restart_gaps_sec"] == 0
    assert 0 < goodput["goodput"] < 1
