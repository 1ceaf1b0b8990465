"""Image preprocessing: crop ranges, the centre-crop fallback, evaluation crops, reduced-scale decoding of
large windows, awkward files."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from resnet_scaling.data import preprocessing
from tests.image_files import encode

CONFIG = preprocessing.PreprocessConfig()
FULL_SCALE = preprocessing.PreprocessConfig(decode_at_reduced_scale=False)


def _gradient(height=375, width=500):
    yy, xx = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    return np.stack([yy * 255, xx * 255, (1 - yy) * 200], -1).astype(np.uint8)


def _scene(height, width):
    """A gradient with hard-edged blocks: a window decoded a pixel off would show at the edges."""
    image = _gradient(height, width)
    image[height // 5: height // 2, width // 4: width // 2] = (30, 220, 90)
    image[height // 2: height * 4 // 5, width // 2: width * 3 // 4] = (240, 40, 40)
    return image


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


def test_training_output_is_the_random_window_resized_and_flipped_or_not():
    image = _scene(375, 500)
    image_bytes = tf.constant(encode(image, quality=100))
    decoded = tf.io.decode_jpeg(image_bytes, channels=3)
    flips = 0
    for seed in range(8):
        seed = tf.constant([seed, 11], tf.int64)
        ours = preprocessing.preprocess_for_train(image_bytes, seed, CONFIG).numpy().astype(float)
        # Reference: the whole image decoded, the window the image's crop seed draws cut out, resized.
        crop_seed, _ = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        y, x, h, w = preprocessing.random_crop_window(tf.shape(decoded), crop_seed, CONFIG).numpy()
        reference = tf.image.resize(decoded[y:y + h, x:x + w], [224, 224]).numpy()
        errors = [np.abs(ours - reference).mean(), np.abs(ours - reference[:, ::-1]).mean()]
        assert min(errors) < 1.0 < max(errors), errors  # One of the two, clearly.
        flips += errors[1] < errors[0]
    assert 0 < flips < 8


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


# An odd-sized image, so the scaled images libjpeg makes (ceil(H / r) x ceil(W / r)) round up.
_SCENE_HEIGHT, _SCENE_WIDTH = 1803, 1901


@pytest.fixture(scope="module")
def scene_jpeg():
    return tf.constant(encode(_scene(_SCENE_HEIGHT, _SCENE_WIDTH)))


@pytest.mark.parametrize("window,scale", [
    ((100, 200, 447, 900), 1),  # Shorter side under 2 x 224: full scale.
    ((100, 200, 448, 600), 2),
    ((_SCENE_HEIGHT - 601, _SCENE_WIDTH - 451, 601, 451), 2),  # Touching the bottom-right corner.
    ((37, 11, 896, 1200), 4),
    ((_SCENE_HEIGHT - 1001, _SCENE_WIDTH - 1201, 1001, 1201), 4),
    ((0, 0, _SCENE_HEIGHT, _SCENE_WIDTH), 8),
    ((5, 100, 1797, 1801), 8),
])
def test_large_windows_decode_at_reduced_scale_with_the_same_content(scene_jpeg, window, scale):
    window = tf.constant(window, tf.int32)
    reduced = preprocessing.decode_window(scene_jpeg, lambda shape: window, CONFIG)
    full = preprocessing.decode_window(scene_jpeg, lambda shape: window, FULL_SCALE)
    assert reduced.dtype == tf.uint8 and full.shape == (window[2], window[3], 3)
    # 1/scale of the window, give or take the rounding of its edges to whole scaled pixels.
    np.testing.assert_allclose(reduced.shape[:2], np.asarray(full.shape[:2]) / scale, atol=1)
    assert min(reduced.shape[:2]) >= CONFIG.image_size or scale == 1
    ours, reference = preprocessing.resize(reduced, CONFIG), preprocessing.resize(full, CONFIG)
    assert ours.shape == (224, 224, 3) and ours.dtype == tf.uint8
    # Same window, same content: only the downscaling filter and sub-pixel edge rounding differ.
    assert np.abs(ours.numpy().astype(float) - reference.numpy()).mean() < 1.5


def test_training_crops_of_large_images_match_the_full_scale_path(scene_jpeg):
    differ = 0
    for seed in range(12):
        seed = tf.constant([seed, 5], tf.int64)
        ours = preprocessing.preprocess_for_train(scene_jpeg, seed, CONFIG).numpy().astype(float)
        full = preprocessing.preprocess_for_train(scene_jpeg, seed, FULL_SCALE).numpy().astype(float)
        assert ours.shape == (224, 224, 3)
        assert np.abs(ours - full).mean() < 1.5  # Same window, same flip.
        differ += not np.array_equal(ours, full)
    assert differ >= 6  # Most windows of a 1803x1901 image reach 448 pixels: they took the reduced path.


def test_small_windows_decode_exactly_as_at_full_scale():
    image_bytes = tf.constant(encode(_gradient()))  # 375x500: no window reaches 2 x 224 on both sides.
    for seed in range(5):
        seed = tf.constant([seed, 9], tf.int64)
        np.testing.assert_array_equal(preprocessing.preprocess_for_train(image_bytes, seed, CONFIG),
                                      preprocessing.preprocess_for_train(image_bytes, seed, FULL_SCALE))


def test_truncated_jpeg_raises_in_decoding():
    image_bytes = encode(np.random.default_rng(0).integers(0, 256, (100, 100, 3), dtype=np.uint8))
    truncated = tf.constant(image_bytes[: len(image_bytes) // 2])
    with pytest.raises(tf.errors.InvalidArgumentError):
        preprocessing.preprocess_for_eval(truncated, CONFIG)
    with pytest.raises(tf.errors.InvalidArgumentError):
        preprocessing.preprocess_for_train(truncated, tf.constant([0, 1], tf.int64), CONFIG)
