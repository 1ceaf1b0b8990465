"""TensorFlow as this library uses it: on the host only (tf.data decoding, TensorBoard event files)."""

from __future__ import annotations

import os
import sys

from resnet_scaling.job import native_noise

# Printed by TensorFlow's C++ runtime at import, before TF_CPP_MIN_LOG_LEVEL applies (a oneDNN notice per
# library; where CUDA libraries are installed without a GPU, its "no driver" lines): dropped from the
# console; anything else printed during the import is passed on.
_IMPORT_NOISE = (*native_noise.CUDA_PLUGIN_NOISE, "oneDNN custom operations are on")


def import_tensorflow_for_host():
    """Imports TensorFlow with the GPUs hidden from it, so that JAX keeps all of their memory.

    TensorFlow maps most of a GPU's memory when it first runs an op there; it never needs to here. Its
    C++ INFO lines are kept off the console unless TF_CPP_MIN_LOG_LEVEL=0 asks for them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if "tensorflow" in sys.modules or os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0":
        import tensorflow as tf
    else:
        with native_noise.filtered_stderr(_IMPORT_NOISE):
            import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already set up its devices (the caller ran an op first): leave it.
        pass
    return tf
