"""The metrics package: time-to-accuracy, steady-state throughput, utilisation, summary.json."""

import json
import sys
import time

import jax
import pytest

from resnet_scaling import config as config_lib
from resnet_scaling import metrics
from resnet_scaling.checkpointing import preemption
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.metrics import compiled as compiled_lib
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config
from tests.injected_delays import inject_delays
from tests.resnet_tiny_counts import resnet_tiny_sizes, resnet_tiny_train_flops_per_image


class FakeClock:
    """A clock the test advances by hand, for the throughput timer."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _json_roundtrip(state):
    return json.loads(json.dumps(state))  # What a checkpoint's JSON meta does to it.


# Time-to-accuracy.


def test_time_to_accuracy_is_the_first_evaluation_at_target_and_survives_a_restart():
    tta = metrics.TimeToAccuracy(target_top1=0.76)
    assert not tta.update(step=100, epoch=1.0, eval_top1=0.30, timed_sec=0.0, wall_sec=50.0)
    assert not tta.update(step=200, epoch=2.0, eval_top1=0.759, timed_sec=40.0, wall_sec=100.0)
    saved = _json_roundtrip(tta.state_dict())

    resumed = metrics.TimeToAccuracy(target_top1=0.76)  # A new process after a restart.
    resumed.load_state_dict(saved)
    assert resumed.update(step=300, epoch=3.0, eval_top1=0.7601, timed_sec=80.0, wall_sec=160.0)
    assert not resumed.update(step=400, epoch=4.0, eval_top1=0.74, timed_sec=120.0, wall_sec=220.0)
    again = metrics.TimeToAccuracy(target_top1=0.76)  # A second restart, after the target was reached.
    again.load_state_dict(_json_roundtrip(resumed.state_dict()))
    assert not again.update(step=500, epoch=5.0, eval_top1=0.78, timed_sec=160.0, wall_sec=280.0)

    result = again.result()
    assert result == {
        "target_top1": 0.76, "reached": True, "time_to_accuracy_sec": 80.0,
        "mlperf_time_to_accuracy_sec": 160.0, "epochs_to_accuracy": 3.0, "steps_to_accuracy": 300,
        "final_eval_top1": 0.78, "best_eval_top1": 0.78, "num_evals": 5}


def test_mlperf_target_is_selectable_and_a_new_target_rearms_after_a_restart():
    mlperf = metrics.TimeToAccuracy(target_top1=metrics.MLPERF_TARGET_TOP1)
    mlperf.update(step=200, epoch=2.0, eval_top1=0.759, timed_sec=40.0, wall_sec=100.0)
    assert mlperf.result()["steps_to_accuracy"] == 200  # 75.9% counts for MLPerf's target...

    case_study = metrics.TimeToAccuracy(target_top1=0.76)
    case_study.load_state_dict(_json_roundtrip(mlperf.state_dict()))
    result = case_study.result()
    assert not result["reached"] and result["time_to_accuracy_sec"] is None  # ...not for 76%.
    assert result["best_eval_top1"] == 0.759 and result["num_evals"] == 1


def test_time_to_accuracy_without_evaluations_reports_nothing_reached():
    result = metrics.TimeToAccuracy().result()
    assert result["target_top1"] == 0.76 and not result["reached"]
    assert result["final_eval_top1"] is None and result["epochs_to_accuracy"] is None
    with pytest.raises(ValueError, match="target_top1"):
        metrics.TimeToAccuracy(target_top1=76.0)  # A percentage, not a fraction.


# Throughput.


def test_throughput_timer_excludes_paused_evaluation_time():
    clock = FakeClock()
    timer = metrics.ThroughputTimer(images_per_step=32, clock=clock)
    timer.start()
    clock.advance(2.0)
    timer.count(4)
    timer.pause()
    clock.advance(100.0)  # An evaluation, off the clock.
    timer.start()
    clock.advance(2.0)
    timer.count(4)
    assert timer.read_and_reset() == {"images_per_sec": 8 * 32 / 4.0, "sec_per_step": 0.5}
    assert timer.total_sec == 4.0
    clock.advance(1.0)
    assert timer.read_total_sec() == 5.0 and timer.running  # Read without stopping the clock.


def test_steady_state_throughput_excludes_warmup_compile_and_evaluation():
    clock = FakeClock()
    clock.advance(30.0)  # Compile: before the timer starts.
    timer = metrics.ThroughputTimer(images_per_step=64, clock=clock)
    steady = metrics.SteadyStateThroughput(images_per_step=64, warmup_steps=2)
    timer.start()
    step_sec = {1: 5.0, 2: 3.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 3.0, 7: 1.0, 8: 1.0}  # Steps 1-2: warm-up.
    first = 1
    for step, seconds in step_sec.items():
        if step > 1:
            steady.add_input_wait(step, 0.25)  # Host time in next(batches): on the training clock.
        clock.advance(seconds)
        timer.count()
        if step == 2:
            steady.end_warmup(timer.read_total_sec())
        if step % 2 == 0:
            steady.add_interval(first, step, timer.read_and_reset()["sec_per_step"])
            first = step + 1
            timer.pause()
            clock.advance(50.0)  # An evaluation after every log point.
            timer.start()
    timer.pause()
    summary = steady.summary(final_step=8, train_sec=timer.total_sec)
    assert summary["steady_state_steps"] == 6 and summary["steady_state_sec"] == 8.0
    assert summary["images_per_sec"] == 6 * 64 / 8.0  # Not 8 * 64 / 16 (warm-up) nor / 166 (evals).
    # Log intervals after the warm-up: steps 3-4, 5-6, 7-8 at 1.0, 2.0, 1.0 sec/step.
    assert summary["step_time_sec_p50"] == 1.0
    assert summary["step_time_sec_p90"] == pytest.approx(1.8)
    assert summary["step_time_sec_p99"] == pytest.approx(1.98)
    assert summary["input_wait_fraction"] == pytest.approx(6 * 0.25 / 8.0)

    restored = metrics.SteadyStateThroughput(images_per_step=64, warmup_steps=2)
    restored.load_state_dict(_json_roundtrip(steady.state_dict()))
    assert restored.summary(final_step=8, train_sec=timer.total_sec) == summary


def test_steady_state_before_the_warmup_ends_has_no_figures():
    steady = metrics.SteadyStateThroughput(images_per_step=64, warmup_steps=10)
    summary = steady.summary(final_step=4, train_sec=3.0)
    assert summary["images_per_sec"] is None and summary["step_time_sec_p50"] is None
    assert steady.timed_sec(3.0) == 0.0


# Utilisation.


class _Compiled:
    def __init__(self, cost):
        self._cost = cost

    def cost_analysis(self):
        if isinstance(self._cost, Exception):
            raise self._cost
        return self._cost


@pytest.mark.parametrize("cost, flops", [
    ({"flops": 2e9}, 2e9), ([{"flops": 3e9}], 3e9), ([], None), (None, None), ({"flops": -1.0}, None),
    (NotImplementedError("no cost analysis"), None)])
def test_flops_per_device_reads_every_cost_analysis_shape(cost, flops):
    assert compiled_lib.flops_per_device(_Compiled(cost)) == flops


def test_utilisation_is_achieved_flops_over_the_peak():
    u = metrics.utilisation(flops_per_step_per_device=24.5e9 * 128, sec_per_step=0.25, num_devices=8,
                            device_kind="TPU v3")
    assert u["flops_per_step"] == 24.5e9 * 128 * 8
    assert u["tflops_per_sec_per_device"] == pytest.approx(12.544)
    assert u["mfu"] == pytest.approx(12.544 / 61.5)
    cpu = metrics.utilisation(1e9, 0.5, 1, "cpu")
    assert cpu["tflops_per_sec_per_device"] == pytest.approx(0.002) and cpu["mfu"] is None
    measured = metrics.utilisation(1e9, 0.5, 1, "cpu", measured_peak_tflops=0.004)
    assert measured["mfu"] == pytest.approx(0.5)


# summary.json from real (tiny) runs.

SUMMARY_KEYS = {
    "run": {"devices", "device_kind", "platform", "process_count", "global_batch_size",
            "per_device_batch_size", "steps_per_epoch", "start_step", "final_step", "total_steps",
            "timing_warmup_steps", "preempted"},
    "throughput": {"images_per_sec", "images_per_sec_per_device", "steady_state_steps", "steady_state_sec",
                   "step_time_sec_p50", "step_time_sec_p90", "step_time_sec_p99", "input_wait_fraction"},
    "time": {"compile_sec", "train_sec", "eval_sec", "checkpoint_sec", "wall_sec"},
    "accuracy": {"target_top1", "reached", "time_to_accuracy_sec", "mlperf_time_to_accuracy_sec",
                 "epochs_to_accuracy", "steps_to_accuracy", "final_eval_top1", "best_eval_top1", "num_evals"},
    "utilisation": {"flops_per_step", "flops_per_step_per_device", "tflops_per_sec_per_device",
                    "peak_tflops_per_device", "mfu"},
    "goodput": {"total_wall_sec", "productive_sec", "goodput", "launches", "recomputed_steps",
                "initialization_sec", "compilation_sec", "input_wait_sec", "evaluation_sec",
                "checkpointing_sec", "recomputed_steps_sec", "restart_gaps_sec", "other_sec"},
    "mlperf": {"mode", "log_file", "target_top1", "status", "time_to_train_sec", "epochs_to_target",
               "run_sec", "init_sec", "resumed"},
}
EVAL_SLEEP_SEC = 0.5
STEP_SLEEP_SEC = 0.1


def _tiny_timed_config():
    # 64 examples at batch 16: 4 steps per epoch; 6 steps, logs and evaluations every 2 steps.
    config = tiny_config(training__num_train_steps=6, training__timing_warmup_steps=1)
    config.eval.every_epochs = 0.5
    return config


def test_summary_json_schema_and_clocks_from_a_tiny_run(tmp_path, monkeypatch):
    delays = inject_delays(monkeypatch, step_sec=STEP_SLEEP_SEC, eval_sec=EVAL_SLEEP_SEC,
                           eval_top1=[0.5, 0.77, 0.8])
    config = _tiny_timed_config()
    start = time.perf_counter()
    result = trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    end = time.perf_counter()
    test_wall_sec = end - start  # Measured here, apart from the trainer's clocks.
    # The training loop's seconds as this test measured them, less the evaluations' (off the training clock).
    loop_train_sec = end - delays.loop_starts[0] - delays.total("eval")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))

    assert summary["schema_version"] == metrics.SUMMARY_SCHEMA_VERSION
    assert set(summary) == {"schema_version", "config", *SUMMARY_KEYS}
    for section, keys in SUMMARY_KEYS.items():
        assert set(summary[section]) == keys, section
    assert metrics.check_summary(summary) == []
    assert summary["config"]["model"]["name"] == "resnet_tiny"
    assert summary["config"]["eval"]["target_top1"] == 0.76

    run, thr, clk, acc, util = (summary[k] for k in ("run", "throughput", "time", "accuracy", "utilisation"))
    assert run["devices"] == 8 and run["process_count"] == 1 and run["final_step"] == 6
    assert run["timing_warmup_steps"] == 1 and not run["preempted"]
    # Steady state: steps 2-6 after the 1-step warm-up; intervals 3-4 and 5-6 (1-2 holds the warm-up).
    assert thr["steady_state_steps"] == 5
    # Images/sec against the images the steps were given (counted by the test) and the injected step time:
    # each of steps 2-6 slept STEP_SLEEP_SEC on the training clock, so the seconds their images imply at
    # that rate are at least 5 sleeps, and at most the training loop's time as this test measured it.
    assert delays.images == [16] * 6
    assert 5 * STEP_SLEEP_SEC <= sum(delays.images[1:]) / thr["images_per_sec"] <= loop_train_sec
    # The timed seconds hold the log intervals wholly after the warm-up (and part of steps 1-2), within
    # the run's time as this test measured it.
    interval_sec = {r["step"]: 2 * r["sec_per_step"] for r in result.train_history}
    assert sorted(interval_sec) == [2, 4, 6]
    assert (interval_sec[4] + interval_sec[6]) * (1 - 1e-9) <= thr["steady_state_sec"] <= test_wall_sec
    # Each log interval's figures, likewise: at least its steps' sleeps; together, within the loop's time.
    first_step, implied_sec = 1, 0.0
    for record in result.train_history:
        steps = record["step"] - first_step + 1
        assert record["sec_per_step"] >= STEP_SLEEP_SEC, record
        interval_images = sum(delays.images[first_step - 1:record["step"]])
        assert interval_images / record["images_per_sec"] >= steps * STEP_SLEEP_SEC, record
        implied_sec += interval_images / record["images_per_sec"]
        first_step = record["step"] + 1
    assert sum(2 * r["sec_per_step"] for r in result.train_history) <= loop_train_sec
    assert implied_sec <= loop_train_sec
    # Per device: the 80 steady-state images (5 steps of 16) on 8 devices, over at least the 5 sleeps and at
    # most the loop's time as this test measured it.
    assert 10 / loop_train_sec <= thr["images_per_sec_per_device"] <= 10 / (5 * STEP_SLEEP_SEC)
    assert thr["step_time_sec_p50"] <= thr["step_time_sec_p90"] <= thr["step_time_sec_p99"]
    assert 0.0 <= thr["input_wait_fraction"] < 1.0
    # Evaluation (3 x the sleep) is off the training clock, but on the loop's wall clock.
    assert clk["eval_sec"] >= delays.total("eval") >= 3 * EVAL_SLEEP_SEC
    assert clk["train_sec"] <= clk["wall_sec"] - clk["eval_sec"] + 0.05
    assert thr["steady_state_sec"] < clk["train_sec"]
    assert 0 < clk["compile_sec"] and clk["compile_sec"] + clk["wall_sec"] <= test_wall_sec
    # Time-to-accuracy: reached at the second evaluation (step 4, epoch 1).
    assert acc["reached"] and acc["steps_to_accuracy"] == 4 and acc["epochs_to_accuracy"] == 1.0
    assert acc["best_eval_top1"] == 0.8 and acc["final_eval_top1"] == 0.8 and acc["num_evals"] == 3
    # The case study's clock leaves both evaluations out; MLPerf's counts them.
    assert acc["time_to_accuracy_sec"] < clk["train_sec"]
    assert acc["mlperf_time_to_accuracy_sec"] >= acc["time_to_accuracy_sec"] + 2 * EVAL_SLEEP_SEC
    # FLOPs against resnet_tiny's convolutions and classifier counted from its architecture: 16 images a
    # step, 2 on each device, forward and backward; at least their multiply-adds, at most those with the
    # padding's taps (the CPU forms multiply its zeros), 15% more elementwise work and 10 FLOPs a parameter
    # for the update (tests/planning/test_compile.py measures both margins on a TPU's compile).
    (num_params, _, _), fewest = resnet_tiny_sizes(), resnet_tiny_train_flops_per_image()
    most = 1.15 * resnet_tiny_train_flops_per_image(count_padding=True)
    flops_per_device = util["flops_per_step_per_device"]
    assert 2 * fewest <= flops_per_device <= 2 * most + 10 * num_params, flops_per_device
    assert 16 * fewest <= util["flops_per_step"] <= 16 * most + 8 * 10 * num_params, util["flops_per_step"]
    # TFLOP/s per device: those FLOPs over a steady-state step's time, which the injected sleep bounds
    # below and the loop's time as this test measured it (5 steps and more) bounds above.
    assert (flops_per_device / (loop_train_sec / 5) / 1e12 <= util["tflops_per_sec_per_device"]
            <= flops_per_device / STEP_SLEEP_SEC / 1e12)
    assert util["peak_tflops_per_device"] is None and util["mfu"] is None  # CPU: no published peak.


def test_summary_totals_and_time_to_accuracy_survive_a_preemption_and_resume(tmp_path, monkeypatch):
    config = _tiny_timed_config()
    config.checkpoint.enabled, config.checkpoint.every_steps, config.checkpoint.async_save = True, 2, False
    # Evaluations at steps 2 (reaches 0.76), 4, 6.
    delays = inject_delays(monkeypatch, step_sec=STEP_SLEEP_SEC, eval_sec=EVAL_SLEEP_SEC,
                           eval_top1=[0.77, 0.5, 0.8])
    monkeypatch.setattr(preemption.PreemptionWatcher, "reached", lambda self, step: step == 3)
    first = trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays()).summary
    first_end = time.perf_counter()
    assert first["run"]["preempted"] and first["run"]["final_step"] == 3
    assert first["accuracy"]["steps_to_accuracy"] == 2
    monkeypatch.setattr(preemption.PreemptionWatcher, "reached", lambda self, step: False)

    trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    second_end = time.perf_counter()
    final = metrics.read_summary(str(tmp_path))
    assert metrics.check_summary(final) == []
    assert final["run"]["start_step"] == 3 and final["run"]["final_step"] == 6
    acc = final["accuracy"]
    assert acc["steps_to_accuracy"] == 2 and acc["num_evals"] == 3 and acc["final_eval_top1"] == 0.8
    # The time to accuracy was fixed in the first run and is carried over, not re-measured.
    for key in ("time_to_accuracy_sec", "mlperf_time_to_accuracy_sec"):
        assert acc[key] == first["accuracy"][key]
    for key in ("train_sec", "eval_sec", "wall_sec"):  # Totals over both runs.
        assert final["time"][key] > first["time"][key]
    assert final["time"]["eval_sec"] >= 3 * EVAL_SLEEP_SEC
    # The steady state spans both launches: steps 2-6 over their timed seconds together.
    thr = final["throughput"]
    assert thr["steady_state_steps"] == 5
    # At the steady rate, the images of steps 2-6 (2-3 in the first launch, 4-6 in the second) take at
    # least their injected step sleeps, and at most both training loops' time as this test measured it.
    assert delays.images == [16] * 6 and len(delays.loop_starts) == 2
    loops_train_sec = (first_end - delays.loop_starts[0] + second_end - delays.loop_starts[1]
                       - delays.total("eval"))
    assert 5 * STEP_SLEEP_SEC <= sum(delays.images[1:]) / thr["images_per_sec"] <= loops_train_sec
    assert first["throughput"]["steady_state_sec"] < thr["steady_state_sec"] < final["time"]["train_sec"]


def test_check_summary_names_what_is_wrong():
    good = metrics.build_summary(
        run={k: 1 for k in SUMMARY_KEYS["run"]} | {"device_kind": "cpu", "platform": "cpu",
                                                  "preempted": False},
        throughput={k: None for k in SUMMARY_KEYS["throughput"]} | {"steady_state_steps": 0,
                                                                  "steady_state_sec": 0.0},
        time={k: 0.0 for k in SUMMARY_KEYS["time"]},
        accuracy=metrics.TimeToAccuracy().result(),
        utilisation={k: None for k in SUMMARY_KEYS["utilisation"]},
        config={"seed": 0})
    assert metrics.check_summary(good) == []
    bad = json.loads(json.dumps(good))
    del bad["time"]["eval_sec"]
    bad["run"]["devices"] = True
    bad["accuracy"]["extra"] = 1
    assert sorted(metrics.check_summary(bad)) == [
        "accuracy.extra: unexpected", "run.devices: True is not (<class 'int'>,)", "time.eval_sec: missing"]


def test_only_process_zero_writes_the_summary_and_metric_files(tmp_path, monkeypatch):
    real_process_index = jax.process_index

    def process_index(*args, **kwargs):
        # Process 1 as the trainer sees it (where it decides who writes); the mesh and data still see
        # the one real process, so this single-process run stays valid.
        if sys._getframe(1).f_globals.get("__name__") == "resnet_scaling.training.trainer":
            return 1
        return real_process_index(*args, **kwargs)

    monkeypatch.setattr(jax, "process_index", process_index)
    result = trainer.train_and_evaluate(tiny_config(), str(tmp_path), arrays=random_arrays())
    assert int(result.state.step) == 4
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "metrics.jsonl").exists()
    assert metrics.check_summary(result.summary) == []  # Every process computes it; only 0 writes it.


# Config: the timed region's warm-up and the target.


@pytest.mark.parametrize("global_batch_size, warmup_steps", [(1024, 1251), (32768, 39)])
def test_timing_warmup_defaults_to_one_epoch_as_the_case_study_table(global_batch_size, warmup_steps):
    config = tiny_config(training__global_batch_size=global_batch_size, training__num_train_steps=None)
    config.training.num_epochs = 91
    plan = plan_lib.derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, 8)
    assert plan.timing_warmup_steps == warmup_steps
    config.training.timing_warmup_steps = 5
    assert plan_lib.derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, 8).timing_warmup_steps == 5


@pytest.mark.parametrize("section, name, value", [("eval", "target_top1", 76.0), ("eval", "target_top1", 0.0),
                                                  ("training", "timing_warmup_steps", -2)])
def test_validate_refuses_bad_timing_settings(section, name, value):
    config = tiny_config(**{f"{section}__{name}": value})
    with pytest.raises(config_lib.ConfigError, match=f"config.{section}.{name}"):
        config_lib.validate(config)
