"""The base configuration (every field commented) and its validation; the package holds what is decided
from a config before anything runs.

| module | job |
|---|---|
| `__init__.py` | `get_base_config()`, `validate`, loading a config file or a shipped config by name |
| `fields.py` | the values each choice field accepts, the fields that set each duration |
| `recipes.py` | the published recipes, applied to the final global batch (`resolve`) |
| `plan.py` | `derive`: every size and duration of a run, in steps; `LoopSchedule`: when the loop acts |
| `text.py` | a config printed as a config file, each field with its comment (`--print_config`) |
| `command_line.py` | a command's flags and `--config` read before JAX loads; a mistake in one line |
| `evaluation.py` | a saved run's config made ready for an evaluation-only run (`evaluate_workdir`) |

Config files under `configs/` start from `get_base_config()` and change only what differs. `setup`
(training/training_setup.py) validates once per command; `plan.derive` then makes the `TrainingPlan`
consumers read. The values each choice field accepts and the fields that set each duration are in
fields.py, which the modules that read those fields import too.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from resnet_scaling.config.fields import (
    COMPUTE_DTYPES,
    DATA_SOURCES,
    DURATIONS,
    LARS_VARIANTS,
    LOWERINGS,
    LR_SCALINGS,
    MODEL_NAMES,
    OPTIMIZERS,
    RESIZE_METHODS,
    SCHEDULES,
    SUBMISSION_DIVISIONS,
    SUBMISSION_STATUSES,
    TRAINING_LENGTH,
    WEIGHT_DECAY_LEAVES,
    set_duration_field,
)
from resnet_scaling.job.errors import ConfigError

__all__ = ["IMAGENET_MEAN_RGB", "IMAGENET_NUM_EVAL_EXAMPLES", "IMAGENET_NUM_TRAIN_EXAMPLES",
           "IMAGENET_STDDEV_RGB", "ConfigError", "config_from_saved", "find_config_file", "get_base_config",
           "resolve_config_flag", "shipped_config_names", "validate"]

IMAGENET_NUM_TRAIN_EXAMPLES = 1_281_167
IMAGENET_NUM_EVAL_EXAMPLES = 50_000
# Per-channel RGB statistics of ImageNet on a [0, 1] scale (the values torchvision and the TF reference use).
IMAGENET_MEAN_RGB = (0.485, 0.456, 0.406)
IMAGENET_STDDEV_RGB = (0.229, 0.224, 0.225)


def get_base_config() -> ml_collections.ConfigDict:
    """Returns the defaults every config file starts from: ResNet-50 on ImageNet for 90 epochs, locked
    (a misspelled field raises `AttributeError` with the likely name instead of being accepted silently).
    Durations: the first of `*_steps`, `*_examples`, `*_epochs` set (not None) counts (`plan.duration_steps`).
    """
    config = ml_collections.ConfigDict()
    config.seed = 0  # Seeds parameter initialisation, synthetic data and shuffling.
    # The published recipe (recipes.RECIPES) that set the optimizer, schedule and length, set by the
    # recipe's function (recipes.use_case_study_recipe, ...); "": none. Its values follow the global batch:
    # once every override is in, recipes.resolve gives each field the recipe still sets the recipe's value
    # for the final batch. A field set after the recipe, in the file or on the command line, keeps its value.
    config.recipe = ""
    config.recipe_batch_size = 0  # The global batch the recipe's values in this config are for.

    config.model = ml_collections.ConfigDict()
    config.model.name = "resnet50"  # One of config_fields.MODEL_NAMES.
    config.model.num_classes = 1000  # Width of the classifier.
    config.model.num_filters = 64  # Channels of the stem; each stage doubles them (64 is the paper's).
    config.model.zero_init_last_bn_scale = True  # Zero-init the last BN scale in each block (Goyal et al.).
    config.model.bn_momentum = 0.9  # Decay of the batch-norm moving averages.
    config.model.bn_epsilon = 1e-5  # Added to the variance in batch norm.
    # Images per batch-norm group in training: -1 the global batch, 0 each device's own, N > 0 consecutive
    # images (a multiple of the per-device batch dividing the global batch; MLPerf's TPU pod runs used ~128).
    config.model.bn_group_size = -1
    # Dtype of activations and convolutions. Parameters, BN statistics and the loss stay float32.
    # float16 turns on dynamic loss scaling (for V100s, which have no bfloat16 units).
    config.model.compute_dtype = "float32"
    # How 1x1 convolutions and max pooling are written (config_fields.LOWERINGS): "auto" picks the forms
    # XLA's CPU backend runs fastest on CPUs and nn.Conv / nn.max_pool on TPUs and GPUs; same parameters,
    # same outputs.
    config.model.lowering = "auto"
    # Initial weights: a torchvision ResNet state dict saved as .npz, a workdir (its export/), an export/
    # directory or a checkpoint (WORKDIR/checkpoints/<step>); a run resuming its own checkpoint ignores it.
    config.model.init_from = ""
    config.model.init_skip_classifier = False  # Start the classifier afresh (fine-tuning, other classes).

    config.data = ml_collections.ConfigDict()
    # Where images come from: "tfds" a prepared TFDS dataset (`dataset`, `data_dir`), "folders" JPEG/PNG
    # files in <folder>/train/<class>/ and <folder>/val/<class>/, "shapes" the demo dataset (JPEGs written
    # once into `cache_dir`, read like "folders"), "synthetic" random images made on the device (throughput
    # benchmarks; no input cost), "arrays" NumPy arrays handed to train_and_evaluate (research code, tests).
    config.data.source = "tfds"
    config.data.dataset = "imagenet2012"  # TFDS name, optionally with config/version ("name/config:1.0.0").
    config.data.data_dir = ""  # TFDS data_dir; "": $TFDS_DATA_DIR or ~/tensorflow_datasets.
    config.data.train_split = "train"  # TFDS split names; sub-splits ("train[:90%]") work too.
    config.data.eval_split = "validation"
    config.data.image_key = "image"  # TFDS feature names of the image and the label.
    config.data.label_key = "label"
    config.data.folder = ""  # Root of a class-folder dataset ("folders").
    config.data.cache_dir = "~/.cache/resnet_scaling"  # Where the "shapes" dataset's files are written once.
    config.data.image_size = 224  # Height and width of training and evaluation images.
    # The "arrays" source's class names, label i's at i (a tuple of strings), saved with the export so that
    # predictions can be named; None: unnamed. The other sources take theirs from the dataset (folder names,
    # TFDS label names; none for "synthetic").
    config.data.class_names = None
    config.data.num_train_examples = IMAGENET_NUM_TRAIN_EXAMPLES  # Epoch length for synthetic/shapes.
    config.data.num_eval_examples = IMAGENET_NUM_EVAL_EXAMPLES  # Validation images for synthetic/shapes.
    config.data.mean_rgb = IMAGENET_MEAN_RGB  # Subtracted on the device from images scaled to [0, 1].
    config.data.stddev_rgb = IMAGENET_STDDEV_RGB  # Divides them afterwards.
    config.data.shuffle = True  # Reshuffle the training examples every epoch.
    config.data.synthetic_num_batches = 4  # Distinct batches the synthetic source makes and cycles.
    # Training crop (ResNet-50 v1.5 reference): area fraction (MLPerf: 0.05-1) and aspect-ratio ranges.
    config.data.crop_area_range = (0.08, 1.0)
    config.data.crop_aspect_range = (3 / 4, 4 / 3)
    config.data.crop_attempts = 10  # Windows tried before falling back to the evaluation centre crop.
    config.data.random_flip = True  # Random horizontal flip in training.
    # Evaluation: resize the shorter side to this, then cut the central image_size square (256 -> 224).
    config.data.eval_resize_size = 256
    config.data.resize_method = "bilinear"  # "bilinear", "bicubic" or "area".
    # tf.data: TFRecord (TFDS) sources read `interleave_cycle_length` file pieces at once and permute
    # their records within windows of `shuffle_buffer_size` (that many encoded images in host memory).
    config.data.shuffle_buffer_size = 16_384
    config.data.interleave_cycle_length = 16
    config.data.num_threads = 0  # Host threads for decoding; 0 lets tf.data choose (all cores).
    config.data.prefetch_batches = 2  # Batches decoded ahead on the host.
    config.data.device_prefetch = 2  # Batches copied to the devices ahead of the step that takes them.

    config.system = ml_collections.ConfigDict()
    config.system.name = ""  # The hardware a config is written for, e.g. "Cloud TPU v2-512"; for reports.
    config.system.device_kind = ""  # As jax.Device.device_kind says it ("TPU v2", "NVIDIA H100 80GB HBM3").
    # TPU topology for ahead-of-time compilation (resnet_scaling.compile), e.g. "v2:16x16"; "" for none.
    config.system.topology = ""
    config.system.chips_per_host_bounds = (2, 2, 1)  # Chips per TPU host (VM) along x, y, z.
    # TPU slices joined by the data-center network (multislice). Above 1: `topology` is one slice's, the
    # mesh is ("dcn", "data") over every device of every slice, and bn_group_size groups must fit in a slice.
    config.system.num_slices = 1

    config.mesh = ml_collections.ConfigDict()
    config.mesh.num_devices = -1  # Devices in the `data` mesh axis; -1 uses every device of the job.

    config.training = ml_collections.ConfigDict()
    config.training.global_batch_size = 1024  # Images per step summed over all devices and hosts.
    # Training length: steps, else images seen, else epochs (the first that is set).
    config.training.num_train_steps = placeholder(int)
    config.training.num_examples = placeholder(int)
    config.training.num_epochs = 90.0
    config.training.label_smoothing = 0.0  # Weight of the uniform distribution mixed into the labels.
    config.training.log_every_steps = 100  # Fetch metrics from the device and log them this often.
    # ...and at the first step this many seconds after the last progress line, so that slow steps (a CPU)
    # still show progress; 0: steps only. Single-process runs only (a multi-process job logs by steps: its
    # processes must agree on every log point). Training is the same either way.
    config.training.log_every_sec = 30.0
    # Divergence guard: a state whose parameter norm grew more than this factor since the run (re)started
    # is never checkpointed; 0: off. Weight decay and BN keep it within a few x; a runaway learning rate
    # multiplies it by 1e3-1e10 in a few steps, before the loss turns NaN (NaN is never checkpointed anyway).
    config.training.max_param_norm_growth = 100.0
    config.training.tensorboard = True  # Also write a TensorBoard event file (without TensorFlow).
    # Before timing steady-state images/sec and time-to-accuracy: one epoch, as the case study ran; 0: none.
    config.training.timing_warmup_steps = placeholder(int)
    config.training.timing_warmup_examples = placeholder(int)
    config.training.timing_warmup_epochs = 1.0
    # Steps (first, last) process 0 traces with jax.profiler into WORKDIR/tensorboard; (0, 0): none.
    config.training.profile_steps = (0, 0)
    # JAX's persistent compilation cache, set by the entry points: a restarted run loads its compiled step.
    # "{workdir}": the run's workdir (shared by the job's processes; gs:// works); "" turns it off.
    config.training.compilation_cache_dir = "{workdir}/compilation_cache"

    config.optimizer = ml_collections.ConfigDict()
    # "sgd" (momentum), "lars" (optim.lars, as TensorFlow and MLPerf define it) or "optax_lars" (optax.lars,
    # whose trust ratio is eta * |w| / |g + wd * w|).
    config.optimizer.name = "sgd"
    config.optimizer.momentum = 0.9  # Momentum of SGD and LARS.
    config.optimizer.nesterov = False  # Nesterov momentum (SGD and LARS).
    config.optimizer.weight_decay = 1e-4  # L2 coefficient.
    # "kernels" (conv, dense) or "non_batchnorm" (and biases: tensorflow/tpu's L2 loss, Goyal et al.); not BN.
    config.optimizer.weight_decay_on = "kernels"
    config.optimizer.lars_trust_coefficient = 0.001  # LARS eta; trust ratios skip BN params and biases.
    config.optimizer.lars_epsilon = 0.0  # Added to the LARS trust ratio's denominator.
    # "reference" (TensorFlow >= 1.13, MLPerf, flax.optim.LARS) or "tf1.12" (the LARSOptimizer of
    # TensorFlow 1.12.0, which the case study ran): see optim.py.
    config.optimizer.lars_variant = "reference"
    # Peak learning rate = base_learning_rate * global_batch_size / lr_reference_batch_size with
    # lr_scaling "linear" (Goyal et al.), or base_learning_rate itself with "none" (LARS recipes).
    config.optimizer.base_learning_rate = 0.1
    config.optimizer.lr_reference_batch_size = 256
    config.optimizer.lr_scaling = "linear"  # One of config_fields.LR_SCALINGS.

    config.schedule = ml_collections.ConfigDict()
    config.schedule.name = "cosine"  # After warm-up: "cosine", "polynomial", "piecewise", "constant".
    # Linear warm-up from 0 to the peak learning rate: steps, else images, else epochs.
    config.schedule.warmup_steps = placeholder(int)
    config.schedule.warmup_examples = placeholder(int)
    config.schedule.warmup_epochs = 5.0
    config.schedule.end_learning_rate = 0.0  # Final value for "cosine" and "polynomial".
    config.schedule.polynomial_power = 2.0  # Power of the "polynomial" decay (MLPerf fixes 2).
    config.schedule.boundary_epochs = (30.0, 60.0, 80.0)  # Epochs where "piecewise" decays.
    config.schedule.decay_factor = 0.1  # Multiplier at each "piecewise" boundary.

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.enabled = True  # Save to WORKDIR/checkpoints and resume from there automatically.
    # Save this often (and at the end, and on SIGTERM): steps, else images, else epochs; 0 only then.
    config.checkpoint.every_steps = placeholder(int)
    config.checkpoint.every_examples = placeholder(int)
    config.checkpoint.every_epochs = 1.0
    config.checkpoint.keep = 3  # Newest full checkpoints kept.
    # Save at every evaluation too, and keep the best evaluation's checkpoint besides the newest `keep`.
    config.checkpoint.keep_best = True
    config.checkpoint.async_save = True  # Write in the background while training goes on.
    config.checkpoint.export = True  # Write the final parameters to WORKDIR/export at the end.
    # If every checkpoint is unreadable (moved to unreadable_checkpoints/), train from step 0, not fail.
    config.checkpoint.restart_from_scratch = False

    config.eval = ml_collections.ConfigDict()
    config.eval.global_batch_size = 1024  # Images per evaluation step over all devices.
    # Evaluate this often (and at the end): steps, else images, else epochs; 0 only at the end.
    config.eval.every_steps = placeholder(int)
    config.eval.every_examples = placeholder(int)
    config.eval.every_epochs = 1.0
    # Top-1 that counts as trained, for time-to-accuracy: the case study's 0.76; MLPerf's is 0.759.
    config.eval.target_top1 = 0.76

    # MLPerf Training: every run writes WORKDIR/mlperf_log.txt (process 0) with mlperf_logging's mllog
    # (metrics/mlperf_log.py). MLPerf mode (`enabled`) follows MLPerf's rules over the case study's: the step
    # compiled on the batch's shapes before run_start (no data read before the clock), evaluations every
    # `eval_every_epochs` by images seen, a stop at the first at or above `target_top1`, a 0.05-1 crop area.
    config.mlperf = ml_collections.ConfigDict()
    config.mlperf.enabled = False
    config.mlperf.target_top1 = 0.759  # MLPerf's ResNet-50 target: run_stop says success at or above it.
    config.mlperf.eval_every_epochs = 4  # MLPerf mode: evaluate after every 4th epoch (a whole number).
    # The log's submission keys: org ("": "resnet_scaling"), platform ("": config.system.name, else
    # "<devices>x<device kind>"), division ("closed"/"open"), status ("cloud"/"onprem"/"preview"/"research").
    config.mlperf.submission_org = ""
    config.mlperf.submission_platform = ""
    config.mlperf.submission_division = "closed"
    config.mlperf.submission_status = "research"
    # cache_clear's value: set True when the launch dropped the OS page cache before the run, as MLPerf
    # asks (`sync; echo 3 > /proc/sys/vm/drop_caches`, as root); the library cannot do it itself.
    config.mlperf.caches_cleared = False
    # Locked (see above); `with config.unlocked():` adds a field on purpose.
    config.lock()
    return config


def _validate_bn_group_size(v: _Problems, config: ml_collections.ConfigDict,
                            num_devices: int | None) -> None:
    group_size = config.model.bn_group_size
    global_batch = config.training.global_batch_size
    field = "model.bn_group_size"
    v.require(group_size >= -1, field, f"use -1 (global batch), 0 (per device) or images per group, got "
              f"{group_size}.")
    if group_size <= 0 or not (isinstance(global_batch, int) and global_batch > 0):
        return  # No groups, or a batch already reported: nothing to divide.
    if not v.require(global_batch % group_size == 0, field,
                     f"{group_size} images per group do not divide the global batch of {global_batch}; use "
                     f"a divisor of it, or -1 for the whole batch."):
        return
    if num_devices is not None and global_batch % num_devices == 0:
        per_device = global_batch // num_devices
        v.require(group_size % per_device == 0, field,
                  f"{group_size} images per group would split a device's {per_device} images; use a "
                  f"multiple of the per-device batch ({per_device}, {2 * per_device}, ...), or 0 for "
                  f"per-device groups.")


def _validate_slices(v: _Problems, config: ml_collections.ConfigDict) -> None:
    """A TPU host's chips are three whole numbers. Several slices split the pinned device count evenly, and
    BN groups (N > 0) stay in one slice (across slices, every BN layer would all-reduce its statistics over
    DCN, forward and backward). -1 spans them by definition (evaluation, with no groups, sets it).
    `mesh.create_mesh` checks the devices themselves."""
    bounds = config.system.chips_per_host_bounds
    whole = all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bounds)
    v.require(len(bounds) == 3 and whole, "system.chips_per_host_bounds",
              f"needs three positive whole numbers (x, y, z), e.g. (2, 2, 1), got {tuple(bounds)!r}.")
    num_slices = config.system.num_slices
    v.require(isinstance(num_slices, int) and num_slices >= 1, "system.num_slices",
              f"use 1 (one slice) or the number of TPU slices of the job, got {num_slices!r}.")
    if num_slices == 1:
        return
    mesh_devices = config.mesh.num_devices
    v.require(mesh_devices == -1 or mesh_devices % num_slices == 0, "mesh.num_devices",
              f"{mesh_devices} devices do not split evenly into {num_slices} slices; use -1 (every device "
              f"of every slice) or their total.")
    group_size = config.model.bn_group_size
    if group_size <= 0:
        return
    global_batch = config.training.global_batch_size
    slice_batch = global_batch // num_slices
    v.require(global_batch % num_slices == 0 and slice_batch % group_size == 0, "model.bn_group_size",
              f"groups of {group_size} images would span two of the {num_slices} slices (each holds "
              f"{global_batch / num_slices:g} of the {global_batch} images per step) and all-reduce BN "
              f"statistics over the data-center network; use a divisor of a slice's images (a multiple of "
              f"the per-device batch), 0 for per-device groups, or -1 for the global batch.")


class _Problems:
    """What `validate` finds wrong, all of it: each check records its problem and the checks go on."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def require(self, condition: bool, field: str, message: str) -> bool:
        """Records `message` for `field` unless `condition`; returns `condition` (False: skip the checks
        that build on it)."""
        if not condition:
            self.messages.append(f"config.{field}: {message}")
        return bool(condition)

    def choice(self, value: str, field: str, choices: tuple[str, ...]) -> None:
        self.require(value in choices, field, f"unknown value {value!r}; choose one of {', '.join(choices)}.")

    def positive(self, config: ml_collections.ConfigDict, field: str) -> None:
        value = config
        for part in field.split("."):
            value = value[part]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.require(False, field, f"must be a number, got {value!r}.")
            return
        self.require(value > 0, field, f"must be positive, got {value!r}.")
        self.require(math.isfinite(value), field, f"must be finite, got {value!r}.")

    def error(self) -> ConfigError | None:
        if not self.messages:
            return None
        if len(self.messages) == 1:
            return ConfigError(self.messages[0])
        # Numbered, since a message may hold a "; " of its own and each ends with its full stop.
        return ConfigError(f"{len(self.messages)} problems: " +
                           " ".join(f"({i}) {m}" for i, m in enumerate(self.messages, 1)))


