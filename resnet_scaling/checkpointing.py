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
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from resnet_scaling.errors import RunError
from resnet_scaling.resilience import state_checks
from resnet_scaling.resilience import workdir as workdir_lib

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
    "data.dataset",
    "data.folder",
    "data.num_train_examples",
    "data.image_size",
    "seed",
)


# Fields a resumed run may change, though they change what the remaining steps do: a resume that changes
# them says so in its log and in WORKDIR/config_changes.jsonl.
NOTABLE_FIELDS_ON_RESUME = (
    "optimizer",
    "schedule",
    "training.num_train_steps",
    "training.num_examples",
    "training.num_epochs",
    "training.label_smoothing",
    "model.bn_group_size",
)


class UnreadableCheckpointsError(RunError, RuntimeError):
    """The workdir held checkpoints and none can be read; the run refuses to start again from step 0."""


class CorruptCheckpointError(RunError, ValueError):
    """A checkpoint's arrays do not match the fingerprints recorded when it was saved."""


class CheckpointSaveError(RunError, OSError):
    """A checkpoint could not be written (full disk, permissions); the message names the cause and the
    last complete checkpoint."""


class IncompatibleCheckpointError(RunError, ValueError):
    """The workdir holds a checkpoint of another model or an incompatible config."""


def where_to_resume(last_complete_step: int | None, directory: str) -> str:
    """The sentence that ends a failed run's message: the checkpoint the same command resumes from."""
    if last_complete_step is None:
        return f"No complete checkpoint is in {directory} yet."
    return (f"The last complete checkpoint is step {last_complete_step} in {directory}; run the same command "
            "to resume from it once the cause is fixed.")


# orbax writes this file into a step's folder once every item of the save is written: on a local disk just
# before renaming the folder into place, on gs:// (no renames there) as the save's last act.
COMMIT_MARKER = "commit_success.txt"


def complete_steps(workdir: str) -> list[int]:
    """The steps under WORKDIR/checkpoints whose save finished, oldest first, read from the directory
    without orbax.

    Why not through a read-only `ocp.CheckpointManager`: creating one starts JAX's backend (measured with
    orbax 0.12.8: 0.27 s, and libtpu's probe where it is installed), and these reads serve the checks a
    command makes in its first second, before a multi-process job joins (`jax.distributed.initialize` must
    come before any backend) and before any slow set-up.
    """
    directory = workdir_lib.as_path(workdir) / "checkpoints"
    names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
    return sorted(int(n) for n in names if n.isdigit() and (directory / n / COMMIT_MARKER).exists())


def config_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The values of `COMPATIBILITY_FIELDS` in `config`."""
    fingerprint = {}
    for field in COMPATIBILITY_FIELDS:
        value: Any = config
        for part in field.split("."):
            value = value[part]
        fingerprint[field] = value
    return fingerprint


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_on_resume(saved_config: dict[str, Any], config: ml_collections.ConfigDict) -> dict[str, Any]:
    """`{field: [checkpoint's value, config's value]}` for the `NOTABLE_FIELDS_ON_RESUME` that differ."""
    saved = _flatten(json.loads(json.dumps(saved_config, default=str)))
    current = _flatten(json.loads(config.to_json_best_effort()))
    notable = [k for k in current if any(k == f or k.startswith(f + ".") for f in NOTABLE_FIELDS_ON_RESUME)]
    return {k: [saved.get(k), current[k]] for k in notable if k in saved and saved[k] != current[k]}


def latest_saved_meta(workdir: str) -> dict[str, Any] | None:
    """The newest checkpoint's small JSON record (step, config, clocks), read without orbax or any device:
    what the cheap checks before a run's set-up need. None when there is none or it cannot be read."""
    directory = workdir_lib.as_path(workdir) / "checkpoints"
    for step in reversed(complete_steps(workdir)):
        try:
            return json.loads((directory / str(step) / "meta" / "metadata").read_text())
        except (OSError, ValueError):
            continue  # restore_latest will say what is wrong with it.
    return None


