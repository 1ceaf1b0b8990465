"""Image preprocessing: crop ranges, the centre-crop fallback, evaluation crops, awkward files."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from resnet_scaling.data import preprocessing
from tests.image_files import encode

CONFIG = preprocessing.PreprocessConfig()


def _gradient(height=375, width=500):
    yy, xx = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    return np.stack([yy * 255, xx * 255, (1 - yy) * 200], -1).astype(np.uint8)


def test_random_crops_respect_the_area_and_aspect_ranges():
    shape = tf.constant([375, 500, 3])
    centre = preprocessing.center_crop_window(shape, CONFIG).numpy()
    areas, fallbacks = [], 0
    for seed in range(200):
        window = preprocessing.random_crop_window(shape, tf.constant([seed, 7]), CONFIG).numpy()
        _, _, height, width = window
        if (window == centre).all():
            fallbacks += 1
            continue
        areas.append(height * width / (375 * 500))
        # Whole pixels round the sampled window: allow a pixel's worth on the aspect ratio.
        assert 3 / 4 - 0.02 <= width / height <= 4 / 3 + 0.02, window
    assert 0.08 - 0.002 <= min(areas) and max(areas) <= 1.0
    assert np.std(areas) > 0.1 and fallbacks < 20  # Spread over the range, rarely the fallback.


def test_an_impossible_crop_falls_back_to_the_centre_crop():
    config = preprocessing.PreprocessConfig(crop_area_range=(0.5, 1.0))
    shape = tf.constant([10, 1000, 3])  # No 3/4..4/3 window covers half of a 10x1000 strip.
    window = preprocessing.random_crop_window(shape, tf.constant([1, 2]), config).numpy()
    np.testing.assert_array_equal(window, preprocessing.center_crop_window(shape, config).numpy())
    np.testing.assert_array_equal(window, [1, 496, 9, 9])  # 224/256 of the 10-pixel side, centred.


def test_evaluation_matches_resize_to_256_then_centre_crop_224():
    image = _gradient()
    ours = preprocessing.preprocess_for_eval(tf.constant(encode(image, quality=100)), CONFIG).numpy()
    # Reference: the two-step recipe on the decoded pixels, with PIL.
    decoded = np.asarray(Image.open(io.BytesIO(encode(image, quality=100))))
    resized = np.asarray(Image.fromarray(decoded).resize((341, 256), Image.BILINEAR)).astype(float)
    top, left = (256 - 224) // 2, (341 - 224) // 2
    reference = resized[top:top + 224, left:left + 224]
    assert ours.dtype == np.uint8 and ours.shape == (224, 224, 3)
    assert np.abs(ours - reference).mean() < 1.5


def test_training_output_is_uint8_at_the_training_size_and_a_function_of_the_seed():
    image_bytes = tf.constant(encode(_gradient()))
    first = preprocessing.preprocess_for_train(image_bytes, tf.constant([1, 2], tf.int64), CONFIG)
    again = preprocessing.preprocess_for_train(image_bytes, tf.constant([1, 2], tf.int64), CONFIG)
    other = preprocessing.preprocess_for_train(image_bytes, tf.constant([1, 3], tf.int64), CONFIG)
    assert first.dtype == tf.uint8 and first.shape == (224, 224, 3)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("fmt,mode", [("JPEG", "RGB"), ("JPEG", "CMYK"), ("JPEG", "L"), ("PNG", "RGB")])
def test_cmyk_greyscale_and_png_files_decode_to_rgb(fmt, mode):
    # `encode` writes the bytes; the name a file carries (.JPEG) plays no part in decoding.
    colour = np.full((60, 80, 3), (160, 60, 200), np.uint8)
    image_bytes = tf.constant(encode(colour, fmt=fmt, mode=mode))
    for out in (preprocessing.preprocess_for_eval(image_bytes, CONFIG),
                preprocessing.preprocess_for_train(image_bytes, tf.constant([0, 1], tf.int64), CONFIG)):
        out = out.numpy().reshape(-1, 3).mean(0)
        if mode == "L":
            grey = np.dot(colour[0, 0], [0.299, 0.587, 0.114])
            np.testing.assert_allclose(out, [grey] * 3, atol=3)
        else:
            np.testing.assert_allclose(out, colour[0, 0], atol=3)


def test_truncated_jpeg_raises_in_decoding():
    image_bytes = encode(np.random.default_rng(0).integers(0, 256, (100, 100, 3), dtype=np.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError):
        preprocessing.preprocess_for_eval(tf.constant(image_bytes[: len(image_bytes) // 2]), CONFIG)
