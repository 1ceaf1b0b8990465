"""Tests for the base config, `derive` (the training plan) and `validate` (`resnet_scaling.config`)."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from resnet_scaling import config as config_lib
from resnet_scaling import models
from resnet_scaling.config import ConfigError, get_base_config, recipes, validate
from resnet_scaling.config import fields as config_fields
from resnet_scaling.config.plan import derive

CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"
CONFIG_FILES = sorted(p for p in CONFIGS_DIR.glob("*.py") if p.stem != "__init__")


def _load_config_module(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"_config_under_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- config files


def test_config_files_found():
    # Guards the parametrisation below against silently covering nothing.
    assert {"default.py", "demo.py"} <= {p.name for p in CONFIG_FILES}


CONFIGS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configs.md"
_TABLE_OPTIMIZER = re.compile(r"(SGD|LARS), (\w+) \(([\d.]+), ([\d.]+) ep\)(?:, smoothing ([\d.]+))?")


def _documented_configs() -> dict[str, dict]:
    """docs/configs.md's table of configs, one row per `configs/` file: what a user reads before running
    one."""
    rows = {}
    for line in CONFIGS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not re.fullmatch(r"`\w+\.py`", cells[0]):
            continue
        _, _, devices, batch, optimizer, compute, bn_span, steps = cells
        name, schedule, peak, warmup, smoothing = _TABLE_OPTIMIZER.fullmatch(optimizer).groups()
        rows[cells[0].strip("`")] = {
            "devices": -1 if devices == "all" else int(devices), "global_batch_size": int(batch),
            "optimizer": name.lower(), "schedule": schedule, "peak_learning_rate": peak,
            "warmup_epochs": float(warmup), "label_smoothing": float(smoothing or 0),
            "compute_dtype": compute.split()[0], "bn_span": bn_span, "steps": int(steps.replace(",", ""))}
    return rows


def test_the_configs_page_lists_every_config_file():
    assert set(_documented_configs()) == {p.name for p in CONFIG_FILES}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_config_file_validates_and_is_what_the_configs_page_says(path):
    config = _load_config_module(path).get_config()
    validate(config)
    # The system's own device count when the config pins one, else a power of two any config runs on.
    num_devices = config.mesh.num_devices if config.mesh.num_devices > 0 else 4
    validate(config, num_devices=num_devices)
    plan = derive(config, config.data.num_train_examples, num_devices=num_devices)
    row = _documented_configs()[path.name]
    assert plan.total_steps == row["steps"]
    assert (config.mesh.num_devices, plan.global_batch_size) == (row["devices"], row["global_batch_size"])
    assert (config.optimizer.name, config.schedule.name) == (row["optimizer"], row["schedule"])
    # The table rounds the peak learning rate (0.975 shows as 0.98): within half its last digit.
    decimals = len(row["peak_learning_rate"].partition(".")[2])
    assert plan.peak_learning_rate == pytest.approx(float(row["peak_learning_rate"]),
                                                    abs=0.5 * 10**-decimals + 1e-12)
    assert config.schedule.warmup_epochs == row["warmup_epochs"]
    assert config.training.label_smoothing == row["label_smoothing"]
    assert config.model.compute_dtype == row["compute_dtype"]
    # "global": the whole batch (-1); "per GPU", "per core", "per chip": each device's images (0);
    # "N images": groups of N.
    span = row["bn_span"]
    expected_group = -1 if span == "global" else 0 if span.startswith("per ") else int(span.split()[0])
    assert config.model.bn_group_size == expected_group


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("num_visible", [1, 3, 8])
def test_a_config_for_more_devices_than_visible_is_refused_with_overrides_that_validate(path, num_visible):
    """The refusal's advice leads somewhere: applying the overrides it names leaves nothing refused on the
    devices there are (3: a count that divides no shipped batch)."""
    config = _load_config_module(path).get_config()
    if config.mesh.num_devices <= num_visible:
        return  # Such a config runs here as it is.
    overrides = config_lib.overrides_for_devices(config, num_visible)
    message = str(config_lib.too_few_devices_error(config, num_visible, "cpu"))
    assert message.startswith("config.mesh.num_devices: ") and "\n" not in message
    assert " ".join(f"--config.{k}={v}" for k, v in overrides.items()) in message
    assert ("python -m resnet_scaling.compile" in message) == bool(config.system.topology)
    for field, value in overrides.items():
        section, name = field.split(".")
        config[section][name] = value
    validate(config, num_devices=num_visible)


def test_the_config_flags_value_for_a_shipped_config_is_its_name_and_for_another_its_path(tmp_path):
    """What a refusal's advice puts after `--config=`: what `find_config_file` resolved, turned back."""
    for name in ("pod", "demo"):
        assert config_lib.config_flag_value(config_lib.find_config_file(name)) == name
    mine = tmp_path / "pod.py"
    mine.write_text("")
    assert config_lib.config_flag_value(str(mine)) == str(mine)


