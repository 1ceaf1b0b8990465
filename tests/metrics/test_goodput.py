"""Goodput: each cause's injected seconds land in its own bucket; a run preempted, then crashed, then
finished reports the recomputed steps and the restart gaps as the test arranged them."""

import json
import time

import pytest

from resnet_scaling import checkpointing, metrics
from resnet_scaling.checkpointing import preemption
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config
from tests.injected_delays import inject_delays

GAP_SEC = 100.0  # Each restart happens this long (on the injected wall clock) after the last launch ended.
SLEEP_SEC = 0.2  # Injected into set-up, compilation, each evaluation and each save.
STEP_SLEEP_SEC = 0.05  # Injected into each step, and each wait for a batch.


def test_each_cause_s_injected_seconds_land_in_its_own_bucket_of_a_fresh_account(tmp_path, monkeypatch):
    delays = inject_delays(monkeypatch, setup_sec=SLEEP_SEC, compile_sec=SLEEP_SEC, step_sec=STEP_SLEEP_SEC,
                           input_sec=STEP_SLEEP_SEC, eval_sec=SLEEP_SEC, save_sec=SLEEP_SEC)
    # 4 steps of 16 of the 64 images: evaluations and saves after steps 2 and 4.
    config = tiny_config(eval__every_epochs=0.5, checkpoint__enabled=True, checkpoint__every_steps=2,
                         checkpoint__async_save=False)
    call_wall = time.time()
    result = trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    end, end_wall = time.perf_counter(), time.time()
    goodput = result.summary["goodput"]
    assert goodput["launches"] == 1 and goodput["recomputed_steps"] == 0  # A new workdir: a new account.
    assert goodput["recomputed_steps_sec"] == 0 and goodput["restart_gaps_sec"] == 0
    causes = ("setup", "compile", "step", "input", "eval", "save")
    assert [len(delays.measured[cause]) for cause in causes] == [1, 1, 4, 3, 2, 2]
    measured = {cause: delays.total(cause) for cause in causes}  # Each at least its sleeps.

    # Each bucket holds at least what the test timed around its cause's sleeps (the library's timing of a
    # cause encloses the test's)...
    assert goodput["initialization_sec"] >= measured["setup"]
    assert goodput["compilation_sec"] >= measured["compile"]
    assert goodput["input_wait_sec"] >= measured["input"]
    assert goodput["evaluation_sec"] >= measured["eval"]
    assert goodput["checkpointing_sec"] >= measured["save"]
    assert goodput["productive_sec"] >= 4 * STEP_SLEEP_SEC
    # ...and no other cause's sleep. Set-up and compilation end before the training loop starts (the test
    # read the time as it did), so no later sleep is in them, and the compilation is not counted twice.
    before_loop_sec = delays.loop_start_walls[0] - call_wall
    assert goodput["initialization_sec"] + goodput["compilation_sec"] <= before_loop_sec
    assert goodput["compilation_sec"] < measured["compile"] + SLEEP_SEC / 2  # Not the set-up's sleep.
    # The other buckets are timed around one kind of call each: none holds half another cause's sleeps.
    assert goodput["input_wait_sec"] < measured["input"] + 4 * STEP_SLEEP_SEC / 2  # Not the steps'.
    assert goodput["evaluation_sec"] < measured["eval"] + SLEEP_SEC / 2  # Not a save's.
    assert goodput["checkpointing_sec"] < measured["save"] + SLEEP_SEC / 2  # Not an evaluation's.
    # The training clock holds the steps and the input waiting, never the evaluations and saves (the loop's
    # time as the test measured it, less theirs); of it, the input waiting is not productive.
    train_sec = result.summary["time"]["train_sec"]
    loop_sec = end - delays.loop_starts[0]
    assert measured["step"] + measured["input"] <= train_sec <= loop_sec - measured["eval"] - measured["save"]
    assert goodput["productive_sec"] <= train_sec - measured["input"]
    # The whole holds every sleep, within the launch's time as the test measured it.
    assert sum(measured.values()) <= goodput["total_wall_sec"] <= end_wall - call_wall
    assert 0 < goodput["goodput"] < 1


def test_a_run_preempted_then_crashed_reports_recomputed_steps_and_restart_gaps(tmp_path, monkeypatch):
    offset = {"sec": 0.0}
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + offset["sec"])
    delays = inject_delays(monkeypatch, step_sec=STEP_SLEEP_SEC)  # Reads the time as patched here.
    config = tiny_config(training__num_train_steps=10, training__log_every_steps=1, checkpoint__enabled=True,
                         checkpoint__every_steps=4, checkpoint__async_save=False)
    arrays = random_arrays()
    start_wall = time.time()

    # Launch 1: preempted (as by SIGTERM) at step 3, which it saves.
    real_reached = preemption.PreemptionWatcher.reached
    monkeypatch.setattr(preemption.PreemptionWatcher, "reached", lambda self, step: step == 3)
    first = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert first.preempted and int(first.state.step) == 3
    monkeypatch.setattr(preemption.PreemptionWatcher, "reached", real_reached)
    first_last_record_wall = delays.record_walls[-1]

    # Launch 2: resumes at 3, saves step 4, reaches step 8 and dies while saving it: steps 5-8 are lost.
    offset["sec"] += GAP_SEC
    real_save = checkpointing.Checkpointer.save

    def save_or_die(self, step, state, clock, eval_metrics=None, **options):
        if step == 8:
            raise RuntimeError("the machine went away")
        return real_save(self, step, state, clock, eval_metrics, **options)

    monkeypatch.setattr(checkpointing.Checkpointer, "save", save_or_die)
    second_start = time.perf_counter()
    with pytest.raises(RuntimeError, match="went away"):
        trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    second_sec = time.perf_counter() - second_start
    monkeypatch.setattr(checkpointing.Checkpointer, "save", real_save)
    second_last_record_wall = delays.record_walls[-1]

    # Launch 3: resumes at 4 and finishes.
    offset["sec"] += GAP_SEC
    third = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert third.start_step == 4 and int(third.state.step) == 10
    end_wall = time.time()

    goodput = third.summary["goodput"]
    assert metrics.check_summary(third.summary) == []
    assert goodput["launches"] == 3
    assert goodput["recomputed_steps"] == 4  # 5, 6, 7 and 8, done again by launch 3.
    # The arranged gaps, plus the moments between one launch's last record and the next one's start: at
    # most from as that record began to as the next launch's set-up began, as the test read the time.
    assert len(delays.setup_walls) == 3
    gaps_at_most = ((delays.setup_walls[1] - first_last_record_wall)
                    + (delays.setup_walls[2] - second_last_record_wall))
    assert 2 * GAP_SEC <= goodput["restart_gaps_sec"] <= gaps_at_most
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    second = launches[1]
    assert (second["start_step"], second["last_step"]) == (3, 8)
    # Launch 2 slept before each of steps 5-8 on its training clock: the recomputed steps' seconds hold those
    # sleeps, and no more than launch 2 lasted as this test measured it.
    assert 4 * STEP_SLEEP_SEC <= goodput["recomputed_steps_sec"] <= second_sec
    assert 2 * GAP_SEC < goodput["total_wall_sec"] <= end_wall - start_wall
    assert 0 < goodput["goodput"] < 0.1
