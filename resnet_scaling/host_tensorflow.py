"""TensorFlow as this library uses it: on the host only (tf.data decoding, TensorBoard event files)."""

from __future__ import annotations


def import_tensorflow_for_host():
    """Imports TensorFlow with the GPUs hidden from it, so that JAX keeps all of their memory.

    TensorFlow maps most of a GPU's memory when it first runs an op there; it never needs to here.
    """
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already set up its devices (the caller ran an op first): leave it.
        pass
    return tf