def test_base_config_validates_on_a_pod_slice():
    validate(get_base_config(), num_devices=512)


# --------------------------------------------------------------------------- derive


def test_derive_imagenet_goyal_recipe():
    plan = derive(get_base_config(), config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.global_batch_size == 1024
    assert plan.per_device_batch_size == 128
    assert plan.steps_per_epoch == 1252  # ceil(1_281_167 / 1024) = ceil(1251.14)
    assert plan.total_steps == 112_603  # ceil(90 * 1_281_167 / 1024) = ceil(112_602.6)
    assert plan.warmup_steps == 6255  # 5 * 1_281_167 // 1024, as tensorflow/tpu's lars_util counts w_steps
    assert plan.warmup_exact_steps == pytest.approx(6255.70, abs=0.01)  # where the ramp ends
    assert plan.peak_learning_rate == pytest.approx(0.4)  # 0.1 * 1024 / 256
    assert plan.eval_every_steps == 1251  # every epoch: round(1251.14)
    assert plan.num_devices == 8
    assert plan.epoch_length.steps(30) == pytest.approx(37_534.2, abs=0.05)  # 30 * 1_281_167 / 1024


@pytest.mark.parametrize(
    "global_batch_size, train_steps, warmup_steps",
    [(1024, 113_854, 1_251), (4096, 28_464, 313), (16_384, 7_116, 78), (32_768, 3_558, 39)],
)
def test_derive_reproduces_the_case_study_step_counts(global_batch_size, train_steps, warmup_steps):
    """91 epochs (90 measured + 1 warm-up) and the 1-epoch (timing) warm-up, as published per TPU slice."""
    config = get_base_config()
    config.training.global_batch_size = global_batch_size
    config.training.num_epochs = 91
    config.training.timing_warmup_epochs = 1
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert (plan.total_steps, plan.timing_warmup_steps) == (train_steps, warmup_steps)


def test_derive_demo_config():
    config = _load_config_module(CONFIGS_DIR / "demo.py").get_config()
    plan = derive(config, 12_000, num_devices=2)
    assert plan.steps_per_epoch == 94  # ceil(12_000 / 128) = ceil(93.75)
    assert plan.total_steps == 563  # ceil(6 * 93.75) = ceil(562.5)
    assert plan.warmup_steps == 46  # floor(0.5 * 93.75): the decay counts from here
    assert plan.warmup_exact_steps == 46.875  # the ramp ends here
    assert plan.eval_every_steps == 188  # round(2 * 93.75) = round(187.5), half to even
    assert plan.per_device_batch_size == 64
    assert plan.peak_learning_rate == pytest.approx(0.05)  # 0.1 * 128 / 256


def test_derive_fractional_epochs_round_the_run_up_and_never_to_zero():
    config = get_base_config()
    config.training.num_epochs = 0.3
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.total_steps == 376  # ceil(0.3 * 1251.14) = ceil(375.3)
    config.training.num_epochs = 0.1
    plan = derive(config, 1000, num_devices=1)  # under one step per epoch at batch 1024
    assert plan.steps_per_epoch == 1
    assert plan.total_steps == 1  # ceil(0.098): a run has at least one step


def test_derive_num_train_steps_overrides_epochs():
    config = get_base_config()
    config.training.num_train_steps = 500
    config.training.num_epochs = 90.0
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.total_steps == 500
    assert plan.steps_per_epoch == 1252  # still defines epochs (for eval and piecewise boundaries)
    # Warm-up of 5 epochs (6256 steps) is clipped to the run's length.
    assert plan.warmup_steps == 500


def test_derive_warmup_steps_override_warmup_epochs():
    config = get_base_config()
    config.schedule.warmup_epochs = 5.0
    config.schedule.warmup_steps = 123
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.warmup_steps == 123

    config.schedule.warmup_steps = 0  # 0 is an explicit "no warm-up", not "derive from epochs"
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.warmup_steps == 0


def test_derive_lr_scaling_none_keeps_base_learning_rate():
    config = get_base_config()
    config.optimizer.base_learning_rate = 2.9
    config.optimizer.lr_scaling = "none"
    config.training.global_batch_size = 32_768
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=256)
    assert plan.peak_learning_rate == pytest.approx(2.9)

    config.optimizer.lr_scaling = "linear"
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=256)
    assert plan.peak_learning_rate == pytest.approx(2.9 * 32_768 / 256)


