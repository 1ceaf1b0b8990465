"""The config of an evaluation-only run (`evaluate_workdir`, `python -m resnet_scaling.evaluate`): a run's
saved config with the overrides an evaluation may make (where the images are, how they are batched; never
the model), sized for the devices at hand and validated."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import ml_collections

from resnet_scaling.config import ConfigError, set_field, validate

logger = logging.getLogger(__name__)

# Only where the images come from and how they are batched may differ from the run; the model is the run's.
OVERRIDABLE_SECTIONS = ("data", "eval")


def evaluation_config(config: ml_collections.ConfigDict, num_devices: int, *, split: str | None = None,
                      overrides: Mapping[str, Any] | None = None,
                      has_arrays: bool = False) -> ml_collections.ConfigDict:
    """A copy of a run's config, set up to evaluate on `num_devices` devices; validated.

    Raises:
      ConfigError: an override outside `data.*`/`eval.*` or of the wrong type, a split for a source
        that is not TFDS, or an arrays run evaluated without arrays.
    """
    config = ml_collections.ConfigDict(config.to_dict())
    if config.data.source == "arrays" and not has_arrays:
        raise ConfigError(
            "config.data.source: this run was trained on in-memory arrays, which a command line cannot "
            "pass; evaluate it from Python: evaluate_workdir(workdir, arrays=(eval_images, eval_labels)).")
    for field, value in (overrides or {}).items():
        _override(config, field, value)
    if split is not None:
        if config.data.source != "tfds":
            raise ConfigError(
                f"config.data.eval_split: a split applies to TFDS sources only; this run reads "
                f"{config.data.source!r} (override its location with data.folder or data.cache_dir).")
        config.data.eval_split = split
    eval_batch = config.eval.global_batch_size
    if eval_batch % num_devices:
        # The batch size changes how the split is cut, never the result; round it up to fit the mesh.
        config.eval.global_batch_size = -(-eval_batch // num_devices) * num_devices
        logger.info("Evaluation batch %d rounded up to %d for %d devices.", eval_batch,
                    config.eval.global_batch_size, num_devices)
    # Every source also sets up a training stream, never read here: sized to fit any mesh, without BN groups.
    config.training.global_batch_size = config.eval.global_batch_size
    config.model.bn_group_size = -1
    config.data.synthetic_num_batches = 1
    validate(config, num_devices)
    return config


def _override(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """Sets `config.<field>` (`data.*` or `eval.*`) to `value`, parsed from a string where it is one."""
    section, _, name = field.partition(".")
    if section not in OVERRIDABLE_SECTIONS or name not in config.get(section, {}):
        raise ConfigError(
            f"config.{field}: only existing data.* and eval.* fields can be overridden (the model is the "
            "run's), e.g. data.data_dir, data.folder or eval.global_batch_size.")
    set_field(config, field, value)
