"""The Predictor knows from the run's config what its inputs need: a run on arrays takes them as given, a
run on image files takes the evaluation's centre crop, which `prepare` makes from images of any size."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling.inference.predict import Predictor
from tests.helpers import model_of, tiny_config


def _predictor(**overrides):
    config = tiny_config(**overrides)
    model = model_of(config)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)
    return Predictor(jax.device_get(variables), config)


def test_an_array_run_takes_its_inputs_as_given_and_says_so():
    predictor = _predictor(data__source="arrays")
    assert predictor.preprocessing == "none"
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    np.testing.assert_array_equal(predictor.prepare(list(images)), images)
    assert predictor(images).shape == (3, 10)
    for call in (predictor, functools.partial(predictor.prepare)):
        with pytest.raises(ValueError) as refused:
            call(np.zeros((2, 40, 40, 3), np.uint8))
        message = str(refused.value)
        assert "data.source='arrays'" in message and "no resize or crop" in message
        assert "eval_resize_size" not in message


def test_a_file_run_crops_and_resizes_as_its_evaluation_did():
    predictor = _predictor(data__source="folders", data__eval_resize_size=36)
    assert predictor.preprocessing == "eval_crop"
    # 72 x 48: the evaluation's window is the central 32/36 of the shorter side, 43 x 43 pixels at rows
    # 15-57 and columns 3-45 (ceil of the halved margins). Those pixels are red, the rest blue, so the
    # prepared image is red wherever it samples the window, and only there.
    image = np.zeros((72, 48, 3), np.uint8)
    image[..., 2] = 255
    image[15:58, 3:46] = (255, 0, 0)
    prepared = predictor.prepare([image, image[::-1].copy()])
    assert prepared.shape == (2, 32, 32, 3) and prepared.dtype == np.uint8
    np.testing.assert_array_equal(prepared[0], np.broadcast_to(np.array([255, 0, 0], np.uint8), (32, 32, 3)))
    # One row further out on each side would have brought blue in: the window is exactly that one.
    image[15, 3:46] = image[57, 3:46] = (0, 0, 255)
    assert (predictor.prepare([image])[0, [0, -1], :, 2] > 0).all()
    assert predictor(prepared).shape == (2, 10)
    with pytest.raises(ValueError, match=r"predictor.prepare\(images\) crops and resizes"):
        predictor(np.zeros((1, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8 RGB images"):
        predictor.prepare([np.zeros((40, 40), np.uint8)])


def test_prepare_in_a_fresh_process_prints_nothing_and_loads_keras_only_for_tf_keras(tmp_path):
    """A research script's first `prepare` imports TensorFlow, whose C++ runtime printed its oneDNN and
    logging notices (twice) on the script's stderr; and whose import loaded all of Keras (pandas and
    matplotlib with it), which decoding never uses. The script's own `tf.keras` is still Keras 3."""
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[2]
    # The library first: a bare `import jax` before it prints the lines of JAX's CUDA plugin where the
    # gpu_compile extra is installed on a machine without a GPU (the test extra installs it).
    script = ("from resnet_scaling.inference.predict import Predictor\n"
              "import jax, jax.numpy as jnp, numpy as np\n"
              "from tests.helpers import model_of, tiny_config\n"
              "config = tiny_config(data__source='folders', data__eval_resize_size=36)\n"
              "model = model_of(config)\n"
              "variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)\n"
              "predictor = Predictor(jax.device_get(variables), config)\n"
              "print(predictor.prepare(np.zeros((1, 48, 72, 3), np.uint8)).shape)\n"
              "import os, sys, tensorflow as tf\n"
              "print(sorted({'keras', 'pandas', 'matplotlib'} & set(sys.modules)))\n"
              "print(os.environ.get('TF_USE_LEGACY_KERAS'), tf.keras.layers.Dense.__module__)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, env={**env, "PYTHONPATH": str(repo)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["(1, 32, 32, 3)", "[]", "None keras.src.layers.core.dense"]
    assert proc.stderr == "", proc.stderr
