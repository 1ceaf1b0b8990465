"""Image preprocessing in TensorFlow ops, as the ResNet-50 v1.5 reference does it.

Training: decode only a random crop of the JPEG (`decode_and_crop_jpeg`: libjpeg skips the rest), with the
crop's area and aspect ratio drawn from ranges, falling back to a centre crop when no window fits; resize
to the training size; random horizontal flip. Evaluation: a centre crop that is `image_size /
eval_resize_size` of the shorter side, resized to `image_size` (the same pixels as resizing the shorter
side to 256 and cutting the central 224x224, in one resize instead of two). Output is uint8: the device
normalises inside the jitted step.

Randomness is stateless, seeded per image, so an image gets the same crop and flip whichever thread
decodes it and whether the run was restarted or not. Files that are not JPEGs (a PNG named .JPEG, as
ImageNet has) take a slower full decode with the same crop; CMYK and greyscale JPEGs come out as RGB.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from resnet_scaling.data.base import RESIZE_METHODS


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """How images become model inputs (see `config.data`)."""

    image_size: int = 224
    crop_area_range: tuple[float, float] = (0.08, 1.0)  # Fraction of the image's area; MLPerf: 0.05.
    crop_aspect_range: tuple[float, float] = (3 / 4, 4 / 3)
    crop_attempts: int = 10  # Windows tried before falling back to the centre crop.
    random_flip: bool = True
    eval_resize_size: int = 256  # The shorter side before the evaluation centre crop.
    resize_method: str = "bilinear"  # One of RESIZE_METHODS.

    def __post_init__(self):
        if self.resize_method not in RESIZE_METHODS:
            raise ValueError(f"resize_method {self.resize_method!r}: choose one of "
                             f"{', '.join(RESIZE_METHODS)}.")


def image_shape(image_bytes: tf.Tensor) -> tf.Tensor:
    """[height, width, channels] of an encoded image; reads only the header of a JPEG."""
    return tf.cond(
        tf.io.is_jpeg(image_bytes),
        lambda: tf.io.extract_jpeg_shape(image_bytes),
        lambda: tf.shape(_decode_any(image_bytes)),
    )


def decode_and_crop(image_bytes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """uint8 RGB pixels of `window` = [offset_y, offset_x, height, width]; JPEGs decode only the window."""

    def crop_other():
        image = _decode_any(image_bytes)
        return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])

    image = tf.cond(
        tf.io.is_jpeg(image_bytes),
        lambda: tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3),
        crop_other,
    )
    image.set_shape([None, None, 3])
    return image


def random_crop_window(shape: tf.Tensor, seed: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """A random [offset_y, offset_x, height, width] window, or the centre crop when none fits."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
        seed=seed,
        min_object_covered=0.1,  # As the reference; the area range is what binds.
        aspect_ratio_range=config.crop_aspect_range,
        area_range=config.crop_area_range,
        max_attempts=config.crop_attempts,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    # When every attempt fails the op returns the whole image; the reference then takes the centre crop.
    failed = tf.reduce_all(tf.equal(size[:2], shape[:2]))
    return tf.cond(failed, lambda: center_crop_window(shape, config), lambda: window)


def center_crop_window(shape: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """The central square that is `image_size / eval_resize_size` of the shorter side."""
    height, width = shape[0], shape[1]
    fraction = config.image_size / config.eval_resize_size
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * fraction + 0.5, tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def resize(image: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """Resizes to image_size x image_size and rounds back to uint8."""
    size = [config.image_size, config.image_size]
    resized = tf.image.resize(image, size, method=config.resize_method)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def preprocess_for_train(image_bytes: tf.Tensor, seed: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """Random-area crop, resize and flip of one encoded image: uint8 [image_size, image_size, 3].

    Args:
      image_bytes: a scalar string tensor holding a JPEG (or PNG, GIF, BMP) file.
      seed: int32 [2], the image's own stateless seed.
      config: the preprocessing settings.
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    window = random_crop_window(image_shape(image_bytes), crop_seed, config)
    image = resize(decode_and_crop(image_bytes, window), config)
    if config.random_flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def preprocess_for_eval(image_bytes: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """Centre crop and resize of one encoded image: uint8 [image_size, image_size, 3]."""
    window = center_crop_window(image_shape(image_bytes), config)
    return resize(decode_and_crop(image_bytes, window), config)


def _decode_any(image_bytes: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image