def check_compatible(saved: dict[str, Any], config: ml_collections.ConfigDict, directory: str) -> None:
    """Raises `IncompatibleCheckpointError` naming every field where `config` differs from `saved`."""
    current = config_fingerprint(config)
    differences = [f"{k}: checkpoint {saved[k]!r}, config {current[k]!r}"
                   for k in COMPATIBILITY_FIELDS if k in saved and saved[k] != current[k]]
    if differences:
        raise IncompatibleCheckpointError(
            f"The checkpoint in {directory} was written by an incompatible run ({'; '.join(differences)}). "
            "Use another --workdir, or set these fields back to resume it.")


def _barriers(name: str) -> ocp.options.MultiprocessingOptions:
    """Barrier names of their own for one kind of save.

    orbax names its cross-process barriers after the step (`async_write_complete.<step>`), so two
    managers saving the same step (evaluation, best/ and the regular checkpoint coinciding) would take
    each other's barriers: one process timed out while the other hung. A prefix per manager keeps them
    apart.
    """
    return ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=name)


class Checkpointer:
    """Saves and restores the train state under `workdir`; one per run, created on every process."""

    def __init__(self, workdir: str, config: ml_collections.ConfigDict) -> None:
        c = config.checkpoint
        self._config = config
        root = workdir_lib.as_path(workdir)
        self._workdir = workdir
        self.directory = str(root / "checkpoints")
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=c.keep, enable_async_checkpointing=c.async_save, cleanup_tmp_directories=True,
                create=True, multiprocessing_options=_barriers("checkpoints")),
            item_names=("state", "meta"),
        )
        self._best_manager = None
        if c.keep_best:
            self._best_manager = ocp.CheckpointManager(
                root / "best",
                # Written only when an evaluation beats every earlier one, so the newest is the best.
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=1, enable_async_checkpointing=c.async_save, cleanup_tmp_directories=True,
                    create=True, multiprocessing_options=_barriers("best")),
                item_names=("variables", "meta"),
            )
            self._best_top1 = self._saved_best_top1()
        self._export_directory = str(root / "export")
        self.last_started_step: int | None = None

    def save(self, step: int, state: Any, clock: dict[str, float]) -> None:
        """Starts saving `state` at `step` (returns once the arrays are copied off the device), with the
        fingerprint of every array (`state_checks`), verified on restore.

        Raises:
          CheckpointSaveError: an earlier background save failed, or this one could not start.
        """
        self.check_saves()
        if self.last_started_step is not None:
            # orbax's save() first waits for the previous one; a failure of that one is its own, not this
            # step's.
            try:
                self._manager.wait_until_finished()
            except Exception as e:  # noqa: BLE001
                raise self._save_error(self.last_started_step, e) from e
            self.check_saves()
        meta = {"step": int(step), "config": config_fingerprint(self._config), "clock": clock,
                "run_config": json.loads(self._config.to_json_best_effort()),
                "fingerprints": state_checks.fingerprint(state)}
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        except Exception as e:  # noqa: BLE001 - any failure to save ends the run with its cause named.
            raise self._save_error(step, e) from e
        self.last_started_step = step

    def check_saves(self) -> None:
        """Raises `CheckpointSaveError` if a background save has failed since the last check (a full disk,
        a revoked permission), so that a run never trains on for hours believing it is checkpointed."""
        for manager in (self._manager, self._best_manager):
            if manager is None:
                continue
            try:
                manager.check_for_errors()
            except Exception as e:  # noqa: BLE001
                raise self._save_error(self.last_started_step, e) from e

    def _save_error(self, step: int | None, error: Exception) -> CheckpointSaveError:
        # From the disk, not orbax's list: that may still hold the step whose save just failed.
        last = max(complete_steps(self._workdir), default=None)
        return CheckpointSaveError(f"Saving the checkpoint of step {step} failed: "
                                   f"{workdir_lib.describe_os_error(error)}. "
                                   f"{where_to_resume(last, self.directory)}")

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
                    state=ocp.args.StandardRestore(abstract_state)))["state"]
            except Exception as e:  # noqa: BLE001
                self._quarantine(step, e)
                continue
            if "fingerprints" in meta:  # Checkpoints of earlier versions have none.
                changed = state_checks.mismatched(meta["fingerprints"], state_checks.fingerprint(restored))
                if changed:
                    self._quarantine(step, CorruptCheckpointError(
                        f"{len(changed)} array(s) differ from what was saved ({', '.join(changed[:3])}"
                        f"{', ...' if len(changed) > 3 else ''}): the files were corrupted after the save"))
                    continue
            return restored, meta
        quarantined = self.quarantined()
        if quarantined and not self._config.checkpoint.restart_from_scratch:
            # Checkpoints existed and none can be read: starting at step 0 would silently throw the run away.
            names = ", ".join(epath.Path(q).name for q in quarantined)
            raise UnreadableCheckpointsError(
                f"No checkpoint of this workdir can be read: {len(quarantined)} unreadable one(s) are in "
                f"{epath.Path(quarantined[0]).parent} ({names}). "
                "To train from step 0 in this workdir anyway, pass --config.checkpoint.restart_from_scratch="
                "true; or use another --workdir.")
        return None

    def quarantined(self) -> list[str]:
        """The checkpoints moved to WORKDIR/unreadable_checkpoints/ (by this run or an earlier one)."""
        folder = epath.Path(self.directory).parent / "unreadable_checkpoints"
        names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        return [str(folder / name) for name in names]

    def _quarantine(self, step: int, error: Exception | str, folder: str = "unreadable_checkpoints") -> None:
        """Moves a checkpoint out of the way (kept for inspection), so the step can be redone."""
        target = epath.Path(self.directory).parent / folder / f"{step}-{int(time.time())}"
        logger.warning("Skipping checkpoint %s/%d (moved to %s): %s", self.directory, step, target,
                       error if isinstance(error, str) else describe_checkpoint_error(error))
        self._manager.wait_until_finished()
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            _move_tree(epath.Path(self.directory) / str(step), target)
        multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.reload()

    def discard_from(self, first_step: int, reason: str) -> int | None:
        """Moves every checkpoint of `first_step` or later to WORKDIR/diverged_checkpoints/ (a diverged
        run's); returns the newest checkpoint that is left, or None."""
        self._manager.wait_until_finished()
        for step in sorted(self._manager.all_steps()):
            if step >= first_step:
                self._quarantine(step, reason, folder="diverged_checkpoints")
        return self._manager.latest_step()

    def export(self, state: Any) -> str:
        """Writes the final parameters and BN statistics with the config to `export/` (synchronously).

        Raises:
          FloatingPointError: a parameter or statistic is NaN or infinite; nothing is exported.
        """
        variables = {"params": state.params, "batch_stats": state.batch_stats}
        if not state_checks.all_finite(variables):
            raise FloatingPointError("The final parameters hold NaN or infinite values: not exporting them; "
                                     f"the checkpoints in {self.directory} are unchanged.")
        checkpointer = ocp.StandardCheckpointer(multiprocessing_options=_barriers("export"))
        path = epath.Path(self._export_directory) / "variables"
        checkpointer.save(path, variables, force=True)
        checkpointer.wait_until_finished()
        if jax.process_index() == 0:
            workdir_lib.write_text_atomically(epath.Path(self._export_directory) / "config.json",
                                              json.dumps(self._config.to_dict(), indent=2, default=str))
        return self._export_directory

    def committed_step(self) -> int | None:
        """The newest checkpoint known complete on disk, or None while a save is still being written (the
        newest step listed may be that one)."""
        if self._manager.is_saving_in_progress():
            return None
        return self._manager.latest_step()

    def has_export(self) -> bool:
        """Whether `export/` holds parameters and a config (from this run or an earlier launch)."""
        return is_export_directory(self._export_directory)

    def paths(self, exported: bool) -> dict[str, str]:
        """What this checkpointer writes, for the closing headline: checkpoints, best and exported weights."""
        paths = {"checkpoints": self.directory}
        if self._best_manager is not None and self._best_top1 > float("-inf"):  # Some evaluation saved.
            paths["best weights"] = str(self._best_manager.directory)
        if exported:
            paths["exported weights"] = self._export_directory
        return paths

    def wait(self) -> None:
        """Blocks until every started save is complete on disk.

        Raises:
          CheckpointSaveError: a save under way failed (orbax re-raises its writer's error here).
        """
        for manager in (self._manager, self._best_manager):
            if manager is None:
                continue
            try:
                manager.wait_until_finished()
            except Exception as e:  # noqa: BLE001 - named like any other failed save.
                raise self._save_error(self.last_started_step, e) from e

    def close(self) -> None:
        self.wait()
        self._manager.close()
        if self._best_manager is not None:
            self._best_manager.close()


