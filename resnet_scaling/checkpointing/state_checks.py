"""Checks of what a train state holds, computed on the device: content fingerprints for checkpoints and
the health (finite, not exploding) of a state before it is saved.

A fingerprint is one 32-bit number per array (its raw bits times odd position weights, summed mod 2**32).
Any flipped bit changes it, as does a block of overwritten bytes (except with probability ~2**-32), whatever
the file format: it catches corruption the storage layer does not check (OCDBT's large chunks carry no
checksum). It detects accidents, not tampering.

The health checks reduce the small arrays' values concatenated into one vector rather than each array on its
own: XLA compiles every reduction into a kernel of its own, and a ResNet's state holds hundreds of arrays,
most of them small, so a run's first launch spent longer compiling these checks than its train step
(benchmarks/README.md, `state_checks.py`). Fingerprints stay one reduction per array: they are one number
per array.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_GOLDEN = np.uint32(2654435761)  # Knuth's multiplicative hash constant: spreads positions over 32 bits.


def _bits_as_uint32(x: jax.Array) -> jax.Array:
    """The array's raw bits as uint32, one value per element (narrower types zero-extended)."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, unsigned)
    if x.dtype.itemsize == 8:  # Fold 64-bit values into 32 (x64 mode only).
        bits = (bits ^ (bits >> 32)).astype(jnp.uint32)
    return bits.astype(jnp.uint32)


def _array_fingerprint(x: jax.Array) -> jax.Array:
    bits = _bits_as_uint32(x).reshape(-1)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * _GOLDEN | jnp.uint32(1)  # Odd: no bit is lost.
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _fingerprints(tree: Any) -> list[jax.Array]:
    return [_array_fingerprint(x) for x in jax.tree.leaves(tree)]


def fingerprint(tree: Any) -> dict[str, int]:
    """`{path of each array: its 32-bit fingerprint}` for a pytree of arrays (see the module docstring)."""
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    values = jax.device_get(_fingerprints(tree))
    return {path: int(value) for path, value in zip(paths, values, strict=True)}


def mismatched(expected: dict[str, int], actual: dict[str, int]) -> list[str]:
    """The arrays whose fingerprints differ (or that are missing on either side), in `expected`'s order."""
    return ([path for path, value in expected.items() if actual.get(path) != value]
            + [path for path in actual if path not in expected])


# Floating arrays of up to this many values are checked as one concatenated vector; larger ones on their own,
# where a copy would cost more time than a kernel of their own costs compiling.
_LARGEST_CONCATENATED = 2**18


def _value_groups(tree: Any) -> list[jax.Array]:
    """The tree's floating arrays (integers are always finite), flattened: each large one on its own, the
    small ones concatenated into one vector of their common type."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    groups = [jnp.ravel(x) for x in leaves if x.size > _LARGEST_CONCATENATED]
    if small := [x for x in leaves if x.size <= _LARGEST_CONCATENATED]:
        dtype = jnp.result_type(*small)
        groups.append(jnp.concatenate([jnp.ravel(x).astype(dtype) for x in small]))
    return groups


def _finite(groups: list[jax.Array]) -> jax.Array:
    return functools.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(x)) for x in groups], jnp.bool_(True))


@jax.jit
def _health(params: Any, others: Any) -> tuple[jax.Array, jax.Array]:
    groups = _value_groups(params)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in groups))
    return _finite(groups) & _finite(_value_groups(others)), norm


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    return _finite(_value_groups(tree))


def all_finite(tree: Any) -> bool:
    """Whether every array of `tree` is free of NaN and infinities (integers always are), in one program."""
    return bool(_all_finite(tree))


def health(state: Any) -> tuple[bool, float]:
    """`(finite, parameter_norm)`: whether every floating array of the state (parameters, BN statistics,
    optimizer state) is finite, and the global L2 norm of the parameters."""
    others = [x for x in jax.tree.leaves((state.batch_stats, state.opt_state))
              if jnp.issubdtype(x.dtype, jnp.floating)]
    finite, norm = jax.device_get(_health(state.params, others))
    return bool(finite), float(norm)
