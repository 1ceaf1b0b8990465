"""Host memory for steps that run on the CPU: keep what a step frees for the next step.

XLA:CPU allocates each step's temporaries (2.0 GiB for ResNet-50 at batch 16) with `malloc` and frees them
when the step ends. glibc serves a request that large with a fresh `mmap` and unmaps it on `free`, so every
step faults its temporaries back in page by page: measured ~590,000 minor page faults and ~0.9 s of kernel
time per ResNet-50 step on 2 cores, a quarter of the step. `keep_freed_memory` tells glibc never to use
`mmap` for large blocks and never to hand freed memory back to the kernel (`mallopt`: M_MMAP_MAX=0,
M_TRIM_THRESHOLD=-1), so a block comes from the heap of the thread that asks and stays there for the
next request.

That only helps if the step's temporaries are allocated on the main thread: a worker thread's heap is
capped at 64 MiB, and glibc maps larger blocks whatever the settings. So the entry points also turn off
JAX's asynchronous CPU dispatch (`jax_cpu_enable_async_dispatch=False`), which runs a single-device CPU
computation on the calling thread; its operations still run on XLA's thread pool. Measured on ResNet-50
at batch 16: 2-20,000 page faults per step instead of ~590,000, 9.9 instead of 7.3 images/sec, and
resident memory flat at 3.2 GiB over 60 steps, as without the setting (`benchmarks/README.md`). The
process keeps the main thread's peak heap until it exits.
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
    logs which (at INFO).

    Warns when JAX's asynchronous CPU dispatch is on: steps then allocate on XLA's threads, which this
    does not help. Entry points set `jax_cpu_enable_async_dispatch=False` before JAX starts a backend.
    """
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
        logger.info("Host memory: no glibc mallopt in this C library; its allocator is left as it is.")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    kept = all([mallopt(param, value) == 1 for param, value in SETTINGS])
    if kept:
        logger.info("Host memory: what a step frees is kept for the next (glibc mallopt).")
    return kept


def _async_cpu_dispatch() -> bool:
    """Whether JAX runs single-device CPU computations on its own threads (its default)."""
    jax_module = sys.modules.get("jax")
    if jax_module is None:
        return True
    return bool(jax_module.config.values.get("jax_cpu_enable_async_dispatch", True))
