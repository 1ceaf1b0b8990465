"""`training_setup.setup`: one path from a config to the jitted steps, real or abstract, validated once."""

from __future__ import annotations

import re
import time

import jax
import numpy as np
import pytest

from resnet_scaling import config as config_lib
from resnet_scaling.data import ArraySource
from resnet_scaling.metrics import compiled as compiled_lib
from resnet_scaling.training import trainer, training_setup
from tests.helpers import model_of, random_arrays, tiny_config


def _config(**overrides):
    # The abstract setup takes the epoch length from the config: make it the arrays' size.
    return tiny_config(data__num_train_examples=64, data__num_eval_examples=20, model__bn_group_size=4,
                       **overrides)


def _program(lowered) -> str:
    """The lowered StableHLO, without the numeric suffixes jax gives private functions (`@clip_7`) that
    depend on what was lowered before in the process."""
    return re.sub(r"@([A-Za-z_][A-Za-z0-9_]*?)_\d+\b", r"@\1", lowered.as_text())


def test_abstract_setup_lowers_the_same_program_as_the_real_one():
    """What `python -m resnet_scaling.compile` compiles is what the trainer runs: the abstract setup's
    state and shaped batch lower to the same HLO as the real state and a real batch."""
    real = training_setup.setup(_config(), arrays=random_arrays())
    abstract = training_setup.setup(_config(), abstract=True)
    assert isinstance(real.source, ArraySource) and abstract.source is None
    assert abstract.plan == real.plan
    for a, r in zip(jax.tree.leaves(abstract.state), jax.tree.leaves(real.state), strict=True):
        assert isinstance(a, jax.ShapeDtypeStruct)
        assert (a.shape, a.dtype, a.sharding) == (r.shape, r.dtype, r.sharding)
    batch = next(real.source.train_batches())
    for key, shaped in abstract.shaped_batch.items():
        assert (shaped.shape, shaped.dtype, shaped.sharding) == (batch[key].shape, batch[key].dtype,
                                                                 batch[key].sharding)
    hlo_real = _program(real.train_step.lower(real.state, batch))
    assert _program(abstract.train_step.lower(abstract.state, abstract.shaped_batch)) == hlo_real
    assert abstract.model.bn_group_size == real.plan.bn_group_size == 4


def test_compiled_step_runs_on_real_batches_and_reports_flops_and_memory():
    run = training_setup.setup(_config(), arrays=random_arrays())
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(run.state))
    variables = jax.device_get({"params": run.state.params, "batch_stats": run.state.batch_stats})
    start = time.perf_counter()
    compiled, seconds = run.compile_train_step()  # Lowered with the shaped batch.
    assert 0 < seconds <= time.perf_counter() - start
    batch = next(run.source.train_batches())
    state, step_metrics = compiled(run.state, batch)
    assert int(state.step) == 1 and np.isfinite(float(step_metrics["loss"]))
    memory = compiled_lib.memory_per_device(compiled)
    # Each device holds the whole (replicated) state and its eighth of the batch; the state is donated,
    # so the new one is written over it.
    assert memory["argument"] == state_bytes + sum(x.nbytes for x in batch.values()) // 8
    assert memory["alias"] == state_bytes
    # What a device holds in all: at least the state and its share of the batch (counted above).
    assert memory["total"] >= memory["argument"]
    # A training step costs about three forward passes (the forward, then two products per layer
    # backward): XLA's count for one forward pass over a device's 2 images, compiled alone. Measured 2.9
    # with lowering="xla" and 3.5 with the CPU forms: XLA counts a convolution's taps on its padding as
    # no work, but the patch-form weight gradients multiply those zeros, and at this model's 1-4 pixel
    # stage outputs half the taps of a strided 3x3 fall on padding (ResNet-50 at 224 px: 383.6 against
    # 382.2 GFLOP per step, +0.4%).
    model = model_of(tiny_config())
    forward = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))
    forward_compiled = forward.lower(variables, np.zeros((2, 32, 32, 3))).compile()
    forward_flops = compiled_lib.flops_per_device(forward_compiled)
    assert 2.5 * forward_flops < compiled_lib.flops_per_device(compiled) < 3.8 * forward_flops


def test_a_training_command_validates_its_config_once(monkeypatch, tmp_path):
    calls = []
    real_validate = config_lib.validate

    def counting_validate(config, num_devices=None):
        calls.append(num_devices)
        return real_validate(config, num_devices)

    monkeypatch.setattr(config_lib, "validate", counting_validate)
    config = tiny_config(training__num_train_steps=1)
    trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    assert calls == [8]  # Once, with the mesh's device count.


def test_setup_refuses_a_bad_config_before_touching_data():
    config = tiny_config(training__global_batch_size=12)
    with pytest.raises(config_lib.ConfigError, match="training.global_batch_size.*multiple of 8"):
        training_setup.setup(config)  # No arrays passed: the config error comes first.
    with pytest.raises(config_lib.ConfigError, match="mesh.num_devices"):
        training_setup.setup(tiny_config(mesh__num_devices=0))