def _move_tree(source: epath.Path, target: epath.Path) -> None:
    """Moves a directory: a rename on a local disk; object by object on an object store (no renames)."""
    if "://" not in os.fspath(source):
        os.replace(source, target)
        return
    for item in list(source.iterdir()):
        if item.is_dir():
            _move_tree(item, target / item.name)
        else:
            target.mkdir(parents=True, exist_ok=True)
            item.copy(target / item.name, overwrite=True)
            item.unlink()
    source.rmtree(missing_ok=True)


# TensorStore's status codes in an error, and what they mean for a checkpoint's files. OUT_OF_RANGE: a
# read past the end of a file (one cut short).
_TENSORSTORE_CAUSES = {"DATA_LOSS": "a file is truncated or corrupt", "OUT_OF_RANGE": "a file is truncated",
                       "NOT_FOUND": "a file is missing",
                       "PERMISSION_DENIED": "a file cannot be read (permissions)"}


def describe_checkpoint_error(error: BaseException) -> str:
    """A one-line cause for a checkpoint that cannot be read, instead of TensorStore's many-line dump:
    what the status code along the exception's chain means, then the innermost error's first line (orbax's
    own message points at a "details" repr that says nothing)."""
    chain, current = [], error
    while current is not None and current not in chain and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or current.__context__
    cause = next((meaning for e in chain for code, meaning in _TENSORSTORE_CAUSES.items() if code in str(e)),
                 None)
    innermost = chain[-1]
    text = str(innermost).split(" See full TensorStore details:")[0]
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), type(innermost).__name__)
    first_line = first_line if len(first_line) <= 200 else first_line[:200] + "..."
    described = f"{type(innermost).__name__}: {first_line}"
    return f"{cause} ({described})" if cause else described


