"""Checkpoints with orbax: asynchronous saves, automatic resume, preemption, best and exported parameters.

Layout under the workdir:
  checkpoints/<step>/  the full train state plus `meta` (config fingerprint, clocks): the last K are kept.
  best/<step>/         parameters and BN statistics of the best evaluation so far (by top-1).
  export/              the final parameters and BN statistics with the config, for `load_exported`.

orbax writes each checkpoint into a temporary directory and renames it when complete, so a crash during
a save never leaves a half-written checkpoint as the latest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)

# Fields a resumed run must share with the run that wrote the checkpoint: they change the shapes or the
# structure of the state, or what the data stream's position means.
COMPATIBILITY_FIELDS = (
    "model.name",
    "model.num_classes",
    "model.num_filters",
    "model.compute_dtype",
    "optimizer.name",
    "training.global_batch_size",
    "data.source",
    "data.image_size",
    "seed",
)


class UnreadableCheckpointsError(RuntimeError):
    """The workdir held checkpoints and none can be read; the run refuses to start again from step 0."""


class IncompatibleCheckpointError(ValueError):
    """The workdir holds a checkpoint of another model or an incompatible config."""


def config_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The values of `COMPATIBILITY_FIELDS` in `config`."""
    fingerprint = {}
    for field in COMPATIBILITY_FIELDS:
        value: Any = config
        for part in field.split("."):
            value = value[part]
        fingerprint[field] = value
    return fingerprint


def check_compatible(saved: dict[str, Any], config: ml_collections.ConfigDict, directory: str) -> None:
    """Raises `IncompatibleCheckpointError` naming every field where `config` differs from `saved`."""
    current = config_fingerprint(config)
    differences = [f"{k}: checkpoint {saved[k]!r}, config {current[k]!r}"
                   for k in COMPATIBILITY_FIELDS if k in saved and saved[k] != current[k]]
    if differences:
        raise IncompatibleCheckpointError(
            f"The checkpoint in {directory} was written by an incompatible run ({'; '.join(differences)}). "
            "Use another --workdir, or set these fields back to resume it.")


class PreemptionWatcher:
    """Tells every process to stop at the same step after a SIGTERM (what TPU and spot VMs send).

    With several processes, jax's preemption sync point (set up by `jax.distributed.initialize`) picks
    a step that all processes reach; a single process installs its own SIGTERM handler.
    """

    def __init__(self) -> None:
        self._signalled = threading.Event()
        self._previous_handler = None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled.set()

    def reached(self, step: int) -> bool:
        """True at the step where every process should save and stop."""
        if jax.process_count() > 1:
            return ocp.utils.reached_preemption(step)
        return self._signalled.is_set()

    def close(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None


class Checkpointer:
    """Saves and restores the train state under `workdir`; one per run, created on every process."""

    def __init__(self, workdir: str, config: ml_collections.ConfigDict) -> None:
        c = config.checkpoint
        self._config = config
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=c.keep, enable_async_checkpointing=c.async_save, cleanup_tmp_directories=True,
                create=True),
            item_names=("state", "meta"),
        )
        self._best_manager = None
        if c.keep_best:
            self._best_manager = ocp.CheckpointManager(
                os.path.join(os.path.abspath(workdir), "best"),
                # Written only when an evaluation beats every earlier one, so the newest is the best.
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=1, enable_async_checkpointing=c.async_save, cleanup_tmp_directories=True,
                    create=True),
                item_names=("variables", "meta"),
            )
            self._best_top1 = self._saved_best_top1()
        self._export_directory = os.path.join(os.path.abspath(workdir), "export")

    def save(self, step: int, state: Any, clock: dict[str, float]) -> None:
        """Starts saving `state` at `step` (returns once the arrays are copied off the device)."""
        meta = {"step": int(step), "config": config_fingerprint(self._config), "clock": clock}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

    def _saved_best_top1(self) -> float:
        """Top-1 of the best evaluation saved by an earlier run in this workdir (-inf if none)."""
        step = self._best_manager.latest_step()
        if step is None:
            return float("-inf")
        try:
            meta = self._best_manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return float(meta["meta"]["eval"]["eval_top1"])
        except Exception as e:  # noqa: BLE001 - an unreadable best checkpoint is replaced by the next.
            logger.warning("Ignoring unreadable best checkpoint at step %d: %s", step, e)
            return float("-inf")

    def save_best(self, step: int, state: Any, eval_metrics: dict[str, float]) -> None:
        """Keeps the parameters of the best evaluation so far (by top-1) in `best/`; never those of an
        evaluation with a non-finite loss (a diverged state), which no later evaluation could displace."""
        if self._best_manager is None or eval_metrics["eval_top1"] <= self._best_top1:
            return
        if not np.isfinite(eval_metrics["eval_loss"]):
            logger.warning("Not keeping step %d as the best: its evaluation loss is %s.", step,
                           eval_metrics["eval_loss"])
            return
        self._best_top1 = float(eval_metrics["eval_top1"])
        variables = {"params": state.params, "batch_stats": state.batch_stats}
        meta = {"step": int(step), "config": self._config.to_dict(), "eval": eval_metrics}
        self._best_manager.save(step, args=ocp.args.Composite(
            variables=ocp.args.StandardSave(variables), meta=ocp.args.JsonSave(meta)), force=True)

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
        """Restores the newest complete, readable checkpoint into `abstract_state`'s shardings.

        Every process restores the same step (agreed by broadcasting process 0's choice), so that a
        multi-host restore cannot hang on processes that disagree. Unreadable checkpoints are skipped
        with a warning and the previous one is used. Returns None when there is no checkpoint.
        """
        steps = sorted(self._manager.all_steps(), reverse=True)
        for step in steps:
            step = int(multihost_utils.broadcast_one_to_all(np.int64(step)))
            try:
                meta = self._manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped the same way.
                self._quarantine(step, e)
                continue
            check_compatible(meta["config"], self._config, self.directory)
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state)))
            except Exception as e:  # noqa: BLE001
                self._quarantine(step, e)
                continue
            return restored["state"], meta
        quarantined = self.quarantined()
        if quarantined and not self._config.checkpoint.restart_from_scratch:
            # Checkpoints existed and none can be read: starting at step 0 would silently throw the run away.
            raise UnreadableCheckpointsError(
                f"No checkpoint of this workdir can be read: {len(quarantined)} unreadable one(s) are in "
                f"{os.path.dirname(quarantined[0])} ({', '.join(os.path.basename(q) for q in quarantined)}). "
                "To train from step 0 in this workdir anyway, pass --config.checkpoint.restart_from_scratch="
                "true; or use another --workdir.")
        return None

    def quarantined(self) -> list[str]:
        """The checkpoints moved to WORKDIR/unreadable_checkpoints/ (by this run or an earlier one)."""
        folder = os.path.join(os.path.dirname(self.directory), "unreadable_checkpoints")
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        return [os.path.join(folder, name) for name in names]

    def _quarantine(self, step: int, error: Exception) -> None:
        """Moves an unreadable checkpoint out of the way (kept for inspection), so the step can be redone."""
        target = os.path.join(os.path.dirname(self.directory), "unreadable_checkpoints",
                              f"{step}-{int(time.time())}")
        logger.warning("Skipping unreadable checkpoint %s/%d (moved to %s): %s", self.directory, step,
                       target, error)
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(os.path.join(self.directory, str(step)), target)
        multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.reload()

    def export(self, state: Any) -> str:
        """Writes the final parameters and BN statistics with the config to `export/` (synchronously).

        Raises:
          FloatingPointError: a parameter or statistic is NaN or infinite; nothing is exported.
        """
        variables = {"params": state.params, "batch_stats": state.batch_stats}
        finite = jax.tree.reduce(lambda ok, x: ok & jnp.all(jnp.isfinite(x)), variables, jnp.bool_(True))
        if not bool(finite):
            raise FloatingPointError("The final parameters hold NaN or infinite values: not exporting them; "
                                     f"the checkpoints in {self.directory} are unchanged.")
        checkpointer = ocp.StandardCheckpointer()
        path = os.path.join(self._export_directory, "variables")
        checkpointer.save(path, variables, force=True)
        checkpointer.wait_until_finished()
        if jax.process_index() == 0:
            with open(os.path.join(self._export_directory, "config.json"), "w", encoding="utf-8") as f:
                json.dump(self._config.to_dict(), f, indent=2, default=str)
        return self._export_directory

    def paths(self, exported: bool) -> dict[str, str]:
        """What this checkpointer writes, for the closing headline: checkpoints, best and exported weights."""
        paths = {"checkpoints": self.directory}
        if self._best_manager is not None and self._best_top1 > float("-inf"):  # Some evaluation saved.
            paths["best weights"] = str(self._best_manager.directory)
        if exported:
            paths["exported weights"] = self._export_directory
        return paths

    def wait(self) -> None:
        """Blocks until every started save is complete on disk."""
        self._manager.wait_until_finished()
        if self._best_manager is not None:
            self._best_manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self._manager.close()
        if self._best_manager is not None:
            self._best_manager.close()


