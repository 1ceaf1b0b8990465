"""Test set-up: 8 fake CPU devices, so that the sharded code paths run as they would on 8 chips."""

import os

# Must happen before jax is imported anywhere in the test session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert jax.device_count() == 8, "tests expect 8 fake CPU devices (see conftest.py)"

# Compile fast rather than run fast: test programs are tiny (as the flax examples' tests do).
jax.config.update("jax_disable_most_optimizations", True)


@pytest.fixture
def xla_optimizations(request):
    """"off" (the session's fast compiles) or "default" (XLA's default optimisations, as real runs compile;
    see `tests.helpers.xla_default_optimizations`): parametrize a test with it, `indirect=True`, to check
    that a claim holds on both paths."""
    from tests.helpers import xla_default_optimizations  # Imports the library: only when asked for.

    if getattr(request, "param", "off") == "off":
        yield "off"
        return
    with xla_default_optimizations():
        yield "default"