def _restore_to_host(path: str) -> Any:
    """Restores a standard orbax checkpoint onto this process's first device, whatever topology wrote it.

    Through the item's handler, not a `Checkpointer`: a best/ step's `variables/` is one item of a
    manager's step, whose step metadata lies a level up, and a Checkpointer pointed at the item warns
    "Metadata file does not exist" on every load."""
    path = epath.Path(path)
    handler = ocp.StandardCheckpointHandler()
    try:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                              handler.metadata(path))
        return jax.tree.map(np.asarray, handler.restore(path, args=ocp.args.StandardRestore(target)))
    finally:
        handler.close()


def parameter_steps(directory: str) -> list[int]:
    """The numbered steps of a best/ directory that hold parameters, oldest first (none in a workdir's
    checkpoints/, whose steps hold full train states)."""
    directory = epath.Path(directory)
    names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
    return sorted(int(n) for n in names if n.isdigit() and (directory / n / "variables").is_dir())


def is_export_directory(path: str) -> bool:
    """An export/ directory: `variables/` and the run's `config.json` (a workdir has a config.json too)."""
    path = epath.Path(path)
    return (path / "variables").is_dir() and (path / "config.json").is_file()


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

    path = workdir_lib.as_path(path)
    if is_export_directory(path / "export"):
        path = path / "export"
    if is_export_directory(path):
        config_dict = json.loads((path / "config.json").read_text())
        variables_path = path / "variables"
    else:
        steps = parameter_steps(path)
        if not steps:
            raise FileNotFoundError(f"No exported or best parameters under {path}: expected a workdir, "
                                    "its export/ or its best/ directory.")
        config_dict = json.loads((path / str(steps[-1]) / "meta" / "metadata").read_text())["config"]
        variables_path = path / str(steps[-1]) / "variables"
    return dict(_restore_to_host(variables_path)), config_lib.config_from_saved(config_dict)
