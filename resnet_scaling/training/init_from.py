"""Start training from existing weights (`config.model.init_from`): a torchvision `.npz`, a workdir (its
exported weights), an `export/` directory or a checkpoint (`WORKDIR/checkpoints/<step>`). With
`model.init_skip_classifier` the classifier starts afresh, for fine-tuning on another number of classes;
any other mismatch is refused, naming it.

Only parameters and batch-norm statistics are taken; the step, the optimizer state and the schedule start
from zero. A run that resumes from its own checkpoint ignores `init_from`.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import traverse_util

from resnet_scaling import checkpointing, models
from resnet_scaling.config.plan import ConfigError
from resnet_scaling.models import weights
from resnet_scaling.training import steps

FIELD = "config.model.init_from"
logger = logging.getLogger(__name__)


def load_variables(path: str, model: models.ResNet, skip_classifier: bool) -> dict[str, Any]:
    """`{'params': ..., 'batch_stats': ...}` as NumPy, from a torchvision `.npz`, an export or a
    checkpoint; without the classifier when `skip_classifier`."""
    if not epath.Path(path).exists():
        raise ConfigError(f"{FIELD}: {path!r} does not exist; give a torchvision .npz, a workdir, or its "
                          "export/ directory or a checkpoint (WORKDIR/checkpoints/<step>).")
    if path.endswith(".npz"):
        try:
            return weights.load_torchvision_file(path, model, skip_classifier)
        except ValueError as e:
            lines = str(e).splitlines()[1:]
            only_classifier = lines and all("'fc." in line for line in lines)
            hint = ("\nOnly the classifier differs: set --config.model.init_skip_classifier=true to "
                    "fine-tune with a new one." if only_classifier else "")
            raise ConfigError(f"{FIELD}: {path} does not fit config.model: {e}{hint}") from None
    try:
        variables, _ = checkpointing.load_exported(path)
    except FileNotFoundError as e:
        raise ConfigError(f"{FIELD}: {e}") from None
    if skip_classifier:
        variables["params"] = {k: v for k, v in variables["params"].items() if k != "classifier"}
    return variables


def initialise_state(state: steps.TrainState, variables: dict[str, Any], path: str,
                     skip_classifier: bool) -> steps.TrainState:
    """`state` with its parameters and BN statistics replaced by `variables` (placed as the state's are).

    Raises:
      ConfigError: a variable is missing, unexpected or of another shape; the message lists each, and
        says how to fine-tune when only the classifier differs.
    """
    current = {"params": state.params, "batch_stats": state.batch_stats}
    flat_current = traverse_util.flatten_dict(current, sep="/")
    flat_loaded = traverse_util.flatten_dict(variables, sep="/")
    kept = {k for k in flat_current if skip_classifier and k.startswith("params/classifier/")}
    missing = [f"{k} {tuple(v.shape)}" for k, v in flat_current.items()
               if k not in flat_loaded and k not in kept]
    unexpected = [f"{k} {tuple(np.shape(v))}" for k, v in flat_loaded.items() if k not in flat_current]
    reshaped = [f"{k}: {tuple(np.shape(flat_loaded[k]))} in the weights, {tuple(v.shape)} in the model"
                for k, v in flat_current.items() if k in flat_loaded and np.shape(flat_loaded[k]) != v.shape]
    if missing or unexpected or reshaped:
        problems = [_some("of another shape", reshaped), _some("missing from the weights", missing),
                    _some("unexpected in the weights", unexpected)]
        hint = ""
        if all("classifier" in p for p in reshaped + missing + unexpected):
            hint = (" Only the classifier differs: set --config.model.init_skip_classifier=true to fine-tune "
                    "with a new one for config.model.num_classes.")
        elif reshaped and not missing and not unexpected:
            hint = " Same layers, other widths: config.model.num_filters differs from the weights' run."
        raise ConfigError(f"{FIELD}: the weights in {path} do not fit the model. "
                          f"{' '.join(p for p in problems if p)}{hint}")
    merged = {k: (v if k in kept else jax.device_put(np.asarray(flat_loaded[k], v.dtype), v.sharding))
              for k, v in flat_current.items()}
    merged = traverse_util.unflatten_dict(merged, sep="/")
    return state.replace(params=merged["params"], batch_stats=merged["batch_stats"])


def _some(what: str, items: list[str], shown: int = 2) -> str:
    """"3 arrays missing from the weights: a (3,); b (4,); and 1 more.": a count and the first few (a
    width mismatch puts every array of the model in one list)."""
    if not items:
        return ""
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return f"{len(items)} array{'s' * (len(items) > 1)} {what}: {'; '.join(items[:shown])}{more}."


def initialise_from_config(state: steps.TrainState, model_config: models.ModelConfig,
                           model: models.ResNet) -> steps.TrainState:
    """`state` initialised from `model_config.init_from` (unchanged when it is empty)."""
    path = model_config.init_from
    if not path:
        return state
    skip = bool(model_config.init_skip_classifier)
    state = initialise_state(state, load_variables(path, model, skip), path, skip)
    loaded = [x for name, tree in (("params", state.params), ("batch_stats", state.batch_stats))
              for key, x in traverse_util.flatten_dict(tree, sep="/").items()
              if not (skip and name == "params" and key.startswith("classifier/"))]
    logger.info("Initialised from %s: %d arrays, %s numbers (parameters and batch-norm statistics); %s; "
                "the step, the optimizer state and the schedule start from zero.", path, len(loaded),
                f"{sum(x.size for x in loaded):,}",
                "the classifier starts afresh (init_skip_classifier)" if skip else "nothing re-initialised")
    return state
