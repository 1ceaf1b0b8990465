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