def _validate_input_pipeline(v: _Problems, data: ml_collections.ConfigDict) -> None:
    v.choice(data.resize_method, "data.resize_method", RESIZE_METHODS)
    if data.source == "tfds":
        v.require(bool(data.dataset), "data.dataset", "name a TFDS dataset, e.g. 'imagenet2012'.")
    if data.source == "folders":
        v.require(bool(data.folder), "data.folder",
                  "give the dataset's root (with train/<class>/ and val/<class>/ inside).")
    for field in ("crop_area_range", "crop_aspect_range"):
        v.require(len(data[field]) == 2, f"data.{field}", f"needs (low, high), got {data[field]!r}.")
    low, high = data.crop_area_range
    v.require(0.0 < low <= high <= 1.0, "data.crop_area_range",
              f"needs 0 < low <= high <= 1 (the reference uses (0.08, 1.0)), got {(low, high)}.")
    low, high = data.crop_aspect_range
    v.require(0.0 < low <= high, "data.crop_aspect_range",
              f"needs 0 < low <= high (the reference uses (3/4, 4/3)), got {(low, high)}.")
    v.require(data.eval_resize_size >= data.image_size, "data.eval_resize_size",
              f"must be at least data.image_size ({data.image_size}), got {data.eval_resize_size}.")
    for field in ("crop_attempts", "shuffle_buffer_size", "interleave_cycle_length"):
        v.require(data[field] > 0, f"data.{field}", f"must be positive, got {data[field]}.")
    for field in ("num_threads", "prefetch_batches", "device_prefetch"):
        v.require(data[field] >= 0, f"data.{field}", f"must be >= 0, got {data[field]}.")


