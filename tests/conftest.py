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
# The processes the suite launches compile fast too, as the test processes do (below): a tiny run's launch
# is mostly compiling. The demo's test takes it out of the demo's environment (a user's compile, as its
# throughput needs), and so do the tests that time compiling.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")

# With the CUDA plugin installed (the test extra's gpu_compile), `import jax` loads its libraries, which say
# they found no driver: imported here first, in every test process, without those lines.
from resnet_scaling.job import native_noise  # noqa: E402

native_noise.import_jax_quietly()


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


def _share_one_session_folder() -> None:
    """A folder for what the whole session builds once and every process reads (the demo's dataset): made by
    the first conftest to load, as the compilation cache is, and named in the environment for the xdist
    workers."""
    if "RESNET_SCALING_TESTS_SESSION_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="resnet_scaling-tests-session-")
    os.environ["RESNET_SCALING_TESTS_SESSION_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


_share_one_session_folder()

import jax  # noqa: E402
import pytest  # noqa: E402

# The test processes' own persistent cache, shared by the xdist workers: many tests train the same tiny
# models, and each of those programs is compiled once in the session instead of once per run. It is kept
# apart from the launches' because the test processes compile fast (below), and JAX's cache keys leave
# that setting out; `tests.helpers.xla_default_optimizations` turns it off. Programs that compile in a
# moment (the many small ones) are not written: writing them would cost more than their hits save.
jax.config.update("jax_compilation_cache_dir", _in_process_cache_dir())
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


# Modules whose tests share an expensive module fixture (a TPU topology's compiled reports, a prepared
# dataset, finished runs): one xdist worker runs all of a module's tests and builds its fixtures once,
# where two workers would each build them.
SHARED_FIXTURE_MODULES = ("tests/planning/test_compile.py", "tests/inference/test_evaluate.py",
                          "tests/checkpointing/test_init_from.py", "tests/metrics/test_mlperf_log.py",
                          "tests/data/test_prepare.py", "tests/planning/test_gpu_compile.py")


def _shared_fixture_module(nodeid: str) -> str | None:
    """The test's module if it is one of `SHARED_FIXTURE_MODULES`, else None."""
    module = nodeid.split("::", 1)[0]
    return module if module in SHARED_FIXTURE_MODULES else None


@pytest.hookimpl(optionalhook=True)  # An xdist hook: pytest without xdist (-p no:xdist) still runs.
def pytest_xdist_make_scheduler(config, log):
    """With `-n 2`: xdist's load scheduling (each test to whichever worker frees first, a few at a time)
    with `SHARED_FIXTURE_MODULES` each sent whole, in the order below. (xdist's own `--dist loadgroup`
    cannot do it with pytest 9: its workers rename `item._nodeid`, which pytest no longer reads.)"""
    if config.getvalue("dist") != "load":  # An explicit --dist other than -n's default is left alone.
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureModulesWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _shared_fixture_module(nodeid) or nodeid

    config.option.loadscopereorder = False  # Keep the order below, not the largest units first.
    return SharedFixtureModulesWhole(config, log)


def pytest_collection_modifyitems(config, items):
    """Runs the tests marked `slow` (whole training launches, tens of seconds each) first, then
    `SHARED_FIXTURE_MODULES`, then the rest, each group in collection order: both workers start on long
    work and end together on short tests, instead of one starting a long launch when the other has
    nothing left to run."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 _shared_fixture_module(item.nodeid) is None))  # Stable.


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


@pytest.fixture(scope="session")
def demo_dataset() -> dict:
    """The demo's generated dataset (configs/demo.py: 14,000 JPEGs, half a minute to write), written once per
    session for every test that runs the demo's data (the demo, the MLPerf demo): the first test to ask
    writes it under a file lock in the session's folder, the other worker's waits for it and reads it.

    Returns:
      {"cache_dir": the folder to pass as `--config.data.cache_dir`, "root": the dataset's folder in it,
      "messages": what the writer logged while it wrote (a user's first run shows these lines)}.
    """
    import json
    import logging
    import pathlib

    import filelock

    from resnet_scaling.config import load_config
    from resnet_scaling.data import shapes
    from resnet_scaling.training import sections

    folder = pathlib.Path(os.environ["RESNET_SCALING_TESTS_SESSION_DIR"]) / "demo_dataset"
    folder.mkdir(exist_ok=True)
    record = folder / "written.json"
    with filelock.FileLock(str(folder) + ".lock"):
        if not record.exists():
            # The demo's data section as the command line reads it (its sizes and seed name the folder).
            data = sections.read(load_config("demo")).data
            messages = []
            handler = logging.Handler(logging.INFO)
            handler.emit = lambda entry: messages.append(entry.getMessage())
            logger = logging.getLogger(shapes.__name__)
            level = logger.level
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            try:
                root = shapes.shapes_folder(str(folder / "cache"), num_train=data.num_train_examples,
                                            num_eval=data.num_eval_examples, image_size=data.image_size,
                                            seed=data.seed)
            finally:
                logger.removeHandler(handler)
                logger.setLevel(level)
            record.write_text(json.dumps({"cache_dir": str(folder / "cache"), "root": root,
                                          "messages": messages}))
    return json.loads(record.read_text())
