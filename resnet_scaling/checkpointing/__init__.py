"""Checkpoints with orbax: asynchronous saves, automatic resume, preemption, best and exported parameters;
and the guards that decide what is saved and when.

| module | job |
|---|---|
| `__init__.py` | the `Checkpointer` (one orbax manager), resume, exported and best parameters, class names |
| `state_checks.py` | content fingerprints of a saved state (checked on restore); its health before a save |
| `divergence.py` | no checkpoint holds a diverged state; the error names the newest sound one |
| `preemption.py` | SIGTERM and Ctrl-C: every process stops at the same step, so the run saves and ends |

What a workdir holds:

  checkpoints/<step>/  the train state, `meta` (config, clocks, array fingerprints) and `metrics` (the
                       step's evaluation), in one `CheckpointManager` that keeps the newest `checkpoint.keep`
                       and the best evaluation by top-1.
  export/              the final parameters and BN statistics with the config (`load_exported`), and
                       `class_names.json` where the data names its classes.
  class_names.json     the same names beside the checkpoints (a copied export/ keeps its own).

A save is renamed into place (or committed, on gs://) only when complete.
"""

from __future__ import annotations

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).

import dataclasses
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util
from jax.experimental import multihost_utils
from orbax.checkpoint._src.metadata import array_metadata_store  # As orbax's default handler.

from resnet_scaling import config as config_lib
from resnet_scaling.checkpointing import state_checks
from resnet_scaling.job import workdir as workdir_lib
from resnet_scaling.job.errors import RunError

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


# Label i's name at i, as a JSON list: in export/ and in the workdir (for its checkpoints).
CLASS_NAMES_FILENAME = "class_names.json"


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


def complete_steps(workdir: str) -> list[int]:
    """The steps under WORKDIR/checkpoints whose save finished, oldest first, as orbax reads its folder.

    Not through a `CheckpointManager`: creating one starts JAX's backend (orbax 0.12.8: 0.27 s, and libtpu's
    probe), and these reads come before a multi-process job joins, which must precede any backend.
    """
    return sorted(ocp.step.checkpoint_steps(workdir_lib.as_path(workdir) / "checkpoints"))


def _read_meta(step_directory: epath.Path) -> dict[str, Any]:
    """A checkpoint's `meta` item (orbax's JSON handler; no manager, no device)."""
    return ocp.JsonCheckpointHandler().restore(step_directory / "meta")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """What `config.checkpoint` asks of the `Checkpointer` (`sections.read`); when to save is the
    `plan.LoopSchedule`'s."""

    enabled: bool = True
    keep: int = 3  # Newest full checkpoints kept.
    keep_best: bool = True  # Also keep the best evaluation's checkpoint.
    async_save: bool = True
    export: bool = True  # The final parameters to WORKDIR/export at the end.
    restart_from_scratch: bool = False  # Train from step 0 where no checkpoint of the workdir can be read.


