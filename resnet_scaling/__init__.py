"""resnet_scaling: ResNet v1.5 on ImageNet in JAX/Flax, from one accelerator to a TPU pod slice.

The top level holds what most research code needs, and the commands (`python -m resnet_scaling.train`,
`evaluate`, `compile`, `planner`, `prepare`):

    from resnet_scaling import get_base_config, train_and_evaluate
    config = get_base_config()
    result = train_and_evaluate(config, workdir="/tmp/run")

| name | what it is |
|---|---|
| `get_base_config`, `load_config`, `ConfigError` | the defaults; a shipped config or a file; a refusal |
| `train_and_evaluate`, `TrainResult` | a whole run, resumed from its workdir |
| `setup`, `TrainingSetup` | a run's pieces for your own loop: mesh, plan, data, model, optimizer, steps |
| `evaluate_workdir`, `Predictor` | a trained run's exact evaluation; its predictions on images |
| `load_exported` | a run's exported parameters |

The rest lives in namespaces, one folder each (their `__init__.py` lists their modules): `config`
(sections, recipes), `models` (the ResNet, batch norm, torchvision weights), `training` (plan, mesh,
optimizers, steps, the loop), `data`, `inference`, `checkpointing`, `metrics`, `planning` (ahead-of-time
compilation and the planner's model), `job` (the process, its console, its signals).

The names load on first use: `import resnet_scaling` alone imports neither JAX nor TensorFlow (a command
takes Ctrl-C before JAX is imported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from resnet_scaling.job import xla_flags as _xla_flags

# The module that defines each top-level name.
_PUBLIC = {
    "get_base_config": "config", "load_config": "config", "ConfigError": "config",
    "train_and_evaluate": "training.trainer", "TrainResult": "training.trainer",
    "setup": "training.training_setup", "TrainingSetup": "training.training_setup",
    "evaluate_workdir": "inference.evaluation", "Predictor": "inference.predict",
    "load_exported": "checkpointing",
}

if TYPE_CHECKING:  # What type checkers and IDEs see.
    from resnet_scaling.checkpointing import load_exported
    from resnet_scaling.config import ConfigError, get_base_config, load_config
    from resnet_scaling.inference.evaluation import evaluate_workdir
    from resnet_scaling.inference.predict import Predictor
    from resnet_scaling.training.trainer import TrainResult, train_and_evaluate
    from resnet_scaling.training.training_setup import TrainingSetup, setup

__all__ = [
    "ConfigError", "Predictor", "TrainResult", "TrainingSetup", "evaluate_workdir", "get_base_config",
    "load_config", "load_exported", "setup", "train_and_evaluate",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Imports a top-level name's module on first use (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'resnet_scaling' has no attribute {name!r}")
    if _PUBLIC[name] != "config":  # The others import JAX: without the CUDA plugin's "no driver" lines.
        from resnet_scaling.job import native_noise

        native_noise.import_jax_quietly()
    value = getattr(importlib.import_module(f"resnet_scaling.{_PUBLIC[name]}"), name)
    globals()[name] = value  # Later lookups skip this function.
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# The package's one import-time setting (see the function): no TPU probing, and none of libtpu's error
# lines, in a notebook on a machine without an accelerator.
_xla_flags.skip_tpu_probe_without_accelerator()