@pytest.mark.parametrize(
    ("every_epochs", "expected"),
    [(1.0, 1251), (2.0, 2502), (0.5, 626), (0.0, 0), (-1.0, 0), (1e-9, 1)],  # round(e * 1251.14)
)
def test_derive_eval_every_steps(every_epochs, expected):
    config = get_base_config()
    config.eval.every_epochs = every_epochs
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    assert plan.eval_every_steps == expected


@pytest.mark.parametrize(("num_devices", "expected"), [(1, 1024), (8, 128), (512, 2)])
def test_derive_per_device_batch_size(num_devices, expected):
    plan = derive(get_base_config(), config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=num_devices)
    assert plan.per_device_batch_size == expected
    assert plan.global_batch_size == 1024


def test_derive_refuses_empty_training_split():
    with pytest.raises(ConfigError, match="empty"):
        derive(get_base_config(), 0, num_devices=1)


# --------------------------------------------------------------------------- validate


@pytest.mark.parametrize(
    ("batch", "num_devices", "suggestions"),
    [(1000, 512, ("512", "1024")), (100, 8, ("96", "104")), (4, 8, ("8", "16"))],
)
def test_validate_refuses_indivisible_train_batch(batch, num_devices, suggestions):
    config = get_base_config()
    config.training.global_batch_size = batch
    config.eval.global_batch_size = num_devices  # divisible, so the training batch is what fails
    with pytest.raises(ConfigError, match="training.global_batch_size") as info:
        validate(config, num_devices=num_devices)
    message = str(info.value)
    assert f"multiple of {num_devices}" in message
    for suggestion in suggestions:
        assert suggestion in message
    # Without a device count the same config is fine.
    validate(config)


def test_validate_refuses_bn_groups_that_do_not_divide_the_batch_or_split_a_device():
    # The pod's groups of 128 images (configs/pod.py) against a batch of 12; then groups of 96 in a batch
    # of 1,536 (which 96 divides): 192 a device on 8 devices, which a group would split; 96 on 16, one each.
    config = config_lib.load_config("pod")
    config.training.global_batch_size = 12
    with pytest.raises(ConfigError, match=r"config.model.bn_group_size: 128 images per group do not divide "
                                          r"the global batch of 12; use a divisor of it, or -1"):
        validate(config, num_devices=1)
    config.training.global_batch_size, config.model.bn_group_size = 1536, 96
    with pytest.raises(ConfigError, match=r"config.model.bn_group_size: 96 images per group would split a "
                                          r"device's 192 images; use a multiple of the per-device batch "
                                          r"\(192, 384, ...\), or 0"):
        validate(config, num_devices=8)
    validate(config, num_devices=16)  # 96 a device: one group each.


def test_validate_refuses_indivisible_eval_batch():
    config = get_base_config()
    config.eval.global_batch_size = 1000
    with pytest.raises(ConfigError, match="eval.global_batch_size") as info:
        validate(config, num_devices=16)
    assert "multiple of 16" in str(info.value)
    assert "992" in str(info.value) and "1008" in str(info.value)


@pytest.mark.parametrize(
    ("section", "name", "value", "choices"),
    [
        ("model", "name", "resnet51", config_fields.MODEL_NAMES),
        ("optimizer", "name", "adam", config_fields.OPTIMIZERS),
        ("model", "compute_dtype", "float8", config_fields.COMPUTE_DTYPES),
        ("schedule", "name", "linear", config_fields.SCHEDULES),
        ("data", "source", "imagenet2012", config_fields.DATA_SOURCES),
        ("optimizer", "lr_scaling", "sqrt", config_fields.LR_SCALINGS),
        ("data", "resize_method", "nearest", config_fields.RESIZE_METHODS),
    ],
)
def test_validate_refuses_unknown_choice(section, name, value, choices):
    config = get_base_config()
    config[section][name] = value
    with pytest.raises(ConfigError, match=f"{section}.{name}") as info:
        validate(config)
    message = str(info.value)
    assert repr(value) in message
    for choice in choices:
        assert choice in message