def config_fingerprint(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The values of `COMPATIBILITY_FIELDS` in a run's config (its JSON values, `sections.record`)."""
    flat = traverse_util.flatten_dict(dict(run_config), sep=".")
    return {field: flat.get(field) for field in COMPATIBILITY_FIELDS}


def changed_on_resume(saved_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> dict[str, Any]:
    """`{field: [checkpoint's value, config's value]}` for the `NOTABLE_FIELDS_ON_RESUME` that differ
    (both configs as JSON values, `sections.record`)."""
    saved = traverse_util.flatten_dict(json.loads(json.dumps(saved_config, default=str)), sep=".")
    current = traverse_util.flatten_dict(json.loads(json.dumps(run_config, default=str)), sep=".")
    notable = [k for k in current if any(k == f or k.startswith(f + ".") for f in NOTABLE_FIELDS_ON_RESUME)]
    return {k: [saved.get(k), current[k]] for k in notable if k in saved and saved[k] != current[k]}


def latest_saved_meta(workdir: str) -> dict[str, Any] | None:
    """The newest readable checkpoint's `meta` (step, config, clocks), read without a device; else None."""
    directory = workdir_lib.as_path(workdir) / "checkpoints"
    for step in reversed(complete_steps(workdir)):
        try:
            return _read_meta(directory / str(step))
        except Exception:  # noqa: BLE001 - restore_latest will say what is wrong with it.
            continue
    return None


def check_compatible(saved: dict[str, Any], run_config: Mapping[str, Any], directory: str) -> None:
    """Raises `IncompatibleCheckpointError` naming every field where `run_config` (JSON values,
    `sections.record`) differs from the checkpoint's fingerprint `saved`."""
    current = config_fingerprint(run_config)
    differences = [f"{k}: checkpoint {saved[k]!r}, config {current[k]!r}"
                   for k in COMPATIBILITY_FIELDS if k in saved and saved[k] != current[k]]
    if differences:
        raise IncompatibleCheckpointError(
            f"The checkpoint in {directory} was written by an incompatible run ({'; '.join(differences)}). "
            "Use another --workdir, or set these fields back to resume it.")


def best_metric(metrics: dict[str, Any]) -> float:
    """What orbax ranks checkpoints by: the evaluation's top-1; -inf (never best) without an evaluation or
    with a non-finite loss (a diverged state no later evaluation could displace)."""
    if not math.isfinite(metrics.get("eval_loss", math.nan)):
        return -math.inf
    return float(metrics["eval_top1"])


def _manager_options(c: CheckpointConfig | None = None) -> ocp.CheckpointManagerOptions:
    """A run's manager options or, for `c=None`, a reader's (not orbax's `read_only`, which warns twice
    at every creation). `best_fn` makes orbax keep each step's metrics, so a relaunch still knows the best."""
    if c is None:
        return ocp.CheckpointManagerOptions(create=False, best_fn=best_metric)
    policies = [ocp.checkpoint_managers.LatestN(n=c.keep)]
    if c.keep_best:
        policies.append(ocp.checkpoint_managers.BestN(get_metric_fn=best_metric, n=1,
                                                      keep_checkpoints_without_metrics=False))
    return ocp.CheckpointManagerOptions(
        best_fn=best_metric, preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
        enable_async_checkpointing=c.async_save, cleanup_tmp_directories=True, create=True)


# orbax writes an array that every replica holds (this data-parallel state) in slices, one per replica, so
# that the replicas' hosts share the writing. Below this many bytes a slice costs more than it shares: a
# device slice each (compiled per device and shape at the first save), a transfer and a file chunk each;
# a BN vector split over 8 or 256 replicas gives slices of a few bytes. Smaller arrays are written whole by
# the first replica.
MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL = 2**20


def _state_handler(multiprocessing_options: ocp.options.MultiprocessingOptions | None = None
                   ) -> ocp.PyTreeCheckpointHandler:
    """The handler of a train state or exported variables (what `StandardCheckpointHandler` is, with
    replica-parallel writes only for slices of `MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL` or more)."""
    handlers = ocp.type_handlers
    # orbax's default registry (`type_handler_registry._DEFAULT_TYPE_HANDLERS`) with the size gate added.
    registry = handlers.create_type_handler_registry(
        *((ty, handlers.ScalarHandler()) for ty in (int, float, bytes, np.number)),
        (np.ndarray, handlers.NumpyHandler()),
        (jax.Array, handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL,
            array_metadata_store=array_metadata_store.Store())),
        (str, handlers.StringHandler()))
    return ocp.PyTreeCheckpointHandler(
        multiprocessing_options=multiprocessing_options or ocp.options.MultiprocessingOptions(),
        type_handler_registry=registry)


def _restore_args(abstract_state: Any) -> ocp.args.PyTreeRestore:
    """Restores into `abstract_state`'s shapes, dtypes and shardings."""
    return ocp.args.PyTreeRestore(abstract_state,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))


def best_step(workdir: str) -> int | None:
    """The kept checkpoint with the best evaluated top-1 (the later on a tie), or None."""
    directory = workdir_lib.as_path(workdir) / "checkpoints"
    if not directory.is_dir():
        return None
    manager = ocp.CheckpointManager(directory, options=_manager_options())
    try:
        return _evaluated_best(manager)
    finally:
        manager.close()


def _evaluated_best(manager: ocp.CheckpointManager) -> int | None:
    step = manager.best_step()
    if step is None or best_metric(manager.metrics(step) or {}) == -math.inf:
        return None
    return step


