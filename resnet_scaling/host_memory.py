"""Host memory for steps that run on the CPU: keep what a step frees for the next step (opt-in).

XLA:CPU allocates each step's temporaries (2.0 GiB for ResNet-50 at batch 16) with `malloc` on one of its
worker threads and frees them when the step ends. glibc serves a request that large with a fresh `mmap`
(a worker thread's arena cannot hold it) and unmaps it on `free`, so every step faults its temporaries
back in page by page: measured ~590,000 minor page faults and ~0.9 s of kernel time per ResNet-50 step on
2 cores, a quarter of the step. `keep_freed_memory` tells glibc to serve every thread from its main heap,
never by `mmap`, and never to hand freed memory back to the kernel (`mallopt`: M_ARENA_MAX=1, M_MMAP_MAX=0,
M_TRIM_THRESHOLD=-1); after the first steps a step takes no page faults (`benchmarks/README.md`).

The price, and why it is not the default: the process keeps its peak host memory until it exits, and more,
because small allocations that land in a freed block split it and the next step's block is then taken
from fresh memory: ResNet-50 at batch 16 grew from 3.1 GiB resident to 5.0 GiB and then 7.0 GiB within
its first 17 steps, and held 7.0 GiB to the end of a 150-step run (3.2 GiB without). All threads share
one heap's lock. It has to run before JAX starts its threads (a thread keeps the arena it first
allocated from): `python -m resnet_scaling.train --keep_freed_memory` does that; code that imports the
library calls it first thing.
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
M_ARENA_MAX = -8
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))  # -1: never trim.


def keep_freed_memory() -> bool:
    """Applies `SETTINGS` with glibc's `mallopt`; returns whether all took (False without glibc).

    Called after JAX has started a backend it still applies, but XLA's threads keep the arenas they
    already have, so it usually changes nothing; that case is logged as a warning.
    """
    if _jax_backends_started():
        logger.warning("keep_freed_memory() was called after JAX started its backend: XLA's threads keep "
                       "the heaps they already use, so steps will likely still fault their memory in. "
                       "Call it before anything touches JAX's devices.")
    libc_name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(libc_name).mallopt if libc_name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:  # musl, macOS: other allocators, other rules.
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in SETTINGS])


def _jax_backends_started() -> bool:
    jax_module = sys.modules.get("jax")
    if jax_module is None:
        return False
    try:
        from jax._src import xla_bridge  # No public way to ask; the answer only adds a warning.

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False