def test_the_choices_are_what_their_readers_build():
    """config_fields lists what the readers implement: the model table's names and dtypes in its order, and
    the submission keys MLPerf's own constants spell."""
    from mlperf_logging.mllog import constants as mlc

    assert config_fields.MODEL_NAMES == tuple(models.ARCHITECTURES)
    assert config_fields.COMPUTE_DTYPES == tuple(models.DTYPES)
    lowered_on_tpu = [models.resolve_lowering(lowering, "tpu") for lowering in config_fields.LOWERINGS]
    assert lowered_on_tpu == ["xla", "cpu", "xla"]
    assert config_fields.SUBMISSION_DIVISIONS == (mlc.CLOSED, mlc.OPEN)
    assert config_fields.SUBMISSION_STATUSES == (mlc.CLOUD, mlc.ONPREM, "preview", mlc.RESEARCH)


@pytest.mark.parametrize(
    ("section", "name", "value"),
    [
        ("training", "global_batch_size", 0),
        ("training", "global_batch_size", -8),
        ("eval", "global_batch_size", 0),
        ("data", "image_size", -1),
        ("model", "num_classes", 0),
        ("model", "num_filters", 0),
        ("data", "num_train_examples", 0),
        ("optimizer", "base_learning_rate", 0.0),
        ("optimizer", "lr_reference_batch_size", -256),
    ],
)
def test_validate_refuses_non_positive_sizes(section, name, value):
    config = get_base_config()
    config[section][name] = value
    with pytest.raises(ConfigError, match=f"{section}.{name}: must be positive, got {value}"):
        validate(config, num_devices=8)


def test_validate_refuses_an_infinite_learning_rate_as_the_command_line_reads_it():
    config = get_base_config()
    config.optimizer.base_learning_rate = float("inf")  # As `--config.optimizer.base_learning_rate=inf` sets.
    with pytest.raises(ConfigError) as refused:
        validate(config, num_devices=8)
    assert str(refused.value) == "config.optimizer.base_learning_rate: must be finite, got inf."


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 1.5])
def test_validate_refuses_label_smoothing_out_of_range(smoothing):
    config = get_base_config()
    config.training.label_smoothing = smoothing
    with pytest.raises(ConfigError, match=r"training.label_smoothing: must lie in \[0, 1\)"):
        validate(config)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.99])
def test_validate_accepts_label_smoothing_in_range(smoothing):
    config = get_base_config()
    config.training.label_smoothing = smoothing
    validate(config)


@pytest.mark.parametrize("boundaries", [(60.0, 30.0, 80.0), (30.0, 60.0, 50.0), (0.0, 30.0), (-1.0,)])
def test_validate_refuses_bad_piecewise_boundaries(boundaries):
    config = get_base_config()
    config.schedule.boundary_epochs = boundaries
    with pytest.raises(ConfigError, match="schedule.boundary_epochs: must be positive and increasing"):
        validate(config)


@pytest.mark.parametrize("size", [31, 16, 1])
def test_validate_refuses_image_size_below_32(size):
    config = get_base_config()
    config.data.image_size = size
    with pytest.raises(ConfigError, match="data.image_size") as info:
        validate(config)
    assert "at least 32" in str(info.value)
    config.data.image_size = 32
    validate(config)


@pytest.mark.parametrize(
    ("section", "name", "value", "field"),
    [
        ("model", "bn_momentum", 1.0, "model.bn_momentum"),
        ("optimizer", "momentum", -0.1, "optimizer.momentum"),
        ("optimizer", "weight_decay", -1e-4, "optimizer.weight_decay"),
        ("schedule", "end_learning_rate", -1.0, "schedule.end_learning_rate"),
        ("schedule", "polynomial_power", 0.0, "schedule.polynomial_power"),
        ("data", "stddev_rgb", (0.2, 0.0, 0.2), "data.stddev_rgb"),
        ("data", "mean_rgb", (0.5, 0.5), "data.mean_rgb"),
        ("mesh", "num_devices", 0, "mesh.num_devices"),
        ("data", "crop_area_range", (0.0, 1.0), "data.crop_area_range"),
        ("data", "crop_area_range", (0.5, 0.2), "data.crop_area_range"),
        ("data", "crop_area_range", (0.08, 1.5), "data.crop_area_range"),
        ("data", "crop_area_range", (0.08,), "data.crop_area_range"),
        ("data", "crop_aspect_range", (0.0, 1.0), "data.crop_aspect_range"),
        ("data", "eval_resize_size", 200, "data.eval_resize_size"),
        ("data", "shuffle_buffer_size", 0, "data.shuffle_buffer_size"),
        ("data", "num_threads", -1, "data.num_threads"),
        ("data", "dataset", "", "data.dataset"),
    ],
)
def test_validate_refuses_other_out_of_range_values(section, name, value, field):
    config = get_base_config()
    config[section][name] = value
    with pytest.raises(ConfigError, match=field):
        validate(config)


