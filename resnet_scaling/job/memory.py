"""Host memory for steps that run on the CPU: keep what a step frees for the next step.

XLA:CPU mallocs each step's temporaries (2.0 GiB for ResNet-50 at batch 16) and frees them at the step's
end; glibc serves blocks that large with a fresh `mmap` and unmaps them on `free`, so every step faults them
back in (~590,000 minor page faults, ~0.9 s of kernel time per step on 2 cores: a quarter of the step).
`keep_freed_memory` sets `mallopt` M_MMAP_MAX=0 and M_TRIM_THRESHOLD=-1: a block comes from the heap of the
thread that asks and stays there for the next request.

That only helps on the main thread (a worker thread's heap is capped at 64 MiB; glibc maps larger blocks
whatever the settings), so the entry points also set `jax_cpu_enable_async_dispatch=False`: a single-device
CPU computation runs on the calling thread (its operations still on XLA's thread pool). ResNet-50, batch 16:
2-20,000 page faults per step instead of ~590,000, 9.9 instead of 7.3 images/sec, resident memory flat at
3.2 GiB over 60 steps as without it (`benchmarks/README.md`). The process keeps the main thread's peak heap
until it exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))  # -1: never trim.


def keep_freed_memory() -> bool:
    """Applies `SETTINGS` with glibc's `mallopt`; returns whether all took (False without glibc), and
    logs which (at INFO). Warns when JAX's asynchronous CPU dispatch is on (module docstring)."""
    if _async_cpu_dispatch():
        logger.warning("keep_freed_memory(): JAX's asynchronous CPU dispatch is on, so steps allocate their "
                       "memory on XLA's threads, which this does not help. Set "
                       "jax.config.update('jax_cpu_enable_async_dispatch', False) before JAX starts.")
    libc_name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(libc_name).mallopt if libc_name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:  # musl, macOS: other allocators, other rules.
        logger.debug("Host memory: no glibc mallopt in this C library; its allocator is left as it is.")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    kept = all([mallopt(param, value) == 1 for param, value in SETTINGS])
    if kept:  # An allocator setting, not news for the console: the debug log says it.
        logger.debug("Host memory: what a step frees is kept for the next (glibc mallopt).")
    return kept


def _async_cpu_dispatch() -> bool:
    """Whether JAX runs single-device CPU computations on its own threads (its default)."""
    jax_module = sys.modules.get("jax")
    if jax_module is None:
        return True
    return bool(jax_module.config.values.get("jax_cpu_enable_async_dispatch", True))
