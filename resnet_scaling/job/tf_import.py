"""TensorFlow as this library uses it: on the host only (tf.data decoding, `gs://` paths through gfile)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

from resnet_scaling.job import native_noise

# Printed by TensorFlow's C++ runtime at import, before TF_CPP_MIN_LOG_LEVEL applies (a oneDNN notice per
# library; where CUDA libraries are installed without a GPU, its "no driver" lines): dropped from the
# console; anything else printed during the import is passed on.
_IMPORT_NOISE = (*native_noise.CUDA_PLUGIN_NOISE, "oneDNN custom operations are on")


def import_tensorflow_for_host():
    """Imports TensorFlow with the GPUs hidden from it, so that JAX keeps all of their memory.

    TensorFlow maps most of a GPU's memory when it first runs an op there; it never needs to here. Its
    C++ INFO lines are kept off the console unless TF_CPP_MIN_LOG_LEVEL=0 asks for them, and its eager
    import of Keras is skipped (`_without_eager_keras`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if "tensorflow" in sys.modules:
        import tensorflow as tf
    elif os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0":
        with _without_eager_keras():
            import tensorflow as tf
    else:
        with native_noise.filtered_stderr(_IMPORT_NOISE), _without_eager_keras():
            import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already set up its devices (the caller ran an op first): leave it.
        pass
    return tf


@contextlib.contextmanager
def _without_eager_keras() -> Iterator[None]:
    """TensorFlow's import without its eager import of Keras, which tf.data, tf.io and TFDS never use.

    `import tensorflow` imports all of Keras 3 (and with it pandas and matplotlib), a third of the import's
    time, unless TF_USE_LEGACY_KERAS asks for tf_keras, which it then tries and skips where it is not
    installed. Set for the import only, and only where tf_keras is absent: `tf.keras` reads the variable
    again when first used, so a user's `tf.keras` is still Keras 3."""
    if "TF_USE_LEGACY_KERAS" in os.environ or importlib.util.find_spec("tf_keras") is not None:
        yield
        return
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    try:
        yield
    finally:
        del os.environ["TF_USE_LEGACY_KERAS"]