def test_validate_asks_for_the_folder_of_a_class_folder_dataset():
    config = get_base_config()
    config.data.source = "folders"
    with pytest.raises(ConfigError, match="data.folder: give the dataset's root"):
        validate(config)
    config.data.folder = "/data/my_images"
    validate(config)


def test_validate_refuses_zero_length_training():
    config = get_base_config()
    config.training.num_epochs = 0.0
    config.training.num_train_steps = None  # unset: the length comes from num_epochs
    with pytest.raises(ConfigError, match="training.num_epochs"):
        validate(config)
    config.training.num_train_steps = 10  # a step count alone is enough
    validate(config)


@pytest.mark.parametrize("field, value", [("training.num_train_steps", -5),
                                          ("optimizer.base_learning_rate", float("inf")),
                                          ("optimizer.base_learning_rate", float("nan"))])
def test_validate_refuses_a_negative_length_and_a_non_finite_learning_rate(field, value):
    config = get_base_config()
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=f"config.{field}"):
        validate(config)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------- the case study's systems

# docs/case_study.md's table: config -> (cores, global batch, train steps, 1-epoch warm-up steps, optimizer),
# with the recipe's (peak learning rate, warm-up epochs): tensorflow/tpu r1.12's resnet_main.py below 16k
# images per step (0.1 x batch / 256 over 5 epochs, Nesterov momentum); from 16k, the LARS table of r1.12's
# models/official/resnet/lars_util.py (poly_rate_schedule, branch r1.12, commit 3e61779b1bea):
# batch <= 16384: 25.0 over 5 epochs, == 32768: 34.0 over 12, otherwise 41.0 over 16.
CASE_STUDY_TPU_CONFIGS = {
    "tpu_v2_8": (8, 1024, 113_854, 1_251, "sgd", (0.4, 5.0)),
    "tpu_v2_32": (32, 4096, 28_464, 313, "sgd", (1.6, 5.0)),
    "tpu_v2_128": (128, 16_384, 7_116, 78, "lars", (25.0, 5.0)),
    "tpu_v2_256": (256, 32_768, 3_558, 39, "lars", (34.0, 12.0)),
    "pod": (512, 32_768, 3_558, 39, "lars", (34.0, 12.0)),
}


@pytest.mark.parametrize("name", sorted(CASE_STUDY_TPU_CONFIGS))
def test_case_study_tpu_configs_match_the_published_table(name):
    cores, batch, train_steps, warmup_epoch_steps, optimizer, (peak, warmup_epochs) = (
        CASE_STUDY_TPU_CONFIGS[name])
    config = _load_config_module(CONFIGS_DIR / f"{name}.py").get_config()
    validate(config, num_devices=cores)
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=cores)
    assert config.mesh.num_devices == cores
    assert (plan.global_batch_size, plan.total_steps) == (batch, train_steps)
    assert plan.timing_warmup_steps == warmup_epoch_steps  # the methodology's warm-up epoch, untimed
    assert config.model.compute_dtype == "bfloat16"
    assert config.system.device_kind == "TPU v2" and config.system.topology.startswith("v2:")
    assert config.optimizer.name == optimizer
    assert plan.peak_learning_rate == pytest.approx(peak, rel=1e-12)
    assert config.schedule.warmup_epochs == warmup_epochs
    if optimizer == "lars":  # r1.12: polynomial decay to 1e-4, label smoothing 0.1, TF 1.12's LARSOptimizer
        assert config.schedule.name == "polynomial" and config.schedule.end_learning_rate == 1e-4
        assert config.training.label_smoothing == 0.1
        assert (config.optimizer.lars_variant, config.optimizer.nesterov) == ("tf1.12", False)
    else:  # r1.12's momentum path: Nesterov, x0.1 at epochs 30, 60 and 80
        assert config.schedule.name == "piecewise" and tuple(config.schedule.boundary_epochs) == (30, 60, 80)
        assert config.training.label_smoothing == 0.0
        assert config.optimizer.nesterov
    # r1.12 resnet_main.py: weight_decay * l2_loss of every variable not named batch_normalization.
    assert (config.optimizer.weight_decay, config.optimizer.weight_decay_on) == (1e-4, "non_batchnorm")
    # Batch norm over 128 images, as the reference normalised per core (2 cores of a chip on the pod).
    assert plan.bn_group_size == 128


