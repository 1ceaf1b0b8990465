"""Inference on uint8 images with a run's parameters, normalised exactly as the train and eval steps do.

    predictor = Predictor.from_workdir("/tmp/run")          # or weights="best"
    logits = predictor(images)                              # uint8 [N, S, S, 3], S = config.data.image_size
    classes = predictor.predict_classes(images)
    labels = predictor.predict_labels(images)               # names: predictor.class_names[classes]
    logits = predictor(predictor.prepare(photos))           # any-size images, cropped as evaluation does

The inputs follow from how the run was trained (`Predictor.preprocessing`): a run on image files evaluated
centre crops resized to `data.image_size`, which `prepare` makes from images of any size; a run on arrays
took them as given, so inputs must be shaped like them. (`model.apply` on raw pixels runs, but answers
mostly wrongly: the network was trained on `steps.normalize_images`' output.)

Class names come with the weights where the data named them: class folders' names (the demo's shapes
too), a TFDS dataset's label names, `config.data.class_names` for arrays; None for synthetic data and
runs exported before names were saved.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from resnet_scaling import checkpointing, models
from resnet_scaling import config as config_lib
from resnet_scaling.training import sections as sections_lib
from resnet_scaling.training import steps

__all__ = ["WEIGHTS", "Predictor"]

WEIGHTS = checkpointing.WEIGHTS  # What a workdir holds: the final parameters, the best evaluation's.
# Data sources whose images reach the model as given (no resize or crop in training or evaluation).
AS_GIVEN_SOURCES = ("arrays", "synthetic")


class Predictor:
    """A run's inference model with its variables and normalisation, the forward pass jitted once.

    Runs on one device whatever the run trained on (no batch-norm groups; batch norm uses its running
    averages, so each image's logits are independent of its batch).

    Attributes:
      image_size: height and width the model takes (`config.data.image_size`).
      mean_rgb, stddev_rgb: the normalisation of `steps.normalize_images` (`config.data`).
      batch_size: the most images one forward pass takes; larger inputs run in chunks.
      preprocessing: what inputs need, as the run's evaluation images had: "eval_crop" (image files: the
        centre crop resized to `image_size`) or "none" (arrays, taken as given).
      class_names: class i's name at i (`predict_labels`, `names_of`), or None where the run's data named
        none.
    """

    def __init__(self, variables: Mapping[str, Any], config: ml_collections.ConfigDict, *,
                 class_names: Sequence[str] | None = None, batch_size: int = 256,
                 device: jax.Device | None = None) -> None:
        """
        Args:
          variables: `{'params': ..., 'batch_stats': ...}`, as `checkpointing.load_exported` returns.
          config: the run's config; fields an older run's lacks take today's defaults.
          class_names: class i's name at i (`checkpointing.load_saved_weights` reads a run's); default
            `config.data.class_names` (an arrays run's), else None.
          batch_size: the most images per forward pass (bounds memory on large inputs).
          device: where to run (default: the first device).
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        self.config = config = config_lib.config_from_saved(config.to_dict())
        parts = sections_lib.read(config)
        self._data = parts.data
        self.model = models.model_from_config(parts.model)
        self.image_size = int(parts.data.image_size)
        self.num_classes = int(parts.model.num_classes)
        if class_names is None:
            class_names = parts.data.class_names
        self.class_names = None if class_names is None else [str(name) for name in class_names]
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for a model of {self.num_classes} "
                             "classes (config.model.num_classes): give one name per class.")
        self.mean_rgb, self.stddev_rgb = parts.step.mean_rgb, parts.step.stddev_rgb
        self.batch_size = int(batch_size)
        self.preprocessing = "none" if parts.data.source in AS_GIVEN_SOURCES else "eval_crop"
        self._device = device if device is not None else jax.devices()[0]
        self.variables = jax.device_put({"params": variables["params"],
                                         "batch_stats": variables["batch_stats"]}, self._device)
        # The variables are an argument, not constants baked into the program: compiles stay small.
        self._forward = jax.jit(functools.partial(_forward, model=self.model, mean_rgb=self.mean_rgb,
                                                  stddev_rgb=self.stddev_rgb))

    @classmethod
    def from_workdir(cls, path: str, weights: str = "export", **kwargs: Any) -> Predictor:
        """The predictor of a run's final (`weights="export"`) or best (`"best"`) parameters.

        Args:
          path: a workdir, or directly its `export/` or one of its checkpoints (then `weights` is ignored).
          weights: "export" or "best".
          **kwargs: `batch_size`, `device`.
        """
        saved = checkpointing.load_saved_weights(path, weights)
        return cls(saved.variables, saved.config, class_names=saved.class_names, **kwargs)

    def __call__(self, images: np.ndarray | jax.Array) -> np.ndarray:
        """Logits, float32 [N, num_classes], of uint8 RGB images [N, S, S, 3] (S: `image_size`)."""
        images = self._check(images)
        logits = np.empty((len(images), self.num_classes), np.float32)
        for start in range(0, len(images), self.batch_size):
            chunk = images[start:start + self.batch_size]
            # Padded up to a power of two: a few compiled shapes serve every input size.
            size = min(self.batch_size, 1 << (len(chunk) - 1).bit_length())
            padded = np.zeros((size, *chunk.shape[1:]), np.uint8)
            padded[:len(chunk)] = chunk
            out = self._forward(self.variables, jax.device_put(padded, self._device))
            logits[start:start + len(chunk)] = np.asarray(out)[:len(chunk)]
        return logits

    def prepare(self, images: Any) -> np.ndarray:
        """The model's inputs, uint8 [N, S, S, 3], from uint8 RGB images [H, W, 3] of any size, made as the
        run's evaluation made them (`preprocessing`); a run on arrays takes only S x S images, unchanged."""
        images = [np.asarray(image) for image in images]
        for image in images:
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
                raise ValueError(f"prepare takes uint8 RGB images [H, W, 3], got {image.dtype} "
                                 f"{tuple(image.shape)}.")
        size = self.image_size
        if self.preprocessing == "none":
            wrong = [tuple(image.shape) for image in images if image.shape != (size, size, 3)]
            if wrong:
                raise ValueError(self._as_given_message(wrong[0]))
            return np.stack(images) if images else np.zeros((0, size, size, 3), np.uint8)
        from resnet_scaling.job import tf_import

        tf_import.import_tensorflow_for_host()  # GPUs hidden from it, its import notices off the console.
        from resnet_scaling.data import pipeline, preprocessing  # TensorFlow: only runs on image files.

        config = pipeline.preprocess_config(self._data)
        tf = preprocessing.tf
        prepared = [preprocessing.resize(_center_crop(tf.convert_to_tensor(image), config), config).numpy()
                    for image in images]
        return np.stack(prepared) if prepared else np.zeros((0, size, size, 3), np.uint8)

    def _as_given_message(self, shape: tuple[int, ...]) -> str:
        return (f"Expected uint8 images [N, {self.image_size}, {self.image_size}, 3] (NHWC, RGB; "
                f"config.data.image_size is {self.image_size}), got shape {shape}: this run trained on "
                f"data.source={self._data.source!r}, which takes images as given (no resize or crop), "
                "so pass them shaped as its arrays were.")

    def predict_classes(self, images: np.ndarray | jax.Array) -> np.ndarray:
        """The most likely class of each image, int32 [N]."""
        return np.argmax(self(images), axis=-1).astype(np.int32)

    def predict_labels(self, images: np.ndarray | jax.Array) -> list[str]:
        """The name of each image's most likely class (`class_names`); a ValueError where there are none."""
        return self.names_of(self.predict_classes(images)).tolist()

    def names_of(self, classes: np.ndarray) -> np.ndarray:
        """The names of class indices of any shape (`predict_classes`', `top_k`'s), as a str array."""
        if self.class_names is None:
            source = self._data.source
            raise ValueError(f"This run's data named no classes (data.source={source!r}"
                             f"{'; set config.data.class_names' if source == 'arrays' else ''}, or weights "
                             "exported before class names were saved): use predict_classes.")
        return np.asarray(self.class_names)[np.asarray(classes)]

    def top_k(self, images: np.ndarray | jax.Array, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """`(probabilities, classes)` of the `k` most likely classes of each image, best first, [N, k]."""
        if not 0 < k <= self.num_classes:
            raise ValueError(f"k must lie in [1, {self.num_classes}], got {k}.")
        logits = self(images)
        probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
        classes = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k].astype(np.int32)
        return np.take_along_axis(probabilities, classes, axis=-1), classes

    def _check(self, images: np.ndarray | jax.Array) -> np.ndarray:
        """The images as a NumPy uint8 [N, S, S, 3] array; a ValueError saying what is wrong otherwise."""
        dtype = getattr(images, "dtype", None)
        if dtype != np.uint8:
            raise ValueError(f"Expected uint8 RGB pixels in [0, 255], got {dtype}: the predictor normalises "
                             "them as training did (pass the raw pixels, not normalised or float images).")
        shape = tuple(images.shape)
        expected = (self.image_size, self.image_size, 3)
        if len(shape) == 3 and shape == expected:
            raise ValueError(f"Expected a batch [N, {self.image_size}, {self.image_size}, 3], got one image "
                             f"{shape}: pass images[None].")
        if len(shape) != 4 or shape[1:] != expected:
            if self.preprocessing == "none":
                raise ValueError(self._as_given_message(shape))
            raise ValueError(f"Expected uint8 images [N, {self.image_size}, {self.image_size}, 3] (NHWC, "
                             f"RGB; config.data.image_size is {self.image_size}), got shape {shape}; "
                             "predictor.prepare(images) crops and resizes images of any size as this run's "
                             "evaluation did.")
        return np.asarray(images)


def _center_crop(image: Any, config: Any) -> Any:
    """The evaluation's centre window of a decoded image (`preprocessing.center_crop_window`)."""
    from resnet_scaling.data import preprocessing

    top, left, height, width = (int(v) for v in preprocessing.center_crop_window(
        preprocessing.tf.shape(image), config).numpy())
    return image[top:top + height, left:left + width]


def _forward(variables: Any, images: jax.Array, *, model: models.ResNet, mean_rgb: tuple[float, ...],
             stddev_rgb: tuple[float, ...]) -> jax.Array:
    logits = model.apply(variables, steps.normalize_images(images, mean_rgb, stddev_rgb), train=False)
    return logits.astype(jnp.float32)
