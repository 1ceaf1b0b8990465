"""The XLA and libtpu settings that matter for data-parallel ResNet throughput, in one place.

Environment variables read once, when a backend initialises: the entry point applies them before anything
touches JAX (`python -m resnet_scaling.train --nothroughput_flags` turns this off). A flag the user already
put in XLA_FLAGS / LIBTPU_INIT_ARGS wins. Every flag name was checked against the XLA and libtpu this
project pins (an unknown flag aborts start-up; tests/job/test_xla_flags.py checks them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

# TPU (libtpu): overlap the gradient all-reduce with the backward pass and fuse the many per-layer
# reductions of data parallelism into few large ones (the flags MaxText uses for data parallelism).
TPU_FLAGS = (
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
)
# GPU (XLA): hide the gradient all-reduces behind the backward pass, on a high-priority stream of their own.
# XLA's default combining (tens of MiB per call) leaves several calls to overlap; NCCL's defaults suit an
# NVLink node, and multi-node fabric settings (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) belong in launch/.
GPU_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_highest_priority_async_stream=true",
)


# The environment variables each backend gains, before merging; none on the CPU.
_THROUGHPUT_ENV = {"tpu": {"LIBTPU_INIT_ARGS": " ".join(TPU_FLAGS)},
                   "gpu": {"XLA_FLAGS": " ".join(GPU_FLAGS)}}


def detect_backend(env: Mapping[str, str] | None = None, dev_dir: str = "/dev") -> str:
    """The accelerator this process will use, decided before JAX starts: JAX_PLATFORMS if set, else the
    device files present (/dev/accel* or /dev/vfio for TPUs, /dev/nvidia<N> for NVIDIA GPUs: a container
    given only GPU 3 has /dev/nvidia3), else "cpu"."""
    env = os.environ if env is None else env
    platforms = env.get("JAX_PLATFORMS", "").lower()
    if platforms:
        first = platforms.split(",")[0].strip()
        return {"cuda": "gpu", "rocm": "gpu"}.get(first, first)
    names = set(os.listdir(dev_dir)) if os.path.isdir(dev_dir) else set()
    if any(n.startswith("accel") for n in names) or "vfio" in names:
        return "tpu"
    if any(re.fullmatch(r"nvidia\d+", n) for n in names):
        return "gpu"
    return "cpu"


def no_accelerator_found(env: Mapping[str, str] | None = None, dev_dir: str = "/dev") -> bool:
    """Whether no platform was chosen (JAX_PLATFORMS) and no accelerator's device files exist.

    Entry points then pin JAX to the CPU, skipping libtpu's TPU probe (`skip_tpu_probe_without_accelerator`).
    """
    env = os.environ if env is None else env
    return not env.get("JAX_PLATFORMS") and detect_backend(env, dev_dir) == "cpu"


def skip_tpu_probe_without_accelerator() -> bool:
    """Pins JAX to the CPU, as the entry points do, where that cannot change which device it would use:
    no platform chosen (JAX_PLATFORMS, `jax_platforms`), no accelerator's device files, no GPU plugin but
    a CUDA plugin without its GPUs' device files.
    Returns whether it did. (A backend started earlier can then only be the CPU's: no need to ask JAX's
    private `xla_bridge`.)

    The package's one import-time setting: with libtpu installed (the `tpu` and `test` extras), JAX
    otherwise probes for a TPU first, printing five lines of libtpu errors ("INVALID_ARGUMENT: unexpected
    worker hostname ...") in every notebook or script on a machine without one, then falls back to the CPU.
    """
    import importlib.metadata
    import importlib.util
    import pkgutil
    import sys

    jax = sys.modules.get("jax")  # Not imported here: `import resnet_scaling` stays fast (a second less).
    chosen = jax.config.jax_platforms if jax is not None else os.environ.get("JAX_PLATFORMS")
    if chosen or not no_accelerator_found():
        return False
    plugins = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
    if importlib.util.find_spec("jax_plugins"):
        import jax_plugins  # A namespace package: the CUDA plugin's `xla_cuda12` lives in it.

        plugins |= {m.name for m in pkgutil.iter_modules(jax_plugins.__path__)}
    # A ROCm plugin's devices may exist without the files looked for here; a CUDA plugin's have /dev/nvidia<N>
    # (or WSL's /dev/dxg). Without them, the CUDA plugin (the `gpu_compile` extra compiles with it) would
    # only fail to start, in a traceback.
    cuda_only = all("cuda" in name for name in plugins) and not os.path.exists("/dev/dxg")
    if plugins and not cuda_only:
        return False
    if jax is not None:
        jax.config.update("jax_platforms", "cpu")
    else:  # Read by JAX when it is imported.
        os.environ["JAX_PLATFORMS"] = "cpu"
    return True


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def apply_throughput_flags(backend: str | None = None, env: MutableMapping[str, str] | None = None
                           ) -> dict[str, str]:
    """Merges `backend`'s flags (`TPU_FLAGS`, `GPU_FLAGS`) into `env` (default os.environ) without
    overriding the user.

    Flag lists (XLA_FLAGS, LIBTPU_INIT_ARGS) gain only the flags whose names they lack. Returns what was
    added."""
    env = os.environ if env is None else env
    backend = backend or detect_backend(env)
    added: dict[str, str] = {}
    for name, value in _THROUGHPUT_ENV.get(backend, {}).items():
        present = {_flag_name(f) for f in env.get(name, "").split()}
        new = [f for f in value.split() if _flag_name(f) not in present]
        if new:
            env[name] = " ".join([env.get(name, ""), *new]).strip()
            added[name] = " ".join(new)
    return added
