"""The training plan (`resnet_scaling.config.plan`): durations in steps, examples or epochs through one
converter, batch sizes per process and per device, and the evaluation step count every source uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from resnet_scaling import data
from resnet_scaling.config import ConfigError, get_base_config, plan, validate
from resnet_scaling.config import fields as config_fields
from tests.helpers import data_source, random_arrays, tiny_config

IMAGENET = 1_281_167


@pytest.mark.parametrize("duration", config_fields.DURATIONS, ids=lambda d: f"{d.section}.{d.steps}")
def test_every_duration_converts_steps_examples_and_epochs_alike(duration):
    """The same length given three ways gives the same steps; steps win over examples over epochs."""
    config = get_base_config()  # Global batch 1024.
    section = config[duration.section]
    section[duration.steps] = None
    section[duration.examples] = None
    section[duration.epochs] = 2.0
    from_epochs = plan.duration_steps(config, duration, IMAGENET, 1024)
    section[duration.examples] = 2 * IMAGENET
    from_examples = plan.duration_steps(config, duration, IMAGENET, 1024)
    assert from_epochs == from_examples == (2503 if duration.rounding == "up" else 2502)  # 2502.28 steps
    section[duration.steps] = 7
    assert plan.duration_steps(config, duration, IMAGENET, 1024) == 7
    assert config_fields.set_duration_field(config, duration) == f"{duration.section}.{duration.steps}"


def test_epoch_length_converts_epochs_and_steps_both_ways():
    length = plan.EpochLength(IMAGENET, 32_768)
    assert length.exact_steps_per_epoch == IMAGENET / 32_768  # 39.1: what a schedule divides by
    assert length.steps_per_epoch == 40  # rounded up: steps that see every image once
    assert length.steps(91) == 91 * IMAGENET / 32_768
    assert length.epochs(3558) == 3558 * 32_768 / IMAGENET  # By images seen, not 3558 / 40.
    assert length.epochs(length.steps(2.5)) == pytest.approx(2.5)


def test_whole_epochs_and_steps_round_as_integer_arithmetic_does():
    """`math.ceil` and `math.floor` of a conversion of whole numbers need no tolerance: the quotient is
    correctly rounded, so it is exact where whole and stays on its side of every whole number otherwise."""
    rng = np.random.default_rng(0)
    for examples, batch, k in zip(rng.integers(1, 2_000_000, 3000), rng.integers(1, 70_000, 3000),
                                  rng.integers(0, 5000, 3000), strict=True):
        length = plan.EpochLength(int(examples), int(batch))
        assert math.ceil(length.steps(int(k))) == -(-int(k) * int(examples) // int(batch))
        assert math.floor(length.epochs(int(k))) == int(k) * int(batch) // int(examples)


def test_examples_set_the_run_length_and_warmup_in_the_plan():
    config = tiny_config(training__num_train_steps=None, training__num_examples=100,
                         schedule__warmup_steps=None, schedule__warmup_examples=40)
    validate(config, 8)
    p = plan.derive(config, 64, num_devices=8)
    assert p.total_steps == 7  # ceil(100 / 16)
    assert p.warmup_steps == 2  # round(40 / 16) = round(2.5), half to even
    assert p.steps_per_epoch == 4


@pytest.mark.parametrize("value, expected", [(0, 0), (-3, 0), (1, 1), (10, 1), (33, 2), (64, 4)])
def test_intervals_in_examples_are_at_least_one_step_and_zero_means_only_at_the_end(value, expected):
    config = tiny_config(eval__every_examples=value, checkpoint__every_examples=value)
    p = plan.derive(config, 64, num_devices=8)
    assert (p.eval_every_steps, p.checkpoint_every_steps) == (expected, expected)


def test_validate_refuses_a_missing_or_negative_duration():
    config = get_base_config()
    config.training.num_epochs = None
    with pytest.raises(ConfigError, match="config.training.num_epochs: set the training length"):
        validate(config)
    config = get_base_config()
    config.schedule.warmup_examples = -5
    with pytest.raises(ConfigError, match=r"config.schedule.warmup_examples: must be >= 0"):
        validate(config)


@pytest.mark.parametrize("num_processes", [1, 2, 3, 4])
@pytest.mark.parametrize("num_eval_examples", [1, 9, 50, 50_000])
def test_eval_steps_cover_every_process_share(num_processes, num_eval_examples):
    """Every process runs `eval_steps` batches, enough for its own share (shares by `process_share`)."""
    config = tiny_config(eval__global_batch_size=8 * num_processes)
    batch = plan.batch_plan(config, 2 * num_processes, num_local_devices=2, num_processes=num_processes)
    assert batch.eval_per_process_batch_size == 8
    steps = batch.eval_steps(num_eval_examples)
    shares = [data.process_share(num_eval_examples, p, num_processes) for p in range(num_processes)]
    largest = max(stop - start for start, stop in shares)
    assert steps == math.ceil(largest / 8)  # Enough for the largest share, and not one batch more.


def test_batch_plan_sizes_per_process_and_device():
    config = tiny_config(training__global_batch_size=64, eval__global_batch_size=32, model__bn_group_size=0)
    batch = plan.batch_plan(config, 16, num_local_devices=4, num_processes=4)
    assert (batch.per_device_batch_size, batch.per_process_batch_size) == (4, 16)
    assert (batch.eval_per_device_batch_size, batch.eval_per_process_batch_size) == (2, 8)
    assert batch.bn_group_size == 4  # Per device.
    training_plan = plan.derive(config, 640, batch=batch, num_eval_examples=100)
    assert training_plan.batch is batch and training_plan.bn_group_size == 4
    assert training_plan.eval_steps == batch.eval_steps(100) == 4  # ceil(25 / 8)
    with pytest.raises(ValueError, match="either num_devices or batch"):
        plan.derive(config, 640, 16, batch=batch)


def test_synthetic_eval_counts_every_example_once_whatever_the_step_count():
    config = tiny_config(data__source="synthetic", data__num_eval_examples=37, eval__global_batch_size=16)
    from resnet_scaling.job import mesh

    m = mesh.create_mesh(8)
    source = data_source(config, m)
    masks = [np.asarray(b["mask"]) for b in source.eval_batches()]
    assert len(masks) == plan.batch_plan_for_mesh(config, m).eval_steps(37) == 3
    assert sum(int(mask.sum()) for mask in masks) == 37


def test_an_evaluation_set_smaller_than_the_eval_batch_is_one_batch_of_its_own_size():
    """128 images with the default evaluation batch (1,024) on 8 devices: one batch of 128, no padding; 37
    images: one batch of 40 (5 a device), 3 of them padding. Counted from the batches the source yields."""
    from resnet_scaling.job import mesh

    assert get_base_config().eval.global_batch_size == 1024
    m = mesh.create_mesh(8)
    for num_eval, expected_batch in ((128, 128), (37, 40)):
        config = tiny_config(eval__global_batch_size=1024)
        arrays = random_arrays(num_train=16, num_eval=num_eval)
        masks = [np.asarray(b["mask"]) for b in data_source(config, m, arrays).eval_batches()]
        assert [len(mask) for mask in masks] == [expected_batch]
        assert int(masks[0].sum()) == num_eval  # Every image once, the padding masked out.
        training_plan = plan.derive(config, 16, batch=plan.batch_plan_for_mesh(config, m),
                                    num_eval_examples=num_eval)
        assert (training_plan.batch.eval_global_batch_size, training_plan.eval_steps) == (expected_batch, 1)
    # A set at least as large as the batch keeps the configured batch.
    batch = plan.batch_plan(tiny_config(eval__global_batch_size=64), 8)
    assert batch.for_eval_set(64) is batch and batch.for_eval_set(10_000) is batch


@pytest.mark.parametrize("num_processes,num_local_devices", [(1, 1), (1, 8), (2, 4), (3, 2), (4, 4)])
@pytest.mark.parametrize("num_eval_examples", [1, 9, 37, 128, 50_000])
def test_the_fitted_eval_batch_is_the_smallest_that_takes_every_share_in_as_few_steps(
        num_processes, num_local_devices, num_eval_examples):
    """Searched for, not computed: the smallest multiple of the device count whose per-process part holds
    the largest process share (`data.process_share`), unless the configured batch is smaller."""
    num_devices = num_processes * num_local_devices
    configured = 64 * num_devices
    batch = plan.batch_plan(tiny_config(eval__global_batch_size=configured), num_devices,
                            num_local_devices=num_local_devices, num_processes=num_processes)
    fitted = batch.for_eval_set(num_eval_examples)
    largest = max(stop - start for start, stop in
                  (data.process_share(num_eval_examples, p, num_processes) for p in range(num_processes)))
    smallest = next(size for size in range(num_devices, 10**7, num_devices)
                    if size // num_processes >= largest)
    assert fitted.eval_global_batch_size == min(configured, smallest)
    assert fitted.eval_steps(num_eval_examples) == math.ceil(largest / fitted.eval_per_process_batch_size)
    assert fitted.eval_steps(num_eval_examples) == batch.eval_steps(num_eval_examples)  # Never more steps.
    assert (fitted.global_batch_size, fitted.num_devices) == (batch.global_batch_size, batch.num_devices)


def test_the_loop_schedule_logs_after_log_every_sec_in_single_process_runs_only():
    schedule = plan.LoopSchedule(total_steps=10, log_every_steps=100, log_every_sec=30.0)
    assert not schedule.is_log_step(3, sec_since_log=29.9) and schedule.is_log_step(3, sec_since_log=30.0)
    assert schedule.is_log_step(10)  # The last step, as ever.
    off = plan.LoopSchedule(total_steps=10, log_every_steps=100)
    assert not off.is_log_step(3, sec_since_log=1e9)
    config = tiny_config(training__log_every_sec=30.0)
    assert get_base_config().training.log_every_sec == 30.0  # The default.
    for num_processes, expected in ((1, 30.0), (2, 0.0)):
        batch = plan.batch_plan(config, 8, num_local_devices=8 // num_processes, num_processes=num_processes)
        training_plan = plan.derive(config, 64, batch=batch, num_eval_examples=20)
        assert plan.loop_schedule(config, training_plan).log_every_sec == expected
    config.training.log_every_sec = -1.0
    with pytest.raises(ConfigError, match="config.training.log_every_sec: must be >= 0"):
        validate(config)


def test_the_loop_schedule_logs_evaluates_and_saves_every_n_steps_and_at_the_end():
    schedule = plan.LoopSchedule(total_steps=10, log_every_steps=3, eval_every_steps=4,
                                 checkpoint_every_steps=5, checkpoints=True)
    steps = range(1, 11)
    assert [s for s in steps if schedule.is_log_step(s)] == [3, 6, 9, 10]
    assert [s for s in steps if schedule.is_eval_step(s)] == [4, 8, 10]
    assert [s for s in steps if schedule.is_save_step(s)] == [5, 10]
    # A preemption or an MLPerf stop saves at once; keep_best saves every evaluated state.
    assert schedule.is_save_step(2, preempted=True) and schedule.is_save_step(2, stopped=True)
    keep_best = plan.LoopSchedule(10, 3, eval_every_steps=4, checkpoint_every_steps=5, checkpoints=True,
                                  save_evaluated=True)
    assert [s for s in steps if keep_best.is_save_step(s)] == [4, 5, 8, 10]
    # Checkpoints off: nothing is ever saved.
    off = plan.LoopSchedule(10, 3, checkpoint_every_steps=5)
    assert not any(off.is_save_step(s, preempted=True, stopped=True) for s in steps)
    assert schedule.last_step(start_step=4, target_reached_at=3) == 10  # Not MLPerf mode: no stop.


def test_mlperf_mode_evaluates_by_epochs_logs_at_each_evaluation_and_trains_nothing_after_its_target():
    config = tiny_config(mlperf__enabled=True, mlperf__eval_every_epochs=1, training__log_every_steps=5,
                         training__num_train_steps=None, training__num_epochs=3.0)
    validate(config, 8)
    p = plan.derive(config, 100, num_devices=8)  # 16 images a step: epochs end in steps 7, 13 and 19.
    schedule = plan.loop_schedule(config, p)
    assert p.total_steps == 19 and schedule.eval_after_steps == (7, 13, 19)
    assert [s for s in range(1, 20) if schedule.is_eval_step(s)] == [7, 13, 19]
    assert [s for s in range(1, 20) if schedule.is_log_step(s)] == [5, 7, 10, 13, 15, 19]
    assert [schedule.next_eval_after(s) for s in (0, 7, 12, 13)] == [7, 13, 13, 19]
    assert schedule.stop_at_target
    assert schedule.last_step(start_step=7) == 19
    assert schedule.last_step(start_step=7, target_reached_at=7) == 7  # Reached before: nothing to train.
