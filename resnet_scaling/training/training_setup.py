"""`setup(config)`: the one path from a config to a jitted training step, for every command.

config -> mesh -> batch plan -> data source -> training plan -> model -> optimizer -> state -> steps; the
config is read here, into its typed sections (`sections.read`), and each part takes its own. The trainer,
ahead-of-time compilation (`aot.build_report`) and the train-step benchmark all build here, so a pod runs
what was compiled for it ahead of time. As MaxText's `setup_train_loop`/`get_shaped_batch`, `abstract=True`
allocates and reads nothing: state and batch are ShapeDtypeStructs with the real shardings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from resnet_scaling import config as config_lib
from resnet_scaling import data as data_lib
from resnet_scaling import models
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.config import recipes
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.training import init_from, optim, steps
from resnet_scaling.training import sections as sections_lib


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """Everything a run needs, built from one config.

    Attributes:
      config: the validated config.
      sections: its typed sections, what the model, optimizer, schedule, input and steps were built from.
      mesh: the device mesh (`data` axis).
      plan: every derived size and duration.
      schedule: when the loop logs, evaluates, saves and stops (`plan.loop_schedule`).
      source: None for an abstract setup (no data is read).
      shaped_batch: the training batch as ShapeDtypeStructs with its sharding (what every source yields).
      model: the ResNet, with the plan's batch-norm groups.
      state: the initial train state, replicated (abstract: ShapeDtypeStructs); `model.init_from` if set.
      step_config: the constants the steps bind.
      train_step: `train_step` jitted for the mesh (state donated); `.lower(state, batch).compile()` it.
      eval_step: `eval_step` jitted for the mesh.
    """

    config: ml_collections.ConfigDict
    sections: sections_lib.Sections
    mesh: jax.sharding.Mesh
    plan: plan_lib.TrainingPlan
    schedule: plan_lib.LoopSchedule
    source: data_lib.DataSource | None
    shaped_batch: dict[str, jax.ShapeDtypeStruct]
    model: models.ResNet
    learning_rate_fn: optax.Schedule
    optimizer: optax.GradientTransformation
    state: steps.TrainState
    step_config: steps.StepConfig
    train_step: Callable[[steps.TrainState, steps.Batch], tuple[steps.TrainState, steps.Metrics]]
    eval_step: Callable[[steps.TrainState, steps.Batch], steps.Metrics]

    @property
    def num_params(self) -> int:
        """Parameters of the model (BN statistics excluded)."""
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.state.params))

    def compile_train_step(self, state: Any = None, batch: Any = None) -> tuple[Any, float]:
        """Lowers and compiles the train step; returns (the executable, seconds it took).

        Args:
          state, batch: what to lower with (default: this setup's state and the shaped batch); real
            arrays and ShapeDtypeStructs with the same shapes and shardings give the same program.
        """
        state = self.state if state is None else state
        batch = self.shaped_batch if batch is None else batch
        start = time.perf_counter()
        compiled = self.train_step.lower(state, batch).compile()
        return compiled, time.perf_counter() - start

    def compile_eval_step(self) -> tuple[Any, float]:
        """Lowers and compiles the eval step on a shaped eval batch; returns (the executable, seconds)."""
        batch = data_lib.shaped_eval_batch(self.plan.batch, self.sections.data.image_size, self.mesh)
        start = time.perf_counter()
        compiled = self.eval_step.lower(self.state, batch).compile()
        return compiled, time.perf_counter() - start


def setup(config: ml_collections.ConfigDict, *, devices: Sequence[jax.Device] | None = None,
          arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
          abstract: bool = False,
          train_step_fn: Callable[..., tuple[steps.TrainState, steps.Metrics]] = steps.train_step,
          ) -> TrainingSetup:
    """Validates `config` (once) and builds the run it describes.

    Args:
      config: a config from `configs/` or `config.get_base_config()`.
      devices: devices for the mesh (default: all of the job's); for `abstract`, a TPU topology's.
      arrays: `(train_images, train_labels, eval_images, eval_labels)` for `data.source == "arrays"`.
      abstract: shapes only (AOT): no data source or state in memory; epochs of `data.num_train_examples`.
      train_step_fn: the step to jit (tests pass a wrapped `steps.train_step`).

    Raises:
      ConfigError: an invalid config (the message names the field and the fix).
      DataError: a missing, unprepared or malformed dataset.
    """
    config = recipes.resolve(config).config  # A config whose batch changed since its recipe ran.
    devices = list(devices if devices is not None else jax.devices())
    if config.mesh.num_devices > len(devices):  # A config for a larger system: say how to go on here.
        raise config_lib.too_few_devices_error(config, len(devices), devices[0].platform)
    config_lib.validate(config, mesh_lib.mesh_size(config.mesh.num_devices, len(devices)))
    parts = sections_lib.read(config)
    mesh = mesh_lib.create_mesh(config.mesh.num_devices, devices, num_slices=config.system.num_slices)
    batch = plan_lib.batch_plan_for_mesh(config, mesh)
    if abstract:
        source = None
        num_train_examples, num_eval_examples = config.data.num_train_examples, config.data.num_eval_examples
    else:
        source = data_lib.create_data_source(parts.data, mesh, arrays, batch=batch)
        num_train_examples, num_eval_examples = source.num_train_examples, source.num_eval_examples
    plan = plan_lib.derive(config, num_train_examples, batch=batch, num_eval_examples=num_eval_examples)

    model = models.model_from_config(parts.model, plan, platform=devices[0].platform)
    learning_rate_fn = optim.create_learning_rate_schedule(parts.schedule, plan)
    optimizer = optim.create_optimizer(parts.optimizer, learning_rate_fn)
    make_state = steps.abstract_train_state if abstract else steps.create_train_state
    state = make_state(jax.random.key(config.seed), model, optimizer, config.data.image_size, mesh,
                       optim.create_dynamic_scale(parts.model.compute_dtype))
    if not abstract:
        state = init_from.initialise_from_config(state, parts.model, model)
    step_config = parts.step
    return TrainingSetup(
        config=config, sections=parts, mesh=mesh, plan=plan, schedule=plan_lib.loop_schedule(config, plan),
        source=source,
        shaped_batch=data_lib.shaped_train_batch(batch, config.data.image_size, mesh), model=model,
        learning_rate_fn=learning_rate_fn, optimizer=optimizer, state=state, step_config=step_config,
        train_step=steps.jit_train_step(state, mesh, learning_rate_fn, step_config, step_fn=train_step_fn),
        eval_step=steps.jit_eval_step(state, mesh, step_config),
    )
