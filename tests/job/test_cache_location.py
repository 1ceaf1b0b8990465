"""A workdir copied or moved elsewhere keeps its compiled programs: the cache key of a program must not
hold the cache's own path (JAX puts XLA's GPU autotuning cache path into it unless told otherwise)."""

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = """
import sys
import jax
import jax.numpy as jnp
from resnet_scaling import train
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
train.enable_compilation_cache(sys.argv[1])
print(float(jax.jit(lambda x: jnp.sin(x) @ x.T + 1.0)(jnp.ones((64, 64))).sum()))
"""


def _compile_in(cache_dir: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "XLA_FLAGS"))}
    subprocess.run([sys.executable, "-c", PROGRAM, str(cache_dir)], check=True, env={**env, "PYTHONPATH":
                   str(REPO), "JAX_PLATFORMS": "cpu"}, capture_output=True, timeout=300)


def test_a_copied_compilation_cache_is_found_under_its_new_path(tmp_path):
    original = tmp_path / "run" / "compilation_cache"
    _compile_in(original)
    entries = sorted(p.name for p in original.iterdir())
    assert entries, "nothing was cached"
    copy = tmp_path / "copied_run" / "compilation_cache"
    shutil.copytree(original, copy)
    _compile_in(copy)
    # A hit reads the entry; a miss compiles again and writes an entry under another key.
    assert sorted(p.name for p in copy.iterdir()) == entries
