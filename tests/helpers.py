"""Small shared pieces for the tests: a tiny config, a tiny dataset, held ports, a compilation cache."""

import contextlib
import importlib.util
import os
import pathlib
import socket
import sys
from collections.abc import Iterator, Mapping

import numpy as np

from resnet_scaling.config import get_base_config


def tiny_config(**overrides):
    """A resnet_tiny config on 32x32 arrays: compiles and steps in seconds on a CPU.

    Overrides name `section__field` (or a top-level field such as `seed`).
    """
    config = get_base_config()
    config.model.name = "resnet_tiny"
    config.model.num_classes = 10
    config.model.num_filters = 8
    config.data.source = "arrays"
    config.data.image_size = 32
    config.training.global_batch_size = 16
    config.training.num_train_steps = 4
    config.training.log_every_steps = 2
    config.training.log_every_sec = 0.0  # Log points by steps only: tests compare records step for step.
    config.schedule.warmup_steps = 1
    config.eval.global_batch_size = 16
    config.eval.every_epochs = 0
    config.training.tensorboard = False  # Saves importing TensorFlow in every test process.
    config.checkpoint.enabled = False  # On where it matters: tests/checkpointing/.
    for key, value in overrides.items():
        if "__" in key:
            section, name = key.split("__")
            config[section][name] = value
        else:
            config[key] = value
    return config


def data_source(config, mesh, arrays=None, **kwargs):
    """`data.create_data_source` for a whole config: its data section and batch plan on `mesh`."""
    # Imported here: worker processes import this module before they set up JAX.
    from resnet_scaling import data
    from resnet_scaling.config import plan
    from resnet_scaling.training import sections

    return data.create_data_source(sections.read(config).data, mesh, arrays,
                                   batch=plan.batch_plan_for_mesh(config, mesh), **kwargs)


def model_of(config, plan=None):
    """`models.model_from_config` for a whole config (its model section)."""
    from resnet_scaling import models
    from resnet_scaling.training import sections

    return models.model_from_config(sections.read(config).model, plan)


def random_arrays(num_train=64, num_eval=20, image_size=32, num_classes=10, seed=0):
    rng = np.random.default_rng(seed)

    def draw(n):
        images = rng.integers(0, 256, (n, image_size, image_size, 3), dtype=np.uint8)
        return images, rng.integers(0, num_classes, n).astype(np.int32)

    return (*draw(num_train), *draw(num_eval))


@contextlib.contextmanager
def held_port(*, share_with_coordinator: bool) -> Iterator[int]:
    """A free port on 127.0.0.1, bound (not listening) by this process until the block ends.

    Choosing a port by binding and closing a socket leaves it free for anyone (another test worker, an
    outgoing connection) until it is used; holding it closes that window.

    Args:
      share_with_coordinator: True: the socket sets SO_REUSEPORT, so a JAX coordinator (its gRPC server
        sets it too) can bind and listen beside it, as launch/local.py does for its jobs; programs that do
        not set it still get EADDRINUSE. False: nobody can bind it, and connections to it are refused: an
        address where no coordinator can ever answer.

    Yields:
      The port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if share_with_coordinator:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@contextlib.contextmanager
def persistent_compilation_cache(directory: os.PathLike) -> Iterator[None]:
    """JAX's persistent compilation cache in `directory` for the block, for every program however fast
    it compiles; as `resnet_scaling.train` uses it (config.training.compilation_cache_dir)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    settings = {"jax_compilation_cache_dir": str(directory), "jax_persistent_cache_min_compile_time_secs": 0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    saved = {name: jax.config.values[name] for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # The cache is set up once per process, at the first compile.
    try:
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def launch_xla_flags(num_devices: int | None = None) -> str:
    """XLA_FLAGS for a process the suite launches: the session's fast-compile flags (tests/conftest.py)
    without its 8 fake devices (one CPU device, as a user's machine has), or with `num_devices` of them."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count=")]
    if num_devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={num_devices}")
    return " ".join(flags)


def users_compile(env: dict[str, str]) -> dict[str, str]:
    """`env` for a launch that compiles as a user's run does: XLA's default optimisations, not the suite's
    fast compiles (tests/conftest.py), for launches that time compiling or measure a step's memory."""
    return {k: v for k, v in env.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"}


def without_suite_cache(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the suite's shared compilation cache (tests/conftest.py): a launch then uses the
    command line's own cache, in its workdir, as a user's run does."""
    suite_cache = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")
    return {k: v for k, v in env.items() if not k.startswith(suite_cache)}


@contextlib.contextmanager
def xla_default_optimizations() -> Iterator[None]:
    """Programs compiled in the block are compiled as in real runs, not as the tests' fast compiles: with
    XLA's default optimisations (only XLA's CPU fusion emitters stay off: XLA_FLAGS are read once per
    process, see tests/conftest.py), and the train state's initialiser with the options `create_train_state`
    gives it on the CPU (`steps.RUN_ONCE_CPU_COMPILER_OPTIONS`).

    `jax_disable_most_optimizations` is read when a program is compiled and is no part of JAX's cache
    keys, so the caches are cleared on the way in and out, and the test processes' persistent cache
    (tests/conftest.py) is off in the block: no program compiled on one path runs on the other.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    fast_outside = jax.config.values["jax_disable_most_optimizations"]
    cache_outside = jax.config.values["jax_compilation_cache_dir"]
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", False)
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()  # The cache is set up once per process, at the first compile.
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", fast_outside)
        jax.config.update("jax_compilation_cache_dir", cache_outside)
        compilation_cache.reset_cache()
        jax.clear_caches()


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the benchmarks are scripts, not a package), registered under NAME in
    `sys.modules`: its dataclasses look their module up while it loads."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def checkpointer_of(workdir, config):
    """The `Checkpointer` a run of `config` makes in `workdir` (its sections, as `training_setup.setup` reads
    them)."""
    from resnet_scaling import checkpointing
    from resnet_scaling.training import sections

    parts = sections.read(config)
    return checkpointing.Checkpointer(str(workdir), parts.checkpoint, parts.record)