class Checkpointer:
    """Saves and restores the train state under `workdir`; one per run, created on every process."""

    def __init__(self, workdir: str, options: CheckpointConfig, run_config: Mapping[str, Any],
                 class_names: Sequence[str] | None = None) -> None:
        """
        Args:
          options: `config.checkpoint`'s section.
          run_config: the run's whole config as JSON values (`sections.record`): each checkpoint keeps it,
            with the fingerprint of its `COMPATIBILITY_FIELDS`, and the export beside the parameters.
          class_names: label i's name at i (the data source's), exported with the parameters; None: unnamed.
        """
        self._options, self._run_config = options, run_config
        self._class_names = class_names
        root = workdir_lib.as_path(workdir)
        self._workdir = workdir
        self.directory = str(root / "checkpoints")
        self._manager = ocp.CheckpointManager(
            self.directory, options=_manager_options(options),
            item_handlers={"state": _state_handler(), "meta": ocp.JsonCheckpointHandler()})
        self._export_directory = str(root / "export")
        self.last_started_step: int | None = None

    def save(self, step: int, state: Any, clock: dict[str, float],
             eval_metrics: dict[str, float] | None = None, *, evaluation_pending: bool = False) -> None:
        """Starts saving `state` at `step` (returns once the arrays are off the device), with each array's
        fingerprint (verified on restore) and the step's evaluation (which ranks the best). When to save
        is the caller's to decide (`plan.LoopSchedule.is_save_step`). `evaluation_pending`: the step's
        evaluation was abandoned (a stop came in); the resumed run makes it first.

        Raises:
          CheckpointSaveError: an earlier background save failed, or this one could not start.
        """
        self.check_saves()
        if self.last_started_step is not None:
            self.wait()  # orbax's save() first waits for the previous one: name its failure as its own.
            self.check_saves()
        meta = {"step": int(step), "config": config_fingerprint(self._run_config), "clock": clock,
                "run_config": self._run_config,
                "fingerprints": state_checks.fingerprint(state), "evaluation_pending": evaluation_pending}
        # Empty metrics rank as never best (`best_metric`); none at all would make orbax warn at every save.
        evaluated = eval_metrics if self._options.keep_best else None
        metrics = {k: float(v) for k, v in (evaluated or {}).items() if k in ("eval_top1", "eval_loss")}
        # force: the run's `plan.LoopSchedule` decided to save. orbax's save-decision policies cover the
        # interval, but not the last step or each evaluation, and their preemption policy reads only JAX's
        # multi-process sync point, not a single process's SIGTERM: they would save other steps.
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeSave(state), meta=ocp.args.JsonSave(meta)),
                metrics=metrics, force=True)
        except Exception as e:  # noqa: BLE001 - any failure to save ends the run with its cause named.
            raise self._save_error(step, e) from e
        self.last_started_step = step

    def check_saves(self) -> None:
        """Raises `CheckpointSaveError` if a background save has failed (full disk, permissions), so that a
        run never trains on for hours believing it is checkpointed."""
        try:
            self._manager.check_for_errors()
        except Exception as e:  # noqa: BLE001
            raise self._save_error(self.last_started_step, e) from e

    def _save_error(self, step: int | None, error: Exception) -> CheckpointSaveError:
        # From the disk, not orbax's list: that may still hold the step whose save just failed.
        last = max(complete_steps(self._workdir), default=None)
        return CheckpointSaveError(f"Saving the checkpoint of step {step} failed: "
                                   f"{workdir_lib.describe_os_error(error)}. "
                                   f"{where_to_resume(last, self.directory)}")

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
        """Restores the newest readable checkpoint into `abstract_state`'s shardings; None if there is none.

        Every process restores process 0's choice of step (processes that disagree would hang). Unreadable
        checkpoints are set aside with a warning and the previous one is tried.
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
            check_compatible(meta["config"], self._run_config, self.directory)
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=_restore_args(abstract_state)))["state"]
            except Exception as e:  # noqa: BLE001
                self._quarantine(step, e)
                continue
            changed = state_checks.mismatched(meta["fingerprints"], state_checks.fingerprint(restored))
            if changed:
                self._quarantine(step, CorruptCheckpointError(
                    f"{len(changed)} array(s) differ from what was saved ({', '.join(changed[:3])}"
                    f"{', ...' if len(changed) > 3 else ''}): the files were corrupted after the save"))
                continue
            return restored, meta
        quarantined = self.quarantined()
        if quarantined and not self._options.restart_from_scratch:
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
        """Writes the final parameters and BN statistics with the config and the class names to `export/`
        (synchronously).

        Raises:
          FloatingPointError: a value is NaN or infinite; nothing is exported.
        """
        variables = {"params": state.params, "batch_stats": state.batch_stats}
        if not state_checks.all_finite(variables):
            raise FloatingPointError("The final parameters hold NaN or infinite values: not exporting them; "
                                     f"the checkpoints in {self.directory} are unchanged.")
        # Barriers of its own: the final checkpoint's save, whose barriers are named after the same step, may
        # still be under way (two processes then took each other's barriers: one timed out, one hung).
        options = ocp.options.MultiprocessingOptions(barrier_sync_key_prefix="export")
        checkpointer = ocp.AsyncCheckpointer(_state_handler(options), multiprocessing_options=options)
        path = epath.Path(self._export_directory) / "variables"
        checkpointer.save(path, args=ocp.args.PyTreeSave(variables), force=True)
        checkpointer.wait_until_finished()
        if jax.process_index() == 0:
            write_class_names(self._export_directory, self._class_names)
            workdir_lib.write_text_atomically(epath.Path(self._export_directory) / "config.json",
                                              json.dumps(self._run_config, indent=2, default=str))
        return self._export_directory

    def has_export(self) -> bool:
        """Whether `export/` holds parameters and a config (from this run or an earlier launch)."""
        return is_export_directory(self._export_directory)

    def paths(self, exported: bool) -> dict[str, str]:
        """Where the checkpoints, best and exported weights are, for the closing headline."""
        self.wait()  # The headline names complete checkpoints only.
        paths = {"checkpoints": self.directory}
        if self._options.keep_best and (best := _evaluated_best(self._manager)) is not None:
            paths["best weights"] = str(epath.Path(self.directory) / str(best))
        if exported:
            paths["exported weights"] = self._export_directory
        return paths

    def wait(self) -> None:
        """Blocks until every started save is complete; `CheckpointSaveError` if one failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - named like any other failed save.
            raise self._save_error(self.last_started_step, e) from e

    def close(self) -> None:
        self.wait()
        self._manager.close()


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
    """A one-line cause for an unreadable checkpoint instead of TensorStore's many-line dump: the meaning of
    the status code along the exception's chain, then the innermost error's first line."""
    chain = list(itertools.islice(workdir_lib.exception_chain(error), 20))
    cause = next((meaning for e in chain for code, meaning in _TENSORSTORE_CAUSES.items() if code in str(e)),
                 None)
    innermost = chain[-1]
    text = str(innermost).split(" See full TensorStore details:")[0]
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), type(innermost).__name__)
    first_line = first_line if len(first_line) <= 200 else first_line[:200] + "..."
    described = f"{type(innermost).__name__}: {first_line}"
    return f"{cause} ({described})" if cause else described