def _restore_to_host(path: str) -> Any:
    """Restores a standard orbax checkpoint onto this process's first device, whatever topology wrote it."""
    checkpointer = ocp.StandardCheckpointer()
    metadata = checkpointer.metadata(path).item_metadata
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
    return jax.tree.map(np.asarray, checkpointer.restore(path, target))


def parameter_steps(directory: str) -> list[int]:
    """The numbered steps of a best/ directory that hold parameters, oldest first (none in a workdir's
    checkpoints/, whose steps hold full train states)."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(n) for n in names
                  if n.isdigit() and os.path.isdir(os.path.join(directory, n, "variables")))


def is_export_directory(path: str) -> bool:
    """An export/ directory: `variables/` and the run's `config.json` (a workdir has a config.json too)."""
    return (os.path.isdir(os.path.join(path, "variables"))
            and os.path.isfile(os.path.join(path, "config.json")))


def load_exported(path: str) -> tuple[dict[str, Any], ml_collections.ConfigDict]:
    """Loads parameters and BN statistics from a workdir, its `export/` or its `best/` directory.

    Args:
      path: a workdir (loads its `export/`), an `export/` directory, or a `best/` directory (loads the
        best evaluation's parameters).

    Returns:
      `(variables, config)`: NumPy `{'params': ..., 'batch_stats': ...}` for `model.apply` and the
      config of the run (over today's defaults, `config.config_from_saved`), from which
      `models.model_from_config(config)` rebuilds the model.
    """
    from resnet_scaling import config as config_lib  # The config module imports the data package.

    path = os.path.abspath(path)
    if is_export_directory(os.path.join(path, "export")):
        path = os.path.join(path, "export")
    if is_export_directory(path):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config_dict = json.load(f)
        variables_path = os.path.join(path, "variables")
    else:
        steps = parameter_steps(path)
        if not steps:
            raise FileNotFoundError(f"No exported or best parameters under {path}: expected a workdir, "
                                    "its export/ or its best/ directory.")
        with open(os.path.join(path, str(steps[-1]), "meta", "metadata"), encoding="utf-8") as f:
            config_dict = json.load(f)["config"]
        variables_path = os.path.join(path, str(steps[-1]), "variables")
    return dict(_restore_to_host(variables_path)), config_lib.config_from_saved(config_dict)