@pytest.mark.parametrize(  # r1.12's lars_util table, transcribed above CASE_STUDY_TPU_CONFIGS.
    "batch, expected",
    [(1024, (25.0, 5.0)), (16_384, (25.0, 5.0)), (16_385, (41.0, 16.0)), (32_767, (41.0, 16.0)),
     (32_768, (34.0, 12.0)), (32_769, (41.0, 16.0)), (65_536, (41.0, 16.0))],
)
def test_case_study_lars_table_is_r1_12_lars_util(batch, expected):
    assert recipes.lars_learning_rate_r1_12(batch) == expected


@pytest.mark.parametrize(  # tensorflow/tpu master lars_util.py, commit 95647b5 (table since 2019).
    "batch, expected",
    [(1024, (10.0, 5.0)), (16_383, (10.0, 5.0)), (16_384, (25.0, 5.0)), (32_767, (25.0, 5.0)),
     (32_768, (32.0, 14.0)), (65_535, (32.0, 14.0)), (65_536, (35.6, 40.0))],
)
def test_later_lars_table_follows_tensorflow_tpu_master(batch, expected):
    assert recipes.lars_learning_rate(batch) == expected


# mlcommons/training_results_v0.7 Google/benchmarks/resnet/implementations/resnet-research-JAX-tpu-v3-8192/
# train.py (commit c66406115bb3): polynomial_learning_rate_fn and main's momentum, weight decay, epochs.
@pytest.mark.parametrize(
    "batch, expected",
    [(8192, (10.0, 5.0, 0.9, 2e-4, 56.0)), (16_384, (25.0, 5.0, 0.9, 2e-4, 56.0)),
     (32_768, (29.0, 18.0, 0.929, 1e-4, 64.0)),
     (65_536, (23.080977304670448, 33.0, 0.9537213777059405, 1e-4, 92.0))],
)
def test_mlperf_v07_jax_recipe_transcribes_its_train_py(batch, expected):
    config = get_base_config()
    config.training.global_batch_size = batch
    recipes.use_mlperf_v07_jax_lars(config)
    o = config.optimizer
    assert (o.base_learning_rate, config.schedule.warmup_epochs, o.momentum, o.weight_decay,
            config.training.num_epochs) == expected
    assert (o.name, o.lars_variant, o.weight_decay_on, o.nesterov) == ("lars", "reference", "kernels", False)
    assert (config.schedule.end_learning_rate, config.training.label_smoothing) == (1e-4, 0.1)
    validate(config)


@pytest.mark.parametrize("path", [p for p in CONFIG_FILES if p.stem.startswith(("gpu_", "tpu_", "pod"))],
                         ids=lambda p: p.stem)
def test_system_configs_name_their_hardware_and_precision(path):
    config = _load_config_module(path).get_config()
    assert config.system.name and config.system.device_kind
    uses_v100 = "V100" in config.system.device_kind
    # float16 with loss scaling where there is no bfloat16 (V100), bfloat16 everywhere else.
    assert config.model.compute_dtype == ("float16" if uses_v100 else "bfloat16")
    assert config.training.num_epochs == 91.0
    assert (config.optimizer.name == "lars") == (config.training.global_batch_size >= 16_384)


@pytest.mark.parametrize("num_devices", [1, 2, 4, 8])
def test_the_demo_validates_on_the_device_counts_the_docs_promise(num_devices):
    # docs/configs.md's table: the demo runs on "all" devices;
    # XLA_FLAGS=--xla_force_host_platform_device_count=8 is how a CPU user gets 8.
    validate(_load_config_module(CONFIGS_DIR / "demo.py").get_config(), num_devices=num_devices)