def _restore_to_host(path: epath.Path) -> dict[str, Any]:
    """The parameters and BN statistics of a checkpoint item (a train state, an export's variables) as NumPy,
    whatever topology wrote it, the optimizer state left on disk.

    Through the item's handler: a `Checkpointer` pointed inside a manager's step warns "Metadata file does
    not exist" at every load."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        saved = handler.metadata(path).tree
        target = {k: jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved[k])
                  for k in ("params", "batch_stats")}
        restored = handler.restore(path, args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True))
        return jax.tree.map(np.asarray, restored)
    finally:
        handler.close()


def is_export_directory(path: str) -> bool:
    """An export/ directory: `variables/` and the run's `config.json` (a workdir has a config.json too)."""
    path = epath.Path(path)
    return (path / "variables").is_dir() and (path / "config.json").is_file()


def _is_checkpoint(path: epath.Path) -> bool:
    return path.name.isdigit() and (path / "state").is_dir() and (path / "meta").is_dir()


def best_weights(workdir: str) -> epath.Path | None:
    """A workdir's best evaluation's checkpoint (`best_step`), or None."""
    step = best_step(workdir)
    return None if step is None else workdir_lib.as_path(workdir) / "checkpoints" / str(step)


WEIGHTS = workdir_lib.WEIGHTS


def write_class_names(directory: str | os.PathLike[str], class_names: Sequence[str] | None) -> None:
    """Writes `directory/class_names.json` (label i's name at i); None removes one an earlier launch left.
    One process writes (the caller decides which)."""
    path = workdir_lib.as_path(directory) / CLASS_NAMES_FILENAME
    if class_names is None:
        path.unlink(missing_ok=True)
        return
    workdir_lib.write_text_atomically(path, json.dumps(list(class_names), indent=1) + "\n")


