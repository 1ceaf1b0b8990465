"""What a command (`train`, `evaluate`; `compile`, `planner`) does before JAX starts a backend, in one place.

The order matters: the platform, XLA's flags and the CPU's dispatch mode are read once, when the first
backend starts, and a multi-process job must form before any process computes anything.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import jax

from resnet_scaling.job import distributed, native_noise, xla_flags
from resnet_scaling.job import memory as host_memory

logger = logging.getLogger(__name__)


def start_host_compiler() -> None:
    """For the commands that compile for a TPU topology on this host (`compile`, `planner`): the compiler
    runs on the host, so never initialise a local accelerator (a CPU machine has none), and do not take
    libtpu's single-process lock: compiling needs no TPU, and a run may be using it."""
    jax.config.update("jax_platforms", "cpu")
    # A topology's compiled program can be written to JAX's persistent cache (JAX_COMPILATION_CACHE_DIR)
    # but not read back without a TPU client: each later compile warns "INVALID_ARGUMENT: PjRtCompiler
    # must be constructed with a Client" and compiles again. The cache cannot help here, so it stays off.
    jax.config.update("jax_enable_compilation_cache", False)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if xla_flags.detect_backend(env={}) != "tpu":  # By the device files alone: a TPU VM has its metadata.
        # libtpu starts by reading this host's place in its slice from the TPU VM's metadata. Elsewhere it
        # finds none and, before its logging is set up (no log-level variable reaches it), prints five lines
        # ("could not determine TPU accelerator type", "E0000 ... INVALID_ARGUMENT: unexpected worker
        # hostname", a "Source Location Trace"), then describes the topology anyway. A one-host slice's
        # values keep it quiet; the compiled programs are the same
        # (tests/planning/test_compile.py compares them).
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")


def start_process(*, throughput_flags: bool = True, keep_freed_memory: bool = True,
                  coordinator_address: str | None = None, num_processes: int | None = None,
                  process_id: int | None = None,
                  initialization_timeout_sec: int | None = None,
                  peer_timeout_sec: float | None = None,
                  complete_checkpoints: Callable[[], list[int]] | None = None
                  ) -> distributed.DistributedSettings | None:
    """Chooses the platform, adds the throughput flags, sets up the CPU's memory reuse and joins a
    multi-process job (settings left None come from the environment, the cluster or the defaults of
    `distributed.maybe_initialize`).

    Returns:
      The job joined (for `distributed.leave`), or None when this process runs alone.

    Raises:
      SystemExit: one `error:` line where the job's settings are incomplete or it does not form.
    """
    cpu_only = xla_flags.no_accelerator_found()
    if cpu_only:  # No TPU probing (and its error lines) on a CPU machine.
        jax.config.update("jax_platforms", "cpu")
    if throughput_flags and (added := xla_flags.apply_throughput_flags()):
        logger.info("Throughput flags added: %s", added)
    if keep_freed_memory and xla_flags.detect_backend() == "cpu":
        # Steps then run on this thread, whose heap keeps what a step frees for the next (job/memory.py).
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        host_memory.keep_freed_memory()
    try:
        job = distributed.maybe_initialize(coordinator_address, num_processes, process_id,
                                           initialization_timeout_sec, peer_timeout_sec=peer_timeout_sec,
                                           complete_checkpoints=complete_checkpoints)
    except (ValueError, RuntimeError) as e:  # Incomplete or inconsistent settings; a job that did not form.
        raise SystemExit(f"error: {e}") from None
    if cpu_only and native_noise.cuda_plugin_installed():
        # JAX loads every installed plugin's library as its backends start, the CUDA plugin's too (which
        # then says it found no driver) though only the CPU's starts: started here (after the job formed,
        # as a job needs), without that line.
        with native_noise.filtered_stderr(native_noise.CUDA_PLUGIN_NOISE):
            jax.devices()
    return job
