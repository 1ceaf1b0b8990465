"""Test set-up: 8 fake CPU devices, so that the sharded code paths run as they would on 8 chips."""

import os

# Must happen before jax is imported anywhere in the test session. XLA's CPU fusion emitters are turned off
# for the test processes: XLA's older emitters compile the suite's tiny programs about 3x faster (a tiny
# train step: 0.8 s instead of 2.6 s on one device), and compiling is most of what a test spends.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    " --xla_cpu_use_fusion_emitters=false"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _share_one_compilation_cache() -> None:
    """One persistent compilation cache for every process the suite launches (the environment carries it):
    a launch loads a program an earlier one compiled instead of compiling it again (most of a tiny run's
    launch is compiling). The first conftest to load (pytest's main
    process, before xdist starts its workers) makes the folder. A maximum size turns on JAX's file lock
    (filelock), so that the two workers' launches and the processes of one job never read an entry half
    written. Launches that measure compiling turn it off (the benchmarks) or use their own (the CLI's
    workdir cache); the test processes keep one of their own beside it (see below)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # Set by the main process, or by whoever runs the suite.
        os.makedirs(_in_process_cache_dir(), exist_ok=True)
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="resnet_scaling-tests-compilation-cache-")
    os.environ.update({"JAX_COMPILATION_CACHE_DIR": folder, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
                       "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 * 2**30)})
    os.mkdir(_in_process_cache_dir())
    for path in (folder, _in_process_cache_dir()):
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def _in_process_cache_dir() -> str:
    return os.environ["JAX_COMPILATION_CACHE_DIR"] + "-in-process"


_share_one_compilation_cache()

import jax  # noqa: E402
import pytest  # noqa: E402

# The test processes' own persistent cache, shared by the xdist workers: many tests train the same tiny
# models, and each of those programs is compiled once in the session instead of once per run. It is kept
# apart from the launches' because the test processes compile fast (below), and JAX's cache keys leave
# that setting out; `tests.helpers.xla_default_optimizations` turns it off. Programs that compile in a
# moment (the many small ones) are not written: writing them would cost more than their hits save.
jax.config.update("jax_compilation_cache_dir", _in_process_cache_dir())
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


def pytest_configure(config):
    """With `-n 2`, xdist (`--dist load`) hands tests to its workers one at a time, to whichever frees first,
    unless `--maxschedchunk` says otherwise. By default it sends each worker a run of consecutive tests at
    once (a quarter of its share): the slow tests, which run first (below), would all go to one worker."""
    if getattr(config.option, "maxschedchunk", "no xdist") is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
    """Runs the tests marked `slow` (whole training launches, tens of seconds each) first, then the rest,
    each group in collection order: both workers start on long tests and end together on short ones,
    instead of one starting a long launch when the other has nothing left to run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # Stable: keeps the order within.


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
