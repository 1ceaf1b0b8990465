"""Image preprocessing in TensorFlow ops, as the ResNet-50 v1.5 reference does it.

Training decodes only a random crop of the JPEG (`decode_and_crop_jpeg`: libjpeg stops after the window's last
row and skips the inverse DCT and colour conversion outside it). The evaluation centre crop, resized once,
gives the same pixels as resizing the shorter side to 256 and cutting the central 224x224. Output is uint8:
the device normalises inside the jitted step.

Large JPEG windows decode at 1/2, 1/4 or 1/8 scale (`decode_window`): a smaller inverse DCT per block, less to
resize. Pixels differ from a full-scale decode by the filter (the DCT's, not bilinear's) and by at most half a
scaled pixel at the window's edges. Randomness is stateless, seeded per image: the same crop and flip whatever
the thread, restarted or not. Non-JPEGs (a PNG named .JPEG, as ImageNet has) take a full decode with the same
crop; CMYK and greyscale JPEGs come out as RGB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from resnet_scaling.config.fields import RESIZE_METHODS

# The reduced scales libjpeg's `ratio` offers, smallest reduction first.
DCT_SCALES = (1, 2, 4, 8)


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
    # Large JPEG windows decode at 1/2, 1/4 or 1/8 scale (`decode_window`); False: always full scale.
    decode_at_reduced_scale: bool = True

    def __post_init__(self):
        if self.resize_method not in RESIZE_METHODS:
            raise ValueError(f"resize_method {self.resize_method!r}: choose one of "
                             f"{', '.join(RESIZE_METHODS)}.")


def decode_window(image_bytes: tf.Tensor, choose_window: Callable[[tf.Tensor], tf.Tensor],
                  config: PreprocessConfig) -> tf.Tensor:
    """uint8 RGB pixels of the window `choose_window` picks from the image's [height, width, channels].

    JPEGs: shape from the header, only the window decoded, at 1/r scale (about 1/r the window's size) for
    the largest r in DCT_SCALES keeping the scaled window's shorter side >= `image_size` (r = 1 if
    `decode_at_reduced_scale` is off). Other formats are decoded whole and cropped.

    Args:
      image_bytes: a scalar string tensor holding a JPEG (or PNG, GIF, BMP) file.
      choose_window: maps the image's shape to an int32 [offset_y, offset_x, height, width] window.
    """
    is_jpeg = tf.io.is_jpeg(image_bytes)
    # One branch op for both the format and the scale: in a tf.data function each branch op costs tens of
    # microseconds. So the JPEG window is chosen before branching, from a header that cannot fail to parse.
    shape = tf.io.extract_jpeg_shape(tf.where(is_jpeg, image_bytes, _stand_in_jpeg()))
    window = choose_window(shape)

    def other():
        image = _decode_any(image_bytes)
        window = choose_window(tf.shape(image))
        return tf.slice(image, tf.stack([window[0], window[1], 0]), tf.stack([window[2], window[3], 3]))

    def jpeg_at_scale(r):
        def decode():
            if r == 1:
                return tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
            # Edges rounded to the nearest scaled pixel; the bottom-right stays inside the ceil(H / r) x
            # ceil(W / r) image libjpeg produces.
            top, left = (window[0] + r // 2) // r, (window[1] + r // 2) // r
            bottom = (window[0] + window[2] + r // 2) // r
            right = (window[1] + window[3] + r // 2) // r
            scaled = tf.stack([top, left, bottom - top, right - left])
            return tf.io.decode_and_crop_jpeg(image_bytes, scaled, channels=3, ratio=r)
        return decode

    scales = DCT_SCALES if config.decode_at_reduced_scale else DCT_SCALES[:1]
    shorter_side = tf.minimum(window[2], window[3])
    thresholds = tf.constant([r * config.image_size for r in scales[1:]], tf.int32, [len(scales) - 1])
    scale_index = tf.reduce_sum(tf.cast(shorter_side >= thresholds, tf.int32))
    branch = tf.where(is_jpeg, 1 + scale_index, 0)
    image = tf.switch_case(branch, [other] + [jpeg_at_scale(r) for r in scales])
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
    return tf.where(failed, center_crop_window(shape, config), window)


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
    # Cast and float kernel: the uint8 kernel's values, ~25% less CPU (it converts every neighbour it reads).
    resized = tf.image.resize(tf.cast(image, tf.float32), size, method=config.resize_method)
    if config.resize_method == "bicubic":  # Cubic weights overshoot [0, 255]; bilinear and area cannot.
        resized = tf.clip_by_value(resized, 0.0, 255.0)
    return tf.cast(resized + 0.5, tf.uint8)  # The cast truncates: + 0.5 rounds to the nearest.


def preprocess_for_train(image_bytes: tf.Tensor, seed: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """Random-area crop, resize and flip of one encoded image: uint8 [image_size, image_size, 3].

    Args:
      image_bytes: a scalar string tensor holding a JPEG (or PNG, GIF, BMP) file.
      seed: int32 [2], the image's own stateless seed.
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = decode_window(image_bytes, lambda shape: random_crop_window(shape, crop_seed, config), config)
    image = resize(image, config)
    if config.random_flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def preprocess_for_eval(image_bytes: tf.Tensor, config: PreprocessConfig) -> tf.Tensor:
    """Centre crop and resize of one encoded image: uint8 [image_size, image_size, 3]."""
    image = decode_window(image_bytes, lambda shape: center_crop_window(shape, config), config)
    return resize(image, config)


def _stand_in_jpeg() -> tf.Tensor:
    """A 1x1 JPEG: what the header reader gets instead of a file that is not a JPEG."""
    with tf.init_scope():  # Encoded once per trace, a constant in the traced function.
        return tf.constant(tf.io.encode_jpeg(tf.zeros([1, 1, 3], tf.uint8)).numpy())


def _decode_any(image_bytes: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image
