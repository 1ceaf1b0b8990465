"""host_memory.keep_freed_memory: a large block freed on the main thread is reused without page faults."""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import users_compile

# In a fresh process (glibc settings are process-wide): the main thread mallocs 256 MiB, touches every
# page and frees it, three times; the minor page faults of each round.
_PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json, resource, sys
    if sys.argv[1] == "keep":
        from resnet_scaling.job import memory as host_memory
        assert host_memory.keep_freed_memory()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    size, faults = 256 * 2**20, []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps(faults))
""")

needs_glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
                                 reason="glibc's mallopt")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    # A user's environment: one CPU device, XLA's default optimisations (not the suite's 8 fake devices).
    env = users_compile({k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                          env={**env, "JAX_PLATFORMS": "cpu"})


@needs_glibc
def test_a_freed_block_is_reused_without_page_faults():
    pages = 256 * 2**20 // 4096
    default = json.loads(_run(_PROBE, "default").stdout.splitlines()[-1])
    kept = json.loads(_run(_PROBE, "keep").stdout.splitlines()[-1])
    # glibc's default maps a block this size afresh each time: every round faults every page in again.
    assert min(default) > pages // 2, default
    # Kept: only the first round faults the pages in; later rounds reuse them.
    assert kept[0] > pages // 2 and max(kept[1:]) < pages // 100, kept


@needs_glibc
def test_it_warns_unless_jax_runs_cpu_steps_on_the_calling_thread():
    script = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING)
        import jax
        from resnet_scaling.job import memory as host_memory
        if sys.argv[1] == "sync":
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        host_memory.keep_freed_memory()
    """)
    assert "asynchronous CPU dispatch is on" not in _run(script, "sync").stderr
    assert _run(script, "async").stderr.count("asynchronous CPU dispatch is on") == 1


def test_the_training_step_takes_no_page_faults_once_warm(tmp_path):
    """End to end, as the entry point sets it up: a CPU step that frees a large block of temporaries."""
    script = textwrap.dedent("""
        import json, resource, sys
        import jax, jax.numpy as jnp
        from resnet_scaling.job import memory as host_memory
        if sys.argv[1] == "keep":
            jax.config.update("jax_cpu_enable_async_dispatch", False)
            assert host_memory.keep_freed_memory()
        # Temporaries of 5,000 x 5,000 float32 (95 MiB: above glibc's largest mmap threshold, 32 MiB, so
        # by default each is mapped afresh) that XLA cannot fuse away (each cumulative sum feeds a
        # reduction), made cheaply: no matrix products, whose cost would dwarf the allocations measured.
        step = jax.jit(lambda x: jnp.cumsum(jnp.tanh(x), axis=0).sum()
                       + jnp.cumsum(jnp.tanh(x.T), axis=1).sum())
        x = jnp.ones((5000, 5000))
        faults = []
        for _ in range(int(sys.argv[2])):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step(x).block_until_ready()
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(json.dumps(faults))
    """)
    # A call can fault the temporaries in once more when it runs on a thread whose glibc arena has not
    # grown yet: each arena grows once, and the step runs on the caller's thread or one of XLA's (one a
    # core). So after 2 warm-up calls, twice as many calls as those threads: at most half of them fault.
    threads = (os.cpu_count() or 1) + 1
    calls = 2 + 2 * threads
    default = json.loads(_run(script, "default", str(calls)).stdout.splitlines()[-1])
    kept = json.loads(_run(script, "keep", str(calls)).stdout.splitlines()[-1])
    # With glibc's defaults every call faults in at least two temporaries' pages afresh (measured: 74,800
    # faults a call, three); kept, none once the heap has grown, but for the threads' first calls above (a
    # loaded 2-core machine showed 2 of 6). (4,000-pixel temporaries, 61 MiB, were faulted in again every
    # other call under load.)
    pages_per_temporary = 5000 * 5000 * 4 // 4096
    assert min(default[2:]) > 2 * pages_per_temporary, default
    quiet = [f for f in kept[2:] if f * 10 < min(default[2:])]
    assert len(quiet) >= threads, (kept, default)
