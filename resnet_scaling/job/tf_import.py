"""TensorFlow as this library uses it: on the host only (tf.data decoding, TensorBoard event files)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

# Printed by TensorFlow's C++ runtime at import, before TF_CPP_MIN_LOG_LEVEL applies (a oneDNN notice per
# library): dropped from the console; anything else printed during the import is passed on.
_IMPORT_NOISE = ("All log messages before absl::InitializeLog() is called", "oneDNN custom operations are on")


def import_tensorflow_for_host():
    """Imports TensorFlow with the GPUs hidden from it, so that JAX keeps all of their memory.

    TensorFlow maps most of a GPU's memory when it first runs an op there; it never needs to here. Its
    C++ INFO lines are kept off the console unless TF_CPP_MIN_LOG_LEVEL=0 asks for them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if "tensorflow" in sys.modules or os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0":
        import tensorflow as tf
    else:
        with _filtered_stderr(_IMPORT_NOISE):
            import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already set up its devices (the caller ran an op first): leave it.
        pass
    return tf


@contextlib.contextmanager
def _filtered_stderr(noise: tuple[str, ...]) -> Iterator[None]:
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
