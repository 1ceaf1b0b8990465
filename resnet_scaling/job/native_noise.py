"""Lines native libraries print while they load, kept off the console: TensorFlow's oneDNN notices
(`tf_import.py`), and on a machine without a GPU, the CUDA plugin's "no driver" lines (the `gpu_compile`
extra), printed by its libraries before any log level applies. Anything else they print is passed on."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator

# absl's preamble to the first line a native library logs before absl's logging is set up.
ABSL_PREAMBLE = "All log messages before absl::InitializeLog() is called"
# The CUDA plugin's libraries, loaded by `import jax` (jaxlib's GPU modules) and by describing GPUs for the
# compiler, each say that there is no driver: true, and no concern of a CPU run or an ahead-of-time compile.
CUDA_PLUGIN_NOISE = (ABSL_PREAMBLE, "Could not find cuda drivers on your machine")


@contextlib.contextmanager
def filtered_stderr(noise: tuple[str, ...]) -> Iterator[None]:
    """Captures what native code writes to file descriptor 2 and passes on the lines without `noise`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not any(n in line for n in noise)))
            sys.stderr.flush()


def cuda_plugin_installed() -> bool:
    """Whether JAX's CUDA 12 plugin is installed (the `gpu_compile` or `gpu` extra)."""
    return importlib.util.find_spec("jax_cuda12_plugin") is not None


def import_jax_quietly() -> None:
    """Imports JAX and registers its plugins, without the CUDA plugin's "no driver" lines
    (CUDA_PLUGIN_NOISE): the commands call it first, the package when a public name first loads.

    The plugin's libraries print at `import jax` and again when JAX registers the plugin, which it does
    at its first backend, wherever that comes (a device count in validation, the mesh, ...). Registering
    here, under the filter, leaves no later moment to print; it creates no backend, so a job can still
    join (`jax.distributed.initialize`) afterwards."""
    if not cuda_plugin_installed() or "jax_cuda12_plugin" in sys.modules:
        return
    with filtered_stderr(CUDA_PLUGIN_NOISE):
        import jax  # noqa: F401
        from jax._src import xla_bridge

        register = getattr(xla_bridge, "_discover_and_register_pjrt_plugins", None)  # Private; jax 0.10.
        if register is not None and not xla_bridge.backends_are_initialized():
            register()
