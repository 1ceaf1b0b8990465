"""What the config's fields may hold: the values each choice field accepts and the fields that set each
duration. `config.validate` checks a config against them; the modules that read those fields (models,
optim, data, plan, the MLPerf log) import them from here, so that config.py imports none of its readers.

Imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import ml_collections

# `model.name`: the keys of `models.ARCHITECTURES`, in its order; `model.compute_dtype`: of `models.DTYPES`.
MODEL_NAMES = ("resnet_tiny", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet200")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
# `model.lowering`: "cpu" uses `cpu_lowering`'s forms, which XLA:CPU runs faster; "xla" uses `nn.Conv` and
# `nn.max_pool`, which TPU and GPU backends map onto their convolution units and cuDNN; "auto" picks "cpu"
# on CPUs, "xla" elsewhere. Both have the same parameters and outputs.
LOWERINGS = ("auto", "cpu", "xla")

# `data.source`: see `data.create_data_source`. `data.resize_method`: `tf.image.resize` methods.
DATA_SOURCES = ("tfds", "folders", "shapes", "synthetic", "arrays")
RESIZE_METHODS = ("bilinear", "bicubic", "area")

# `optimizer.name`, `.lars_variant`, `.weight_decay_on` and `schedule.name` (optim.py).
OPTIMIZERS = ("sgd", "lars", "optax_lars")
LARS_VARIANTS = ("reference", "tf1.12")
WEIGHT_DECAY_LEAVES = ("kernels", "non_batchnorm")
SCHEDULES = ("cosine", "polynomial", "piecewise", "constant")
# `optimizer.lr_scaling`: how the peak learning rate follows the global batch: "linear" (Goyal et al.) or
# "none" (LARS recipes).
LR_SCALINGS = ("linear", "none")

# `mlperf.submission_division` and `.submission_status`: the values MLPerf's checker accepts (mllog's
# constants CLOSED, OPEN; CLOUD, ONPREM, RESEARCH, and "preview").
SUBMISSION_DIVISIONS = ("closed", "open")
SUBMISSION_STATUSES = ("cloud", "onprem", "preview", "research")


Rounding = Literal["up", "down", "nearest", "interval"]


@dataclasses.dataclass(frozen=True)
class Duration:
    """Where one duration of a run is set (its steps, examples and epochs fields) and how it rounds.

    The first field set (not None) wins, in that order: `--config.training.num_train_steps` on the command
    line overrides the file's `num_epochs`. Rounding of examples and epochs to steps (`plan.duration_steps`):
      "up": the run's length, at least what was asked (the case study's 91 epochs: 113,854 steps at 1024).
      "down": the warm-up, as tensorflow/tpu's `warmup_epochs * examples // batch` (5 epochs: 6,255 steps at
        1024; the schedule also keeps the fractional length).
      "nearest": points within a run (the 1-epoch timing warm-up: 1,251 steps at 1024, 39 at 32768).
      "interval": every-N; positive is at least 1 step, 0 or less (in steps too) is 0 ("only at the end").
    """

    section: str
    steps: str
    examples: str
    epochs: str
    rounding: Rounding

    def fields(self) -> tuple[str, str, str]:
        """The three fields as "section.name"."""
        return tuple(f"{self.section}.{name}" for name in (self.steps, self.examples, self.epochs))


TRAINING_LENGTH = Duration("training", "num_train_steps", "num_examples", "num_epochs", "up")
WARMUP = Duration("schedule", "warmup_steps", "warmup_examples", "warmup_epochs", "down")
EVAL_INTERVAL = Duration("eval", "every_steps", "every_examples", "every_epochs", "interval")
CHECKPOINT_INTERVAL = Duration("checkpoint", "every_steps", "every_examples", "every_epochs", "interval")
TIMING_WARMUP = Duration("training", "timing_warmup_steps", "timing_warmup_examples", "timing_warmup_epochs",
                         "nearest")
DURATIONS = (TRAINING_LENGTH, WARMUP, EVAL_INTERVAL, CHECKPOINT_INTERVAL, TIMING_WARMUP)


def set_duration_field(config: ml_collections.ConfigDict, duration: Duration) -> str | None:
    """The "section.name" of the field that sets `duration` in `config`, or None if none is set."""
    section = config[duration.section]
    for name in (duration.steps, duration.examples, duration.epochs):
        if section[name] is not None:
            return f"{duration.section}.{name}"
    return None