@pytest.mark.parametrize("source", ["base", "pod.py", "demo.py"])
def test_a_misspelled_field_set_from_python_is_refused_naming_the_right_one(source):
    config = get_base_config() if source == "base" else _load_config_module(CONFIGS_DIR / source).get_config()
    with pytest.raises(AttributeError, match='Did you mean "global_batch_size"'):
        config.training.global_batchsize = 64
    config.training.global_batch_size = 64  # The real field still takes a value.
    with config.unlocked():  # On purpose, a new field can still be added.
        config.training.my_own_field = 1
    assert config.training.my_own_field == 1


def test_a_saved_config_with_fields_gone_since_still_loads():
    saved = get_base_config().to_dict()
    saved["training"]["a_field_removed_since"] = 3
    config = config_lib.config_from_saved(saved)
    assert config.training.a_field_removed_since == 3 and config.training.global_batch_size == 1024


def test_validation_reports_every_problem_at_once():
    config = get_base_config()
    config.training.global_batch_size = 1004
    config.eval.global_batch_size = 500
    config.optimizer.momentum = 1.5
    with pytest.raises(ConfigError) as refused:
        validate(config, num_devices=8)
    message = str(refused.value)
    assert message.startswith("3 problems: (1) config.") and "\n" not in message
    # Each problem whole, numbered, with its own full stop: no ".;" where two messages meet.
    assert ".;" not in message and " (2) config." in message and " (3) config." in message, message
    for field in ("config.training.global_batch_size: 1004 is not divisible by the 8 devices",
                  "config.eval.global_batch_size: 500 is not divisible", "config.optimizer.momentum"):
        assert field in message, message
    # A bad value is reported once, not again by the checks that build on it.
    config = get_base_config()
    config.training.global_batch_size = -8
    with pytest.raises(ConfigError) as refused:
        validate(config, num_devices=8)
    assert str(refused.value) == "config.training.global_batch_size: must be positive, got -8."


def test_epochs_are_counted_by_images_seen():
    config = get_base_config()
    config.training.global_batch_size = 32_768
    config.training.num_epochs = 91
    plan = derive(config, config_lib.IMAGENET_NUM_TRAIN_EXAMPLES, num_devices=8)
    # 3,558 steps of 32,768 images over 1,281,167: 91.002 epochs; 3,558 / 40 (steps per epoch rounded up)
    # would say 88.95.
    assert plan.epoch_length.epochs(3558) == pytest.approx(3558 * 32768 / 1_281_167) == pytest.approx(
        91.0, abs=0.01)
    assert plan.epoch_length.epochs(0) == 0.0
    assert plan.epoch_length.exact_steps_per_epoch == 1_281_167 / 32_768  # 39.1, unrounded
    assert plan.steps_per_epoch == 40  # rounded up


def test_one_parser_reads_a_command_lines_config_flag_and_overrides():
    argv = ["train", "--config", "demo", "--config.training.num_epochs=2", "--config.data.folder=a=b",
            "--config.eval.every_epochs", "1", "--override=data.data_dir=/mnt/tfds", "--config=pod:8"]
    assert config_lib.flag_values(argv, "config") == [(2, "", "demo"), (8, "--config=", "pod:8")]
    # The value is what follows the first "="; a field without one takes the next argument.
    assert config_lib.command_line_overrides(argv) == {
        "training.num_epochs": "2", "data.folder": "a=b", "eval.every_epochs": None}
    assert config_lib.parse_override("data.data_dir=/mnt/tfds") == ("data.data_dir", "/mnt/tfds")
    assert config_lib.parse_override("data.data_dir") == ("data.data_dir", None)


@pytest.mark.parametrize("field, text, expected", [
    ("eval.global_batch_size", "64", 64), ("data.data_dir", "/mnt/tfds", "/mnt/tfds"),
    ("data.mean_rgb", "(0.5, 0.5, 0.5)", (0.5, 0.5, 0.5)), ("eval.every_epochs", "2", 2.0)])
def test_set_field_parses_a_command_line_value_by_the_fields_type(field, text, expected):
    config = get_base_config()
    config_lib.set_field(config, field, text)
    assert config[field] == expected


def test_set_field_refuses_a_value_of_another_type_naming_the_field():
    with pytest.raises(ConfigError, match=r"config.eval.global_batch_size: 'many' does not fit a int field"):
        config_lib.set_field(get_base_config(), "eval.global_batch_size", "many")
