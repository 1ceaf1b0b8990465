"""The base configuration (every field commented), derived values and validation.

Config files under `configs/` start from `get_base_config()` and change only what differs. The trainer
calls `validate(config, num_devices)` at start-up, then `derive(config, num_train_examples,
num_devices)` to turn durations given in epochs or steps into one `TrainingPlan`.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections

MODEL_NAMES = ("resnet_tiny", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet200")
DATA_SOURCES = ("tfds", "folders", "shapes", "synthetic", "arrays")
RESIZE_METHODS = ("bilinear", "bicubic", "area")
OPTIMIZERS = ("sgd", "lars")
SCHEDULES = ("cosine", "polynomial", "piecewise", "constant")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
LR_SCALINGS = ("linear", "none")

IMAGENET_NUM_TRAIN_EXAMPLES = 1_281_167
IMAGENET_NUM_EVAL_EXAMPLES = 50_000
# Per-channel RGB statistics of ImageNet on a [0, 1] scale (the values torchvision and the TF reference use).
IMAGENET_MEAN_RGB = (0.485, 0.456, 0.406)
IMAGENET_STDDEV_RGB = (0.229, 0.224, 0.225)


class ConfigError(ValueError):
    """An invalid configuration; the message names the field and the fix."""


def get_base_config() -> ml_collections.ConfigDict:
    """Returns the defaults every config file starts from: ResNet-50 on ImageNet for 90 epochs."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # Seeds parameter initialisation, synthetic data and shuffling.

    config.model = ml_collections.ConfigDict()
    config.model.name = "resnet50"  # One of MODEL_NAMES.
    config.model.num_classes = 1000  # Width of the classifier.
    config.model.num_filters = 64  # Channels of the stem; each stage doubles them (64 is the paper's).
    config.model.zero_init_last_bn_scale = True  # Zero-init the last BN scale in each block (Goyal et al.).
    config.model.bn_momentum = 0.9  # Decay of the batch-norm moving averages.
    config.model.bn_epsilon = 1e-5  # Added to the variance in batch norm.
    # Images per batch-norm group in training: -1 the whole global batch, 0 each device's own images,
    # N > 0 groups of N consecutive images (whole devices: a multiple of the per-device batch that divides
    # the global batch). The TPU pod MLPerf runs normalised over ~128-image groups.
    config.model.bn_group_size = -1
    # Dtype of activations and convolutions. Parameters, BN statistics and the loss stay float32.
    # float16 turns on dynamic loss scaling (for V100s, which have no bfloat16 units).
    config.model.compute_dtype = "float32"

    config.data = ml_collections.ConfigDict()
    # Where images come from:
    #   "tfds": a prepared TensorFlow Datasets dataset (`dataset`, `data_dir`; imagenet2012 by default),
    #   "folders": JPEG/PNG files in <folder>/train/<class>/ and <folder>/val/<class>/,
    #   "shapes": the generated demo dataset, written once as JPEGs into `cache_dir`, read like "folders",
    #   "synthetic": random images made on the device (throughput benchmarks; no input cost),
    #   "arrays": NumPy arrays handed to train_and_evaluate (research code, tests).
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
    config.data.num_train_examples = IMAGENET_NUM_TRAIN_EXAMPLES  # Epoch length for synthetic/shapes.
    config.data.num_eval_examples = IMAGENET_NUM_EVAL_EXAMPLES  # Validation images for synthetic/shapes.
    config.data.mean_rgb = IMAGENET_MEAN_RGB  # Subtracted on the device from images scaled to [0, 1].
    config.data.stddev_rgb = IMAGENET_STDDEV_RGB  # Divides them afterwards.
    config.data.shuffle = True  # Reshuffle the training examples every epoch.
    config.data.synthetic_num_batches = 4  # Distinct batches the synthetic source makes and cycles.
    # Training augmentation (ResNet-50 v1.5 reference): decode a random crop covering this fraction of
    # the image's area (MLPerf uses 0.05 as the lower end) with an aspect ratio in this range, resize it.
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
    config.system.num_slices = 1  # TPU slices joined by the data-center network (multislice).

    config.mesh = ml_collections.ConfigDict()
    config.mesh.num_devices = -1  # Devices in the `data` mesh axis; -1 uses every device of the job.

    config.training = ml_collections.ConfigDict()
    config.training.global_batch_size = 1024  # Images per step summed over all devices and hosts.
    config.training.num_epochs = 90.0  # Training length in epochs; ignored when num_train_steps > 0.
    config.training.num_train_steps = -1  # Training length in steps; -1 derives it from num_epochs.
    config.training.label_smoothing = 0.0  # Weight of the uniform distribution mixed into the labels.
    config.training.log_every_steps = 100  # Fetch metrics from the device and log them this often.
    config.training.tensorboard = True  # Also write TensorBoard event files (clu; imports TensorFlow).
    # Steps before the timed region (steady-state images/sec, time-to-accuracy) starts; -1: one epoch, as
    # the case study ran one warm-up epoch before its clock started.
    config.training.timing_warmup_steps = -1

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "sgd"  # "sgd" (momentum) or "lars".
    config.optimizer.momentum = 0.9  # Momentum of SGD and LARS.
    config.optimizer.nesterov = False  # Nesterov momentum (SGD and LARS).
    config.optimizer.weight_decay = 1e-4  # L2 on conv and dense kernels only (not BN, not biases).
    config.optimizer.lars_trust_coefficient = 0.001  # LARS eta; trust ratios skip BN params and biases.
    # Peak learning rate = base_learning_rate * global_batch_size / lr_reference_batch_size with
    # lr_scaling "linear" (Goyal et al.), or base_learning_rate itself with "none" (LARS recipes).
    config.optimizer.base_learning_rate = 0.1
    config.optimizer.lr_reference_batch_size = 256
    config.optimizer.lr_scaling = "linear"

    config.schedule = ml_collections.ConfigDict()
    config.schedule.name = "cosine"  # After warm-up: "cosine", "polynomial", "piecewise", "constant".
    config.schedule.warmup_epochs = 5.0  # Linear warm-up from 0; ignored when warmup_steps >= 0.
    config.schedule.warmup_steps = -1  # Warm-up in steps; -1 derives it from warmup_epochs.
    config.schedule.end_learning_rate = 0.0  # Final value for "cosine" and "polynomial".
    config.schedule.polynomial_power = 2.0  # Power of the "polynomial" decay (MLPerf fixes 2).
    config.schedule.boundary_epochs = (30.0, 60.0, 80.0)  # Epochs where "piecewise" decays.
    config.schedule.decay_factor = 0.1  # Multiplier at each "piecewise" boundary.

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.enabled = True  # Save to WORKDIR/checkpoints and resume from there automatically.
    config.checkpoint.every_epochs = 1.0  # Save this often (and at the end, and on SIGTERM).
    config.checkpoint.every_steps = -1  # Save every N steps instead; -1 derives it from every_epochs.
    config.checkpoint.keep = 3  # Newest full checkpoints kept.
    config.checkpoint.keep_best = True  # Also keep the parameters of the best evaluation in WORKDIR/best.
    config.checkpoint.async_save = True  # Write in the background while training goes on.
    config.checkpoint.export = True  # Write the final parameters to WORKDIR/export at the end.

    config.eval = ml_collections.ConfigDict()
    config.eval.global_batch_size = 1024  # Images per evaluation step over all devices.
    config.eval.every_epochs = 1.0  # Evaluate this often (and at the end); <= 0 only at the end.
    # Top-1 that counts as trained, for time-to-accuracy: the case study's 0.76; MLPerf's is 0.759.
    config.eval.target_top1 = 0.76
    return config


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Values derived from a config, the number of training examples and devices.

    Attributes:
      global_batch_size: images per training step over all devices.
      per_device_batch_size: images per training step on one device.
      num_train_examples: examples in one epoch.
      steps_per_epoch: steps in one pass over the training examples (rounded up; for display and
        per-epoch bookkeeping; durations in epochs use `epochs_to_steps`).
      total_steps: training steps of the whole run.
      warmup_steps: steps of linear learning-rate warm-up.
      peak_learning_rate: learning rate at the end of warm-up.
      eval_every_steps: steps between evaluations (0: only at the end).
      checkpoint_every_steps: steps between checkpoints (0: only at the end and on preemption).
      num_devices: devices in the data mesh axis.
      timing_warmup_steps: steps before the timed region (steady-state throughput, time-to-accuracy).
    """

    global_batch_size: int
    per_device_batch_size: int
    num_train_examples: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    peak_learning_rate: float
    eval_every_steps: int
    num_devices: int
    checkpoint_every_steps: int = 0
    timing_warmup_steps: int = 0

    def epochs_to_steps(self, epochs: float) -> int:
        """Steps that see `epochs` passes over the examples, rounded to the nearest step.

        Used for warm-up, evaluation intervals and schedule boundaries (the case study's 1-epoch warm-up
        is 1,251 steps at batch 1024 and 39 at batch 32768). The run's length rounds up instead.
        """
        return int(round(epochs * self.num_train_examples / self.global_batch_size))


def derive(config: ml_collections.ConfigDict, num_train_examples: int, num_devices: int) -> TrainingPlan:
    """Computes every derived value of a run in one place.

    Args:
      config: a validated config.
      num_train_examples: size of the training split (defines an epoch).
      num_devices: devices in the data mesh axis.

    Returns:
      The run's `TrainingPlan`.
    """
    if num_train_examples <= 0:
        raise ConfigError(f"The training split is empty ({num_train_examples} examples).")
    batch = config.training.global_batch_size
    plan = TrainingPlan(
        global_batch_size=batch,
        per_device_batch_size=batch // num_devices,
        num_train_examples=num_train_examples,
        steps_per_epoch=math.ceil(num_train_examples / batch),
        total_steps=0,
        warmup_steps=0,
        peak_learning_rate=0.0,
        eval_every_steps=0,
        num_devices=num_devices,
    )
    if config.training.num_train_steps > 0:
        total_steps = int(config.training.num_train_steps)
    else:
        # Rounded up, so a run sees at least the epochs asked for: the case study's 91 epochs are
        # 113,854 steps at batch 1024 and 3,558 at batch 32768.
        epochs = config.training.num_epochs
        total_steps = max(1, math.ceil(epochs * num_train_examples / batch - 1e-9))
    if config.schedule.warmup_steps >= 0:
        warmup_steps = int(config.schedule.warmup_steps)
    else:
        warmup_steps = plan.epochs_to_steps(config.schedule.warmup_epochs)
    warmup_steps = min(warmup_steps, total_steps)
    opt = config.optimizer
    peak = opt.base_learning_rate
    if opt.lr_scaling == "linear":
        peak = opt.base_learning_rate * batch / opt.lr_reference_batch_size
    eval_every_steps = 0
    if config.eval.every_epochs > 0:
        eval_every_steps = max(1, plan.epochs_to_steps(config.eval.every_epochs))
    checkpoint_every_steps = 0
    if config.checkpoint.every_steps > 0:
        checkpoint_every_steps = int(config.checkpoint.every_steps)
    elif config.checkpoint.every_epochs > 0:
        checkpoint_every_steps = max(1, plan.epochs_to_steps(config.checkpoint.every_epochs))
    timing_warmup_steps = config.training.timing_warmup_steps
    if timing_warmup_steps < 0:
        timing_warmup_steps = plan.epochs_to_steps(1.0)  # 1,251 at batch 1024: the case study's table.
    return dataclasses.replace(plan, total_steps=total_steps, warmup_steps=warmup_steps,
                               peak_learning_rate=float(peak), eval_every_steps=eval_every_steps,
                               checkpoint_every_steps=checkpoint_every_steps,
                               timing_warmup_steps=min(int(timing_warmup_steps), total_steps))


def resolve_bn_group_size(config: ml_collections.ConfigDict, num_devices: int | None) -> int | None:
    """Images per batch-norm group for the model, or None for the whole (global) batch.

    Args:
      config: the run's config (`model.bn_group_size`: -1 whole batch, 0 per device, N images).
      num_devices: devices in the mesh; required for 0 (per device).
    """
    group_size = int(config.model.bn_group_size)
    global_batch = int(config.training.global_batch_size)
    if group_size == 0:
        if num_devices is None:
            raise ValueError("config.model.bn_group_size = 0 (per device) needs the mesh's device count; "
                             "pass num_devices to models.model_from_config.")
        group_size = global_batch // num_devices
    if group_size < 0 or group_size == global_batch:
        return None  # One group: plain nn.BatchNorm over the global batch.
    return group_size


def _validate_bn_group_size(config: ml_collections.ConfigDict, num_devices: int | None) -> None:
    group_size = config.model.bn_group_size
    global_batch = config.training.global_batch_size
    field = "model.bn_group_size"
    _require(group_size >= -1, field, f"use -1 (global batch), 0 (per device) or images per group, got "
             f"{group_size}.")
    if group_size <= 0:
        return
    _require(global_batch % group_size == 0, field,
             f"{group_size} images per group do not divide the global batch of {global_batch}; use a "
             f"divisor of it, or -1 for the whole batch.")
    if num_devices is not None and global_batch % num_devices == 0:
        per_device = global_batch // num_devices
        _require(group_size % per_device == 0, field,
                 f"{group_size} images per group would split a device's {per_device} images; use a "
                 f"multiple of the per-device batch ({per_device}, {2 * per_device}, ...), or 0 for "
                 f"per-device groups.")


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config.{field}: {message}")


def _require_choice(value: str, field: str, choices: tuple[str, ...]) -> None:
    _require(value in choices, field, f"unknown value {value!r}; choose one of {', '.join(choices)}.")


def _require_positive(config: ml_collections.ConfigDict, field: str) -> None:
    value = config
    for part in field.split("."):
        value = value[part]
    _require(value > 0, field, f"must be positive, got {value!r}.")


def _validate_input_pipeline(data: ml_collections.ConfigDict) -> None:
    _require_choice(data.resize_method, "data.resize_method", RESIZE_METHODS)
    if data.source == "tfds":
        _require(bool(data.dataset), "data.dataset", "name a TFDS dataset, e.g. 'imagenet2012'.")
    if data.source == "folders":
        _require(bool(data.folder), "data.folder",
                 "give the dataset's root (with train/<class>/ and val/<class>/ inside).")
    for field in ("crop_area_range", "crop_aspect_range"):
        _require(len(data[field]) == 2, f"data.{field}", f"needs (low, high), got {data[field]!r}.")
    low, high = data.crop_area_range
    _require(0.0 < low <= high <= 1.0, "data.crop_area_range",
             f"needs 0 < low <= high <= 1 (the reference uses (0.08, 1.0)), got {(low, high)}.")
    low, high = data.crop_aspect_range
    _require(0.0 < low <= high, "data.crop_aspect_range",
             f"needs 0 < low <= high (the reference uses (3/4, 4/3)), got {(low, high)}.")
    _require(data.eval_resize_size >= data.image_size, "data.eval_resize_size",
             f"must be at least data.image_size ({data.image_size}), got {data.eval_resize_size}.")
    for field in ("crop_attempts", "shuffle_buffer_size", "interleave_cycle_length"):
        _require(data[field] > 0, f"data.{field}", f"must be positive, got {data[field]}.")
    for field in ("num_threads", "prefetch_batches", "device_prefetch"):
        _require(data[field] >= 0, f"data.{field}", f"must be >= 0, got {data[field]}.")


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Refuses invalid settings with a `ConfigError` that names the field and the fix.

    Args:
      config: the config to check.
      num_devices: devices the run will use; when given, batch divisibility is checked too.
    """
    _require_choice(config.model.name, "model.name", MODEL_NAMES)
    _require_choice(config.model.compute_dtype, "model.compute_dtype", COMPUTE_DTYPES)
    _require_choice(config.data.source, "data.source", DATA_SOURCES)
    _validate_input_pipeline(config.data)
    _require_choice(config.optimizer.name, "optimizer.name", OPTIMIZERS)
    _require_choice(config.optimizer.lr_scaling, "optimizer.lr_scaling", LR_SCALINGS)
    _require_choice(config.schedule.name, "schedule.name", SCHEDULES)
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
        _require_positive(config, field)
    _require(0.0 <= config.model.bn_momentum < 1.0, "model.bn_momentum", "must lie in [0, 1).")
    _validate_bn_group_size(config, num_devices)
    _require(
        config.data.image_size >= 32,
        "data.image_size",
        f"ResNets downsample by 32; use at least 32 pixels, got {config.data.image_size}.",
    )
    _require(
        config.training.num_train_steps > 0 or config.training.num_epochs > 0,
        "training.num_epochs",
        "set num_epochs > 0, or num_train_steps > 0.",
    )
    _require(
        0.0 <= config.training.label_smoothing < 1.0,
        "training.label_smoothing",
        f"must lie in [0, 1), got {config.training.label_smoothing}.",
    )
    _require(config.training.timing_warmup_steps >= -1, "training.timing_warmup_steps",
             "use -1 (one epoch), 0 (none) or a number of steps.")
    target = config.eval.target_top1
    _require(0.0 < target <= 1.0, "eval.target_top1",
             f"must lie in (0, 1] (0.76 the case study's, 0.759 MLPerf's), got {target}.")
    _require(config.optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0.")
    _require(0.0 <= config.optimizer.momentum < 1.0, "optimizer.momentum", "must lie in [0, 1).")
    _require(
        config.schedule.warmup_steps >= 0 or config.schedule.warmup_epochs >= 0,
        "schedule.warmup_epochs",
        "must be >= 0.",
    )
    _require(config.schedule.end_learning_rate >= 0, "schedule.end_learning_rate", "must be >= 0.")
    _require(config.schedule.decay_factor > 0, "schedule.decay_factor", "must be positive (0.1 decays 10x).")
    _require(config.schedule.polynomial_power > 0, "schedule.polynomial_power", "must be positive.")
    boundaries = list(config.schedule.boundary_epochs)
    _require(
        boundaries == sorted(boundaries) and all(b > 0 for b in boundaries),
        "schedule.boundary_epochs",
        f"must be positive and increasing, got {tuple(boundaries)}.",
    )
    _require(
        len(config.data.mean_rgb) == 3 and len(config.data.stddev_rgb) == 3,
        "data.mean_rgb",
        "mean_rgb and stddev_rgb need three values (R, G, B).",
    )
    _require(min(config.data.stddev_rgb) > 0, "data.stddev_rgb", "values must be positive.")
    _require(
        config.mesh.num_devices == -1 or config.mesh.num_devices > 0,
        "mesh.num_devices",
        "use -1 (all devices) or a positive count.",
    )
    if num_devices is not None:
        for field in ("training.global_batch_size", "eval.global_batch_size"):
            section, name = field.split(".")
            batch = config[section][name]
            if batch % num_devices:
                lower = max(num_devices, batch // num_devices * num_devices)
                _require(
                    False,
                    field,
                    f"{batch} is not divisible by the {num_devices} devices of the mesh; use a "
                    f"multiple of {num_devices} (for example {lower} or {lower + num_devices}).",
                )