def _validate_class_names(v: _Problems, config: ml_collections.ConfigDict) -> None:
    """`data.class_names` names the arrays' labels, one string per class; other sources have their own."""
    names, source = config.data.get("class_names"), config.data.source
    if names is None:
        return
    if not v.require(source == "arrays", "data.class_names",
                     f"names the classes of the 'arrays' source only; {source!r} "
                     f"{'has none' if source == 'synthetic' else 'takes them from the dataset'}: set it to "
                     "None."):
        return
    if not v.require(isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names),
                     "data.class_names", f"use a tuple of strings, label i's name at i; got {names!r}."):
        return
    num_classes = config.model.num_classes
    v.require(len(names) == num_classes, "data.class_names",
              f"holds {len(names)} names for model.num_classes={num_classes} classes; give one per label.")


def _validate_durations(v: _Problems, config: ml_collections.ConfigDict) -> None:
    """The run's length must be set and positive; warm-ups must not be negative. Intervals of 0 or less
    mean "only at the end" (and on preemption)."""
    for duration in DURATIONS:
        steps_field, examples_field, epochs_field = duration.fields()
        field = set_duration_field(config, duration)
        if field is None:
            v.require(duration is not TRAINING_LENGTH, epochs_field,
                      f"set the training length: {steps_field}, {examples_field} or {epochs_field}.")
            continue
        section, name = field.split(".")
        value = config[section][name]
        if duration is TRAINING_LENGTH:
            v.require(value > 0, field, f"must be positive, got {value}.")
        elif duration.rounding != "interval":
            v.require(value >= 0, field, f"must be >= 0 (0 for none), got {value}.")


