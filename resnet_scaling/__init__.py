"""resnet_scaling: ResNet v1.5 on ImageNet in JAX/Flax, from one accelerator to a TPU pod slice.

The public API, for research code that skips the command line:

    from resnet_scaling import get_base_config, train_and_evaluate
    config = get_base_config()
    result = train_and_evaluate(config, workdir="/tmp/run")

or builds the pieces and writes its own loop: `setup(config)` returns the mesh, the training plan, the
data source, the model, the optimizer, the state and the jitted steps (`TrainingSetup`). The pieces take
typed sections of the config (`ModelConfig`, `OptimizerConfig`, ...), which `sections.read(config)` gives.

The names load on first use (`resnet_scaling.train` can take Ctrl-C before JAX is imported): `import
resnet_scaling` alone imports neither JAX nor TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from resnet_scaling.host import xla_flags as _xla_flags

# The module that defines each public name.
_PUBLIC_MODULES = {
    "checkpointing": ("load_exported",),
    "config": ("ConfigError", "get_base_config", "validate"),
    "data": ("ArraySource", "DataConfig", "DataSource", "SyntheticSource", "create_data_source",
             "make_shapes"),
    "evaluation": ("evaluate_workdir",),
    "mesh": ("batch_sharding", "create_mesh", "host_local_to_global", "replicated_sharding"),
    "models": ("ModelConfig", "ResNet", "create_model", "model_from_config"),
    "optim": ("OptimizerConfig", "ScheduleConfig", "create_dynamic_scale", "create_learning_rate_schedule",
              "create_optimizer", "lars"),
    "plan": ("BatchPlan", "TrainingPlan", "batch_plan", "derive"),
    "predict": ("Predictor",),
    "sections": ("Sections",),
    "steps": ("StepConfig", "TrainState", "create_train_state", "eval_step", "jit_eval_step",
              "jit_train_step", "train_step"),
    "trainer": ("TrainResult", "train_and_evaluate"),
    "training_setup": ("TrainingSetup", "setup"),
    "weights": ("from_torchvision", "load_torchvision_file"),
}
_PUBLIC = {name: module for module, names in _PUBLIC_MODULES.items() for name in names}

if TYPE_CHECKING:  # What type checkers and IDEs see.
    from resnet_scaling.checkpointing import load_exported
    from resnet_scaling.config import ConfigError, get_base_config, validate
    from resnet_scaling.data import (
        ArraySource,
        DataConfig,
        DataSource,
        SyntheticSource,
        create_data_source,
        make_shapes,
    )
    from resnet_scaling.evaluation import evaluate_workdir
    from resnet_scaling.mesh import batch_sharding, create_mesh, host_local_to_global, replicated_sharding
    from resnet_scaling.models import ModelConfig, ResNet, create_model, model_from_config
    from resnet_scaling.optim import (
        OptimizerConfig,
        ScheduleConfig,
        create_dynamic_scale,
        create_learning_rate_schedule,
        create_optimizer,
        lars,
    )
    from resnet_scaling.plan import BatchPlan, TrainingPlan, batch_plan, derive
    from resnet_scaling.predict import Predictor
    from resnet_scaling.sections import Sections
    from resnet_scaling.steps import (
        StepConfig,
        TrainState,
        create_train_state,
        eval_step,
        jit_eval_step,
        jit_train_step,
        train_step,
    )
    from resnet_scaling.trainer import TrainResult, train_and_evaluate
    from resnet_scaling.training_setup import TrainingSetup, setup
    from resnet_scaling.weights import from_torchvision, load_torchvision_file

__all__ = [
    "ArraySource",
    "BatchPlan",
    "ConfigError",
    "DataConfig",
    "Predictor",
    "DataSource",
    "ModelConfig",
    "OptimizerConfig",
    "ResNet",
    "ScheduleConfig",
    "Sections",
    "StepConfig",
    "SyntheticSource",
    "TrainResult",
    "TrainState",
    "TrainingPlan",
    "TrainingSetup",
    "batch_plan",
    "batch_sharding",
    "create_data_source",
    "create_dynamic_scale",
    "create_learning_rate_schedule",
    "create_mesh",
    "create_model",
    "create_optimizer",
    "create_train_state",
    "derive",
    "eval_step",
    "evaluate_workdir",
    "from_torchvision",
    "get_base_config",
    "host_local_to_global",
    "jit_eval_step",
    "jit_train_step",
    "lars",
    "load_exported",
    "load_torchvision_file",
    "make_shapes",
    "model_from_config",
    "replicated_sharding",
    "setup",
    "train_and_evaluate",
    "train_step",
    "validate",
]
__version__ = "0.1.0"



def __getattr__(name: str) -> Any:
    """Imports a public name's module on first use (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'resnet_scaling' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"resnet_scaling.{_PUBLIC[name]}"), name)
    globals()[name] = value  # Later lookups skip this function.
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# No TPU probing (and no libtpu error lines) on a machine without an accelerator; see the function.
_xla_flags.skip_tpu_probe_without_accelerator()
