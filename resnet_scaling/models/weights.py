"""Load torchvision ResNet weights into `models.ResNet` (both v1.5, symmetric padding: the same function).

A state dict saved as NumPy arrays converts into Flax variables:

    sd = {k: v.numpy() for k, v in torchvision.models.resnet50(weights=...).state_dict().items()}
    np.savez("resnet50.npz", **sd)
    variables = load_torchvision_file("resnet50.npz", create_model("resnet50"))
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from resnet_scaling.models import ResNet

__all__ = ["from_torchvision", "load_torchvision_file"]

# (Flax collection, variable name) -> torchvision parameter/buffer name, for BatchNorm.
_BN_NAMES = {
    ("params", "scale"): "weight",
    ("params", "bias"): "bias",
    ("batch_stats", "mean"): "running_mean",
    ("batch_stats", "var"): "running_var",
}
_MODULE_NAMES = {"stem_conv": "conv1", "stem_bn": "bn1", "classifier": "fc",
                 "downsample_conv": "downsample.0", "downsample_bn": "downsample.1"}
_MAX_ERRORS = 10


def _torch_key(collection: str, path: tuple[str, ...]) -> str:
    """Maps a Flax variable path, e.g. ('stage2_block1', 'bn1', 'scale'), to a torchvision key."""
    *modules, leaf = path
    parts = []
    for name in modules:
        if match := re.fullmatch(r"stage(\d+)_block(\d+)", name):
            parts.append(f"layer{match[1]}.{int(match[2]) - 1}")
        else:
            parts.append(_MODULE_NAMES.get(name, name))
    if (collection, leaf) in _BN_NAMES:
        leaf = _BN_NAMES[collection, leaf]
    elif leaf == "kernel":
        leaf = "weight"
    return ".".join([*parts, leaf])


def _to_numpy(value: Any) -> np.ndarray:
    """Converts a NumPy array, array-like or torch tensor (without importing torch) to NumPy."""
    if hasattr(value, "detach"):
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value)


def _to_torch_layout(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Flax kernel shape (conv HWIO, dense [in, out]) -> torchvision shape (OIHW, [out, in])."""
    if len(shape) == 4:
        return (shape[3], shape[2], shape[0], shape[1])
    if len(shape) == 2:
        return (shape[1], shape[0])
    return shape


def _from_torch_layout(array: np.ndarray) -> np.ndarray:
    """torchvision weight (OIHW conv, [out, in] dense) -> Flax kernel (HWIO, [in, out])."""
    if array.ndim == 4:
        return array.transpose(2, 3, 1, 0)
    if array.ndim == 2:
        return array.T
    return array


def _hint(key: str, want: tuple[int, ...], got: tuple[int, ...]) -> str:
    if key.startswith("fc.") and got and want[0] != got[0]:
        return f" (the checkpoint has {got[0]} classes: create the model with num_classes={got[0]})"
    return " (check the architecture name and `num_filters`)"


def from_torchvision(state_dict: Mapping[str, Any], model: ResNet, skip_classifier: bool = False
                     ) -> dict[str, dict[str, Any]]:
    """Converts a torchvision-layout ResNet state dict into Flax variables for `model`.

    Args:
      state_dict: torchvision keys (`conv1.weight`, `layer1.0.bn1.running_mean`, ...) to NumPy arrays,
        array-likes or torch tensors; `num_batches_tracked` is ignored.
      model: its architecture, `num_filters` and `num_classes` must match the checkpoint exactly.
      skip_classifier: leave out `fc.*` (fine-tuning to other classes); the params then lack `classifier`.

    Returns:
      `{'params': ..., 'batch_stats': ...}`, nested dicts of float32 NumPy arrays, for `model.apply`.

    Raises:
      ValueError: naming every key of `model` missing or misshapen in `state_dict`, and every unused key.
    """
    expected = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False))
    remaining = {k: v for k, v in state_dict.items() if not k.endswith("num_batches_tracked")
                 and not (skip_classifier and k.startswith("fc."))}
    errors: list[str] = []
    variables: dict[str, Any] = {}
    for collection in ("params", "batch_stats"):
        flat = traverse_util.flatten_dict(dict(expected.get(collection, {})))
        converted = {}
        for path, leaf in flat.items():
            if skip_classifier and path[0] == "classifier":
                continue
            key = _torch_key(collection, path)
            want = _to_torch_layout(tuple(leaf.shape))
            if key not in remaining:
                errors.append(f"missing key {key!r} (expected shape {want})")
                continue
            array = _to_numpy(remaining.pop(key))
            if array.shape != want:
                hint = _hint(key, want, array.shape)
                errors.append(f"{key!r}: expected shape {want}, got {array.shape}{hint}")
                continue
            converted[path] = np.ascontiguousarray(_from_torch_layout(array), dtype=np.float32)
        variables[collection] = traverse_util.unflatten_dict(converted)
    errors += [f"unexpected key {key!r} (shape {np.shape(_to_numpy(value))})"
               for key, value in remaining.items()]
    if errors:
        shown = errors[:_MAX_ERRORS]
        if len(errors) > _MAX_ERRORS:
            shown.append(f"... and {len(errors) - _MAX_ERRORS} more")
        raise ValueError(f"State dict does not match the model ({len(errors)} problems):\n  "
                         + "\n  ".join(shown))
    return variables


def load_torchvision_file(path: str | os.PathLike[str], model: ResNet, skip_classifier: bool = False
                          ) -> dict[str, dict[str, Any]]:
    """Reads an `.npz` of a torchvision ResNet state dict and converts it with `from_torchvision`."""
    with np.load(path) as data:
        return from_torchvision({key: data[key] for key in data.files}, model, skip_classifier)