def read_class_names(directory: str | os.PathLike[str]) -> list[str] | None:
    """The names `write_class_names` left in `directory`; None where there are none (unnamed data, a run
    saved before names were) or the file is damaged (with a warning: the parameters are usable without)."""
    path = workdir_lib.as_path(directory) / CLASS_NAMES_FILENAME
    try:
        names = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # Unreadable, or not JSON (UnicodeDecodeError is a ValueError).
        logger.warning("%s cannot be read (%s): predictions stay unnamed.", path, e)
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        logger.warning("%s is not a list of names: predictions stay unnamed.", path)
        return None
    return names


def _find_weights(path: str, weights: str
                  ) -> tuple[epath.Path, dict[str, Any], int | None, epath.Path | None]:
    """Where saved parameters are: `(variables directory, the run's saved config, step, the directory
    holding the weights' class names)` (step None for an export; the directory None: nowhere to look).

    An export holds its own class names; a checkpoint's are its workdir's (checkpoints need no copy each),
    looked for only where the checkpoint still sits in a workdir's checkpoints/.

    `path` and `weights` as `load_exported` takes them.

    Raises:
      FileNotFoundError: no such parameters, saying what writes them.
      ValueError: `weights` is not one of `WEIGHTS`.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}.")
    path = workdir_lib.as_path(path)
    if is_export_directory(path):
        return path / "variables", json.loads((path / "config.json").read_text()), None, path
    if _is_checkpoint(path):
        workdir = path.parent.parent if path.parent.name == "checkpoints" else None
        return path / "state", _read_meta(path)["run_config"], int(path.name), workdir
    if not path.is_dir():
        raise FileNotFoundError(f"No workdir, export/ or checkpoint at {path}.")
    if path.name == "checkpoints" and any(_is_checkpoint(p) for p in path.iterdir()):
        raise FileNotFoundError(f"{path} is a run's checkpoints/ folder: give the run's workdir "
                                f"({path.parent}) or one of the checkpoints in it ({path}/<step>).")
    if weights == "best":
        if (best := best_weights(str(path))) is None:
            raise FileNotFoundError(
                f"{path} has no evaluated checkpoint for the best parameters: a run keeps its best "
                "evaluation's checkpoint in checkpoints/ (config.checkpoint.keep_best). Use the final "
                "parameters (--weights=export).")
        return _find_weights(str(best), weights)
    if not is_export_directory(path / "export"):
        raise FileNotFoundError(
            f"{path} has no export/: a run writes it when it finishes (config.checkpoint.export). Use the "
            "best evaluation's parameters (--weights=best) or finish the run.")
    return _find_weights(str(path / "export"), weights)


def load_exported(path: str, weights: str = "export"
                  ) -> tuple[dict[str, Any], ml_collections.ConfigDict]:
    """Loads parameters and BN statistics with the run's config.

    Args:
      path: a workdir, or its `export/` or one of its checkpoints (then `weights` chooses nothing).
      weights: a workdir's "export" (the final parameters) or "best" (the best evaluation's checkpoint).

    Returns:
      `(variables, config)`: NumPy `{'params': ..., 'batch_stats': ...}` for `model.apply`, and the run's
      config over today's defaults, from which `models.model_from_config(config)` rebuilds the model.
    """
    variables, config, _ = load_weights(path, weights)
    return variables, config


def load_weights(path: str, weights: str = "export"
                 ) -> tuple[dict[str, Any], ml_collections.ConfigDict, int | None]:
    """`load_exported`'s `(variables, config)` and the step of the checkpoint read (None for an export)."""
    saved = load_saved_weights(path, weights)
    return saved.variables, saved.config, saved.step


@dataclasses.dataclass(frozen=True)
class SavedWeights:
    """A run's saved parameters with what it takes to use them and to name their predictions."""

    variables: dict[str, Any]  # NumPy {'params': ..., 'batch_stats': ...}, for `model.apply`.
    config: ml_collections.ConfigDict  # The run's config over today's defaults (`load_exported`).
    step: int | None  # The checkpoint's step; None for an export.
    class_names: list[str] | None  # Label i's name at i; None: unnamed data, or saved before names were.


def load_saved_weights(path: str, weights: str = "export") -> SavedWeights:
    """Loads parameters, config, step and class names at once; `path`, `weights` as `load_exported` takes."""
    variables_path, config_dict, step, names_directory = _find_weights(path, weights)
    class_names = read_class_names(names_directory) if names_directory is not None else None
    return SavedWeights(_restore_to_host(variables_path), config_lib.config_from_saved(config_dict), step,
                        class_names)