def _validate_mlperf(v: _Problems, mlperf: ml_collections.ConfigDict) -> None:
    """MLPerf's log and mode (metrics/mlperf_log.py): a target in (0, 1], whole epochs between MLPerf-mode
    evaluations (its blocks are whole epochs), and submission keys MLPerf's checker accepts."""
    target = mlperf.target_top1
    v.require(0.0 < target <= 1.0, "mlperf.target_top1",
              f"must lie in (0, 1] (MLPerf's is 0.759), got {target}.")
    every = mlperf.eval_every_epochs
    v.require(every > 0 and float(every).is_integer(), "mlperf.eval_every_epochs",
              f"use a whole number of epochs (MLPerf's rule is 4), got {every}.")
    v.choice(mlperf.submission_division, "mlperf.submission_division", SUBMISSION_DIVISIONS)
    v.choice(mlperf.submission_status, "mlperf.submission_status", SUBMISSION_STATUSES)


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Refuses invalid settings with a `ConfigError` that names the field and the fix, for every problem
    at once ("2 problems: (1) config.a: .... (2) config.b: ....").

    Args:
      num_devices: devices the run will use; when given, batch divisibility is checked too.
    """
    problems = _Problems()
    try:
        _check(problems, config, num_devices)
    except (TypeError, ValueError, ZeroDivisionError, KeyError, AttributeError):
        if not problems.messages:  # A check that a value of the wrong kind broke, with nothing found yet.
            raise
        # Otherwise a problem found already broke a later check that relies on it: report what was found.
    error = problems.error()
    if error is not None:
        raise error


def _check(v: _Problems, config: ml_collections.ConfigDict, num_devices: int | None) -> None:
    v.require(
        config.mesh.num_devices == -1 or config.mesh.num_devices > 0,
        "mesh.num_devices",
        "use -1 (all devices) or a positive count.",
    )
    v.choice(config.model.name, "model.name", MODEL_NAMES)
    v.choice(config.model.compute_dtype, "model.compute_dtype", COMPUTE_DTYPES)
    v.choice(config.model.lowering, "model.lowering", LOWERINGS)
    v.choice(config.data.source, "data.source", DATA_SOURCES)
    _validate_input_pipeline(v, config.data)
    _validate_class_names(v, config)
    v.choice(config.optimizer.name, "optimizer.name", OPTIMIZERS)
    v.choice(config.optimizer.lars_variant, "optimizer.lars_variant", LARS_VARIANTS)
    v.choice(config.optimizer.weight_decay_on, "optimizer.weight_decay_on", WEIGHT_DECAY_LEAVES)
    v.choice(config.optimizer.lr_scaling, "optimizer.lr_scaling", LR_SCALINGS)
    v.choice(config.schedule.name, "schedule.name", SCHEDULES)
    for field in (
        "model.num_classes",
        "model.num_filters",
        "model.bn_epsilon",
        "data.image_size",
        "data.num_train_examples",
        "data.num_eval_examples",
        "data.synthetic_num_batches",
        "training.global_batch_size",
        "training.log_every_steps",
        "optimizer.base_learning_rate",
        "optimizer.lr_reference_batch_size",
        "eval.global_batch_size",
        "checkpoint.keep",
    ):
        v.positive(config, field)
    v.require(0.0 <= config.model.bn_momentum < 1.0, "model.bn_momentum", "must lie in [0, 1).")
    growth = config.training.max_param_norm_growth
    v.require(growth == 0 or growth > 1, "training.max_param_norm_growth",
              f"use 0 (off) or a factor above 1, got {growth}.")
    _validate_bn_group_size(v, config, num_devices)
    _validate_slices(v, config)
    v.require(
        config.data.image_size >= 32,
        "data.image_size",
        f"ResNets downsample by 32; use at least 32 pixels, got {config.data.image_size}.",
    )
    _validate_durations(v, config)
    _validate_mlperf(v, config.mlperf)
    window = tuple(config.training.profile_steps)
    v.require(window == (0, 0) or (len(window) == 2 and all(isinstance(s, int) for s in window)
                                  and 0 < window[0] <= window[1]),
              "training.profile_steps", f"use (first, last) with 0 < first <= last, or (0, 0) for no trace; "
              f"got {window}.")
    v.require(
        0.0 <= config.training.label_smoothing < 1.0,
        "training.label_smoothing",
        f"must lie in [0, 1), got {config.training.label_smoothing}.",
    )
    target = config.eval.target_top1
    v.require(0.0 < target <= 1.0, "eval.target_top1",
              f"must lie in (0, 1] (0.76 the case study's, 0.759 MLPerf's), got {target}.")
    v.require(config.training.log_every_sec >= 0, "training.log_every_sec",
              f"must be >= 0 (0: log by steps only), got {config.training.log_every_sec}.")
    v.require(config.optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0.")
    v.require(config.optimizer.lars_epsilon >= 0, "optimizer.lars_epsilon", "must be >= 0.")
    v.require(0.0 <= config.optimizer.momentum < 1.0, "optimizer.momentum", "must lie in [0, 1).")
    v.require(config.schedule.end_learning_rate >= 0, "schedule.end_learning_rate", "must be >= 0.")
    v.require(config.schedule.decay_factor > 0, "schedule.decay_factor", "must be positive (0.1 decays 10x).")
    v.require(config.schedule.polynomial_power > 0, "schedule.polynomial_power", "must be positive.")
    boundaries = list(config.schedule.boundary_epochs)
    v.require(
        boundaries == sorted(boundaries) and all(b > 0 for b in boundaries),
        "schedule.boundary_epochs",
        f"must be positive and increasing, got {tuple(boundaries)}.",
    )
    v.require(
        len(config.data.mean_rgb) == 3 and len(config.data.stddev_rgb) == 3,
        "data.mean_rgb",
        "mean_rgb and stddev_rgb need three values (R, G, B).",
    )
    v.require(min(config.data.stddev_rgb) > 0, "data.stddev_rgb", "values must be positive.")
    if num_devices is not None:
        for field in ("training.global_batch_size", "eval.global_batch_size"):
            section, name = field.split(".")
            batch = config[section][name]
            if not isinstance(batch, int) or batch <= 0:
                continue  # Reported above.
            if batch % num_devices:
                lower = max(num_devices, batch // num_devices * num_devices)
                v.require(
                    False,
                    field,
                    f"{batch} is not divisible by the {num_devices} devices of the mesh; use a "
                    f"multiple of {num_devices} (for example {lower} or {lower + num_devices}).",
                )


def overrides_for_devices(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, Any]:
    """The overrides that make a config written for more devices valid on `num_devices`: every device, and,
    where its settings cannot hold there, batch sizes the devices divide and per-device batch-norm groups.
    A user told to use them meets no second refusal of the config (tested for every shipped config)."""
    overrides: dict[str, Any] = {"mesh.num_devices": -1}
    for field in ("training.global_batch_size", "eval.global_batch_size"):
        section, name = field.split(".")
        batch = config[section][name]
        if batch % num_devices:
            overrides[field] = max(num_devices, batch // num_devices * num_devices)
    if config.system.num_slices > 1 and num_devices % config.system.num_slices:
        overrides["system.num_slices"] = 1
    batch = overrides.get("training.global_batch_size", config.training.global_batch_size)
    group = config.model.bn_group_size
    num_slices = overrides.get("system.num_slices", config.system.num_slices)
    if group > 0 and (group % (batch // num_devices) or batch % group or (batch // num_slices) % group):
        overrides["model.bn_group_size"] = 0
    return overrides


def too_few_devices_error(config: ml_collections.ConfigDict, num_visible: int, platform: str,
                          config_arg: str = "CONFIG") -> ConfigError:
    """The refusal of a config whose `mesh.num_devices` exceeds the devices visible, with the two ways on:
    compile it for its TPU topology here (`--config=config_arg`: the command line's value where it is
    known), or the overrides that train it on these devices."""
    system = f", {config.system.name}," if config.system.name else ""
    visible = f"{num_visible} {platform} device" + (" is" if num_visible == 1 else "s are")
    flags = " ".join(f"--config.{field}={value}"
                     for field, value in overrides_for_devices(config, num_visible).items())
    check = ("To check it here, compile its step for its topology: python -m resnet_scaling.compile "
             f"--config={config_arg} (the [tpu] extra). " if config.system.topology else "")
    return ConfigError(
        f"config.mesh.num_devices: this config is written for {config.mesh.num_devices} devices{system} and "
        f"{visible} visible. {check}To train it on these devices, add {flags}.")


# Fields that change neither the compiled step nor the plan (where values came from; how often the loop
# prints), left out of `config_hash` so that adding them left the shipped compile reports current.
UNHASHED_FIELDS = ("recipe", "recipe_batch_size", "training.log_every_sec")


def config_hash(config: ml_collections.ConfigDict) -> str:
    """A short hash of every setting's value (`UNHASHED_FIELDS` aside): the same for the same settings, in
    any order of setting them (a shipped compile report records its config's, `planning/shipped_reports.py`).
    """
    values = config.to_dict()
    for field in UNHASHED_FIELDS:
        *sections, name = field.split(".")
        section = values
        for key in sections:
            section = section.get(key, {})
        section.pop(name, None)
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_from_saved(values: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A saved run's config (from export/ or a checkpoint) over today's `get_base_config()`: newer fields
    take their defaults, so older workdirs still validate and build; every saved value is kept."""
    config = get_base_config()
    with config.unlocked():  # Fields a saved run had that today's base has not are kept too.
        _merge(config, values)
    return config


def _merge(target: ml_collections.ConfigDict, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        current = target.get(key)
        if isinstance(current, ml_collections.ConfigDict) and isinstance(value, Mapping):
            _merge(current, value)
            continue
        try:
            target[key] = value
        except TypeError:  # A field whose type changed since: the run's own value still wins.
            with target.ignore_type():
                target[key] = value


def shipped_configs_dir() -> pathlib.Path | None:
    """The folder of the config files that ship with the package (`resnet_scaling.configs`); in a
    checkout that is not installed, its top-level `configs/`."""
    try:
        return pathlib.Path(str(importlib.resources.files("resnet_scaling.configs")))
    except ModuleNotFoundError:
        checkout = pathlib.Path(__file__).resolve().parents[1] / "configs"
        return checkout if checkout.is_dir() else None


def shipped_config_names() -> list[str]:
    """The names `--config` accepts besides paths: "demo", "pod", "gpu_h100x8", ..."""
    folder = shipped_configs_dir()
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__") if folder else []


def config_flag_value(path: str) -> str:
    """The `--config` value a person types for `path` (as `find_config_file` resolved it): a shipped
    config's name ("pod", with its ":arg" if any), else `path` itself."""
    file, sep, arg = path.partition(":")
    folder = shipped_configs_dir()
    candidate = pathlib.Path(file)
    if folder is not None and candidate.suffix == ".py" and candidate.resolve().parent == folder.resolve():
        return candidate.stem + sep + arg
    return path


def find_config_file(value: str) -> str:
    """The config file a `--config` value means: an existing path as given (with its optional `:arg`);
    else a shipped config by name ("pod") or by its checkout path ("configs/pod.py") from any directory.
    Anything else comes back unchanged, for the flag's own "file not found" error."""
    path, sep, arg = value.partition(":")
    if os.path.isfile(path):
        return value
    candidate = pathlib.PurePath(path)
    if candidate.suffix == ".py" and candidate.parent.name in ("configs", ""):
        candidate = pathlib.PurePath(candidate.stem)
    folder = shipped_configs_dir()
    if folder is not None and len(candidate.parts) == 1 and (folder / f"{candidate}.py").is_file():
        return str(folder / f"{candidate}.py") + sep + arg
    return value


def load_config(value: str) -> ml_collections.ConfigDict:
    """The config a `--config` value names (a shipped name or a path), built by its `get_config()`.

    Raises:
      FileNotFoundError: no such config file or shipped name.
    """
    path = find_config_file(value).partition(":")[0]
    if not os.path.isfile(path):
        names = ", ".join(shipped_config_names())
        raise FileNotFoundError(f"No config {value!r}: give a path or one of {names}.")
    spec = importlib.util.spec_from_file_location(f"_resnet_scaling_config_{pathlib.Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def resolve_config_flag(argv: list[str], flag: str = "config") -> list[str]:
    """`argv` with the `--config` value turned into a file path by `find_config_file` (both the
    `--config=VALUE` and the `--config VALUE` forms); entry points call it before absl parses flags."""
    resolved = list(argv)
    for i, prefix, value in flag_values(argv, flag):
        resolved[i] = prefix + find_config_file(value)
    return resolved


# A command line's values, read here only: `--config` (a file), `--config.FIELD=VALUE` (ml_collections'
# config flag, which parses the values itself) and `FIELD=VALUE` overrides of another flag (the evaluation's
# `--override`, whose values `set_field` parses).
CONFIG_OVERRIDE_PREFIX = "--config."


def flag_values(argv: Sequence[str], flag: str) -> list[tuple[int, str, str]]:
    """Each value of `--FLAG=VALUE` and `--FLAG VALUE` in `argv`: (index of the argument holding it, what
    precedes it there, the value)."""
    found = []
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{flag}="):
            found.append((i, f"--{flag}=", arg.split("=", 1)[1]))
        elif arg == f"--{flag}" and i + 1 < len(argv):
            found.append((i + 1, "", argv[i + 1]))
    return found


def parse_override(text: str) -> tuple[str, str | None]:
    """A "FIELD=VALUE" override as its field and its value as typed, split at the first "=":
    ("data.data_dir", "/mnt/tfds"); the value is None without an "=" (a flag whose value is the next
    argument)."""
    field, sep, value = text.partition("=")
    return field.strip(), value if sep else None


def command_line_overrides(argv: Sequence[str]) -> dict[str, str | None]:
    """The `--config.FIELD=VALUE` overrides in `argv`, by field ("training.global_batch_size"), each with its
    value as typed (`parse_override`)."""
    return dict(parse_override(arg.removeprefix(CONFIG_OVERRIDE_PREFIX)) for arg in argv
                if arg.startswith(CONFIG_OVERRIDE_PREFIX))


def set_field(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """Sets `config.<field>` ("data.data_dir") to `value`, parsed where it is a command line's text and the
    field is not a string: a number, a boolean, or a tuple such as (1, 2).

    Raises:
      ConfigError: `value` does not fit the field's type.
    """
    section, _, name = field.partition(".")
    current = config[section][name]
    if isinstance(value, str) and not isinstance(current, str):
        value = _parse_value(value, type(current))
    try:
        config[section][name] = value
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.{field}: {value!r} does not fit a {type(current).__name__} field "
                          f"({e}).") from None


def _parse_value(text: str, kind: type) -> Any:
    """A command-line value for a field of type `kind`: a number, a boolean, or a tuple such as (1, 2)."""
    if kind is bool:
        if text.lower() in ("true", "1", "false", "0"):
            return text.lower() in ("true", "1")
        return text
    try:
        value = json.loads(text.replace("(", "[").replace(")", "]"))
    except json.JSONDecodeError:
        return text  # Refused by the field's type check, with its name.
    return tuple(value) if isinstance(value, list) else value
