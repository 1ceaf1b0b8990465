"""host_memory.keep_freed_memory: a large block freed by a worker thread is reused without page faults."""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

# In a fresh process (glibc settings are process-wide and must precede other threads): a worker thread
# mallocs 256 MiB, touches every page, frees it, three times; the minor page faults of each round.
_PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json, resource, sys, threading
    if sys.argv[1] == "keep":
        from resnet_scaling import host_memory
        assert host_memory.keep_freed_memory()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    size, faults = 256 * 2**20, []

    def rounds():
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = libc.malloc(size)
            ctypes.memset(block, 1, size)
            libc.free(block)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    worker = threading.Thread(target=rounds)
    worker.start()
    worker.join()
    print(json.dumps(faults))
""")


def _faults_per_round(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
                    reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults():
    pages = 256 * 2**20 // 4096
    default = _faults_per_round("default")
    kept = _faults_per_round("keep")
    # glibc's default maps a block this size afresh each time: every round faults every page in again.
    assert min(default) > pages // 2, default
    # Kept: only the first round faults the pages in; later rounds reuse them.
    assert kept[0] > pages // 2 and max(kept[1:]) < pages // 100, kept


def test_a_call_after_jax_started_says_it_is_too_late():
    """In a fresh process (the setting is process-wide): before any backend, no warning; after, one."""
    script = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING)
        import jax
        from resnet_scaling import host_memory
        if sys.argv[1] == "late":
            jax.config.update("jax_platforms", "cpu")
            jax.devices()
        host_memory.keep_freed_memory()
    """)
    outputs = {}
    for when in ("early", "late"):
        proc = subprocess.run([sys.executable, "-c", script, when], capture_output=True, text=True,
                              check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        outputs[when] = proc.stderr
    assert "after JAX started its backend" not in outputs["early"]
    assert outputs["late"].count("after JAX started its backend") == 1
