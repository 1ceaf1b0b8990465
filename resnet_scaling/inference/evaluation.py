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
import numpy as np
import optax

from resnet_scaling import checkpointing, models
from resnet_scaling import data as data_lib
from resnet_scaling.config import evaluation as evaluation_lib
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.job import workdir as workdir_lib
from resnet_scaling.training import sections as sections_lib
from resnet_scaling.training import steps, trainer

logger = logging.getLogger(__name__)

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
    config = evaluation_lib.evaluation_config(config, mesh.size, split=split, overrides=overrides,
                                              has_arrays=arrays is not None)
    batch = plan_lib.batch_plan_for_mesh(config, mesh)
    parts = sections_lib.read(config)
    source = data_lib.create_data_source(parts.data, mesh, _source_arrays(arrays), batch=batch,
                                         evaluation_only=True)
    if source.num_eval_examples == 0:
        raise data_lib.DataError(f"The evaluation split ({split_name(parts.data)}) holds no images.")
    state = replicated_state(models.model_from_config(parts.model), variables, mesh)
    eval_step = steps.jit_eval_step(state, mesh, parts.step)
    result = {"weights": weights, "split": split_name(parts.data), "step": step,
              **trainer.timed_evaluate(eval_step, state, source), "num_devices": mesh.size}
    if write and jax.process_index() == 0:
        path = workdir_lib.as_path(workdir) / f"eval_{weights}_{_file_safe(result['split'])}.json"
        workdir_lib.write_text_atomically(path, json.dumps(result, indent=2))
        result["path"] = str(path)
    return result


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


def split_name(data: data_lib.DataConfig) -> str:
    """The evaluated split: the TFDS split, or "eval" for the other sources' evaluation images."""
    return data.eval_split if data.source == "tfds" else "eval"


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
