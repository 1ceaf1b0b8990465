"""Evaluation only, from Python: `evaluate_workdir(workdir, weights="export"|"best", split=None)`, and the
command `python -m resnet_scaling.evaluate` (evaluate.py) that wraps it.

Loads a run's final or best parameters with its config, rebuilds its evaluation input and makes one exact
pass over the split (the last batch padded and masked), then writes `WORKDIR/eval_<weights>_<split>.json`.
A dataset that moved: `overrides={"data.data_dir": "/mnt/tfds"}`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from resnet_scaling import checkpointing, models
from resnet_scaling import config as config_lib
from resnet_scaling import data as data_lib
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.job import workdir as workdir_lib
from resnet_scaling.training import sections as sections_lib
from resnet_scaling.training import steps, trainer

logger = logging.getLogger(__name__)

# Only where the images come from and how they are batched may differ from the run; the model is the run's.
OVERRIDABLE_SECTIONS = ("data", "eval")


def evaluate_workdir(
    workdir: str,
    weights: str = "export",
    split: str | None = None,
    arrays: Sequence[np.ndarray] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    devices: Sequence[jax.Device] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Evaluates a run's exported or best parameters over its evaluation split, exactly.

    Args:
      workdir: the run's workdir (holding `export/` or evaluated checkpoints).
      weights: "export" (the final parameters) or "best" (those of the best evaluation).
      split: a TFDS split to evaluate instead of `config.data.eval_split` (TFDS sources only).
      arrays: for a run with `config.data.source == "arrays"`: `(eval_images, eval_labels)`, or the
        four arrays the run was trained with (only the last two are read).
      overrides: `{"data.field": value, "eval.field": value}` changes to the run's config, e.g. a moved
        `data.data_dir` or `data.folder`, or a smaller `eval.global_batch_size`.
      devices: devices to evaluate on (default: all of the job's); the result does not depend on them.
      write: write the result to `WORKDIR/eval_<weights>_<split>.json` (process 0 only).

    Returns:
      `weights`, `split`, `step` (of the best evaluation; None for export), `eval_top1`, `eval_top5`,
      `eval_loss`, `eval_count`, `eval_sec`, `num_devices` and, when written, `path`.

    Raises:
      FileNotFoundError: the workdir holds no such parameters.
      ConfigError: an override or split that does not apply, or an arrays run without `arrays`.
      DataError: a missing, unprepared or malformed dataset.
    """
    variables, config, step = checkpointing.load_weights(workdir, weights)
    mesh = mesh_lib.create_mesh(-1, list(devices) if devices is not None else None)
    config = evaluation_config(config, mesh.size, split=split, overrides=overrides,
                               has_arrays=arrays is not None)
    batch = plan_lib.batch_plan_for_mesh(config, mesh)
    parts = sections_lib.read(config)
    source = data_lib.create_data_source(parts.data, mesh, _source_arrays(arrays), batch=batch,
                                         evaluation_only=True)
    if source.num_eval_examples == 0:
        raise data_lib.DataError(f"The evaluation split ({split_name(config)}) holds no images.")
    state = replicated_state(models.model_from_config(parts.model), variables, mesh)
    eval_step = steps.jit_eval_step(state, mesh, parts.step)
    result = {"weights": weights, "split": split_name(config), "step": step,
              **trainer.timed_evaluate(eval_step, state, source), "num_devices": mesh.size}
    if write and jax.process_index() == 0:
        path = workdir_lib.as_path(workdir) / f"eval_{weights}_{_file_safe(result['split'])}.json"
        workdir_lib.write_text_atomically(path, json.dumps(result, indent=2))
        result["path"] = str(path)
    return result


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
        raise config_lib.ConfigError(
            "config.data.source: this run was trained on in-memory arrays, which a command line cannot "
            "pass; evaluate it from Python: evaluate_workdir(workdir, arrays=(eval_images, eval_labels)).")
    for field, value in (overrides or {}).items():
        _override(config, field, value)
    if split is not None:
        if config.data.source != "tfds":
            raise config_lib.ConfigError(
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
    config_lib.validate(config, num_devices)
    return config


def replicated_state(model: models.ResNet, variables: Mapping[str, Any],
                     mesh: jax.sharding.Mesh) -> steps.TrainState:
    """Loaded variables in a `TrainState` replicated on `mesh`: what `eval_step` takes (no optimizer)."""
    sharding = mesh_lib.replicated_sharding(mesh)

    def put(x):
        x = np.asarray(x)
        # From the host copy every process holds: works on meshes spanning several processes too.
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return steps.TrainState(step=put(np.int32(0)), apply_fn=model.apply,
                            params=jax.tree.map(put, variables["params"]), tx=optax.identity(),
                            opt_state=optax.EmptyState(),
                            batch_stats=jax.tree.map(put, variables["batch_stats"]))


def format_result(result: Mapping[str, Any]) -> str:
    """One line for a person: which parameters, which split, top-1, top-5, loss, images and time."""
    at_step = f" (step {result['step']})" if result.get("step") is not None else ""
    return (f"{result['weights']} parameters{at_step} on {result['split']}: top-1 {result['eval_top1']:.4f}, "
            f"top-5 {result['eval_top5']:.4f}, loss {result['eval_loss']:.4f} over "
            f"{int(result['eval_count'])} images ({result['eval_sec']:.1f}s)")


def split_name(config: ml_collections.ConfigDict) -> str:
    """The evaluated split: the TFDS split, or "eval" for the other sources' evaluation images."""
    return config.data.eval_split if config.data.source == "tfds" else "eval"


def _file_safe(name: str) -> str:
    """A split such as "validation[:10%]" as a file-name part ("validation_10")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "eval"


def _source_arrays(arrays: Sequence[np.ndarray] | None) -> tuple[np.ndarray, ...] | None:
    """The four arrays `ArraySource` takes; the evaluation arrays stand in for the unread training ones."""
    if arrays is None:
        return None
    if len(arrays) not in (2, 4):
        raise ValueError(f"arrays: pass (eval_images, eval_labels) or the run's four arrays, got "
                         f"{len(arrays)}.")
    images, labels = arrays[-2:]
    return images, labels, images, labels


def _override(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """Sets `config.<field>` (`data.*` or `eval.*`) to `value`, parsed from a string where it is one."""
    section, _, name = field.partition(".")
    if section not in OVERRIDABLE_SECTIONS or name not in config.get(section, {}):
        raise config_lib.ConfigError(
            f"config.{field}: only existing data.* and eval.* fields can be overridden (the model is the "
            "run's), e.g. data.data_dir, data.folder or eval.global_batch_size.")
    config_lib.set_field(config, field, value)
