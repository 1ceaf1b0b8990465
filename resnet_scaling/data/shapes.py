"""A small, learnable image-classification dataset drawn procedurally: the embedded demo data.

Five shapes and five textures at random position, size, period and phase, in random colours, with pixel
noise. Nothing is downloaded; the same seed gives the same images on every machine.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from resnet_scaling.job import stopping

logger = logging.getLogger(__name__)

# make_shapes' labels index these. Written as class folders (the "shapes" source), they are read back as
# folders are, numbered in sorted order: the demo's label 0 is "checkerboard" (its export's class_names).
CLASS_NAMES = (
    "disc",
    "square",
    "triangle",
    "ring",
    "plus",
    "horizontal_stripes",
    "vertical_stripes",
    "diagonal_stripes",
    "checkerboard",
    "dots",
)
NUM_CLASSES = len(CLASS_NAMES)


def _masks(label: int, n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Foreground masks [n, size, size] in {0, 1} for one class, with random geometry per image."""
    yy, xx = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
    yy, xx = yy[None] / size, xx[None] / size  # [1, H, W] in (0, 1)

    def u(low, high):
        return rng.uniform(low, high, size=(n, 1, 1))

    cy, cx, r = u(0.3, 0.7), u(0.3, 0.7), u(0.15, 0.3)
    dy, dx = yy - cy, xx - cx
    name = CLASS_NAMES[label]
    if name == "disc":
        mask = dy**2 + dx**2 < r**2
    elif name == "square":
        mask = np.maximum(abs(dy), abs(dx)) < r * 0.85
    elif name == "triangle":
        # Apex up: inside when below the apex and within the widening sides.
        mask = (dy > -r) & (dy < r) & (abs(dx) < (dy + r) * 0.6)
    elif name == "ring":
        dist = np.sqrt(dy**2 + dx**2)
        mask = (dist < r) & (dist > r * 0.55)
    elif name == "plus":
        arm = r * 0.3
        mask = ((abs(dy) < arm) & (abs(dx) < r)) | ((abs(dx) < arm) & (abs(dy) < r))
    else:
        period, phase = u(0.12, 0.3), u(0.0, 1.0)
        if name == "horizontal_stripes":
            mask = ((yy / period + phase) % 1.0) < 0.5
        elif name == "vertical_stripes":
            mask = ((xx / period + phase) % 1.0) < 0.5
        elif name == "diagonal_stripes":
            sign = np.where(rng.random((n, 1, 1)) < 0.5, 1.0, -1.0)
            mask = (((xx + sign * yy) / period + phase) % 1.0) < 0.5
        elif name == "checkerboard":
            mask = ((np.floor(yy / period + phase) + np.floor(xx / period + phase)) % 2) < 1
        elif name == "dots":
            fy, fx = (yy / period + phase) % 1.0 - 0.5, (xx / period + phase) % 1.0 - 0.5
            mask = fy**2 + fx**2 < 0.09
        else:  # pragma: no cover - CLASS_NAMES and the branches above are kept in step.
            raise AssertionError(name)
    return np.broadcast_to(mask, (n, size, size)).astype(np.float32)


def make_shapes(num_examples: int, image_size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draws a balanced, shuffled set of shape and texture images.

    Args:
      num_examples: images to draw (class counts differ by at most one).
      seed: use different seeds for training and held-out sets.

    Returns:
      `(images, labels)`: uint8 [num_examples, image_size, image_size, 3] and int32 [num_examples].
    """
    if num_examples <= 0 or image_size <= 0:
        raise ValueError(f"num_examples and image_size must be positive, got {num_examples}, {image_size}.")
    rng = np.random.default_rng(seed)
    labels = np.arange(num_examples, dtype=np.int32) % NUM_CLASSES
    rng.shuffle(labels)
    images = np.empty((num_examples, image_size, image_size, 3), np.uint8)
    for label in range(NUM_CLASSES):
        (idx,) = np.nonzero(labels == label)
        n = len(idx)
        if n == 0:
            continue
        mask = _masks(label, n, image_size, rng)[..., None]
        background = rng.uniform(0, 255, size=(n, 1, 1, 3))
        # Foreground at least ~100 levels away from the background in some channel, so shapes show.
        foreground = (background + rng.uniform(100, 155, size=(n, 1, 1, 3))
                      * rng.choice([-1.0, 1.0], size=(n, 1, 1, 3))) % 255
        noise = rng.normal(0, 12, size=(n, image_size, image_size, 3))
        pixels = background * (1 - mask) + foreground * mask + noise
        images[idx] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images, labels


# Bump when make_shapes or the file layout changes, so that stale cached copies are not reused.
_FOLDER_VERSION = 1
# Drawing and writing one 32x32 image: the demo's 14,000 took 26 s on a 2-core VM; said before the wait.
_WRITE_SEC_PER_IMAGE = 30 / 14_000


def shapes_folder(cache_dir: str, *, num_train: int, num_eval: int, image_size: int = 32,
                  seed: int = 0) -> str:
    """The shapes dataset as class-folder JPEGs in `cache_dir`: its root, written once per arguments."""
    from resnet_scaling.data import image_folders  # PIL is imported only when the files are written.

    name = f"shapes-v{_FOLDER_VERSION}-{image_size}px-{num_train}-{num_eval}-seed{seed}"
    root = os.path.join(os.path.expanduser(cache_dir), name)
    if not os.path.isdir(root):
        # Half a minute for the demo on a first run: a line first, not a silent wait.
        num_images = num_train + num_eval
        logger.info("Writing the demo dataset (%s JPEGs) to %s, once; about %d s.", f"{num_images:,}", root,
                    max(1, round(num_images * _WRITE_SEC_PER_IMAGE * (image_size / 32) ** 2)))
        start = time.perf_counter()
        # Different seeds keep the held-out images apart from the training images.
        with stopping.phase("writing the generated dataset"):  # Written whole or not at all.
            splits = {"train": make_shapes(num_train, image_size, seed=seed),
                      "val": make_shapes(num_eval, image_size, seed=seed + 1_000_003)}
            image_folders.write_class_folders(root, splits, CLASS_NAMES)
        logger.info("Wrote the demo dataset in %.1f s; later runs read it from there.",
                    time.perf_counter() - start)
    return root
