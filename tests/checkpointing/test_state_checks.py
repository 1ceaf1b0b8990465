"""The train state's health checks (checkpointing/state_checks.py) against NumPy, value by value."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling.checkpointing import state_checks


def _state(rng: np.random.Generator) -> types.SimpleNamespace:
    """A state of every kind of array a check meets: small and large parameters (one large enough to be
    checked on its own, one in bfloat16), BN statistics, and an optimizer state with an integer count."""
    params = {"conv": rng.normal(size=(3, 3, 4, 8)).astype(np.float32),
              "large": rng.normal(size=(300_000,)).astype(np.float32),
              "half": rng.normal(size=(16,)).astype(jnp.bfloat16),
              "bias": rng.normal(size=(8,)).astype(np.float32)}
    return types.SimpleNamespace(
        params=params, batch_stats={"mean": rng.normal(size=(8,)).astype(np.float32)},
        opt_state=({"count": np.int32(7)}, {k: rng.normal(size=v.shape).astype(np.float32)
                                            for k, v in params.items() if k != "half"}))


def _with_value(state: types.SimpleNamespace, where: str, name: str, value: float,
                rng: np.random.Generator) -> types.SimpleNamespace:
    """A copy of `state` with `value` at a random position of one array."""
    params, batch_stats = dict(state.params), dict(state.batch_stats)
    momentum = dict(state.opt_state[1])
    tree = {"params": params, "batch_stats": batch_stats, "momentum": momentum}[where]
    array = np.array(tree[name])
    array.reshape(-1)[rng.integers(array.size)] = value
    tree[name] = array
    return types.SimpleNamespace(params=params, batch_stats=batch_stats,
                                 opt_state=(state.opt_state[0], momentum))


def test_health_finds_a_non_finite_value_in_any_array_and_gives_the_parameters_norm():
    rng = np.random.default_rng(0)
    state = _state(rng)
    finite, norm = state_checks.health(state)
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in state.params.values()))
    assert finite and norm == pytest.approx(expected, rel=1e-5)
    places = [("params", name) for name in state.params] + [("batch_stats", "mean"), ("momentum", "large"),
                                                             ("momentum", "conv")]
    for where, name in places:
        for value in (np.nan, np.inf, -np.inf):
            bad = _with_value(state, where, name, value, rng)
            assert not state_checks.health(bad)[0], (where, name, value)
    # The largest finite float32 is finite; its square overflows the norm, not the finite flag.
    huge = _with_value(state, "params", "bias", np.finfo(np.float32).max, rng)
    assert state_checks.health(huge)[0]


def test_all_finite_reads_every_floating_array_and_passes_integers_and_empty_trees():
    rng = np.random.default_rng(1)
    state = _state(rng)
    variables = {"params": state.params, "batch_stats": state.batch_stats, "count": np.int32(3)}
    assert state_checks.all_finite(variables) and state_checks.all_finite({})
    for name in state.params:
        bad = _with_value(state, "params", name, np.nan, rng)
        assert not state_checks.all_finite({**variables, "params": bad.params}), name
    bad = _with_value(state, "batch_stats", "mean", -np.inf, rng)
    assert not state_checks.all_finite({**variables, "batch_stats": bad.batch_stats})


def test_a_state_of_many_small_arrays_is_checked_by_as_many_reductions_as_one_of_few():
    """Each reduction is a kernel XLA compiles on its own: a check whose reductions grew with the number of
    arrays (a ResNet has hundreds) compiled for longer than the train step on a run's first launch."""
    def reductions(num_arrays: int) -> int:
        params = {f"w{i}": np.ones((3, 3, 4, 4), np.float32) for i in range(num_arrays)}
        others = [np.ones((4,), np.float32) for _ in range(num_arrays)]
        return state_checks._health.lower(params, others).as_text().count("stablehlo.reduce")

    assert reductions(200) == reductions(3) > 0
