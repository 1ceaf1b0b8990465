"""Datasets stored as image files in one folder per class, and writing arrays into that layout.

    <root>/train/<class name>/<any name>.jpg   (.jpeg, .png, any case)
    <root>/val/<class name>/...                (or validation/)

Class indices are the sorted training class names, as torchvision's ImageFolder numbers them. Pure
Python and NumPy (no TensorFlow), so that listing a dataset costs no TF start-up.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tempfile
from collections.abc import Sequence

import numpy as np

from resnet_scaling.data.base import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
EVAL_FOLDER_NAMES = ("val", "validation")


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """One split of a class-folder dataset."""

    paths: list[str]
    labels: np.ndarray  # int32, index into class_names.
    class_names: list[str]
    num_ignored: int  # Files without an image extension.


def list_class_folders(split_dir: str, class_names: Sequence[str] | None = None) -> ImageFiles:
    """Lists `split_dir/<class>/<image>` in sorted order.

    Args:
      split_dir: the split's folder.
      class_names: the classes to number by (the training split's); None takes this folder's own.
    """
    if not os.path.isdir(split_dir):
        raise DataError(f"No folder {split_dir!r}: a class-folder dataset needs <root>/train/<class>/*.jpg "
                        "and <root>/val/<class>/*.jpg.")
    found = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if not found:
        raise DataError(f"{split_dir!r} has no class sub-folders; put each class's images in "
                        f"{split_dir}/<class name>/.")
    if class_names is None:
        class_names = found
    index = {name: i for i, name in enumerate(class_names)}
    unknown = [name for name in found if name not in index]
    if unknown:
        raise DataError(f"{split_dir!r} has classes the training split lacks: {unknown[:5]}.")
    paths, labels, ignored = [], [], 0
    for name in found:
        folder = os.path.join(split_dir, name)
        for file in sorted(os.scandir(folder), key=lambda e: e.name):
            if not file.is_file():
                continue
            if file.name.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(file.path)
                labels.append(index[name])
            else:
                ignored += 1
    if not paths:
        raise DataError(f"{split_dir!r} has no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class "
                        "folders.")
    return ImageFiles(paths, np.asarray(labels, np.int32), list(class_names), ignored)


def find_eval_folder(root: str) -> str:
    """The evaluation split's folder under `root` (val/ or validation/)."""
    for name in EVAL_FOLDER_NAMES:
        if os.path.isdir(os.path.join(root, name)):
            return os.path.join(root, name)
    raise DataError(f"{root!r} has no evaluation folder: add {root}/val/<class>/*.jpg (or validation/).")


def write_class_folders(root: str, splits: dict[str, tuple[np.ndarray, np.ndarray]],
                        class_names: Sequence[str], quality: int = 95) -> None:
    """Writes uint8 images as JPEG files in the class-folder layout, atomically.

    The files go to a temporary folder beside `root` that is renamed into place when complete, so a
    crash leaves no half-written dataset and concurrent writers (one per host) do not collide.

    Args:
      root: the dataset folder to create; must not exist yet.
      splits: split name (train, val) -> (images [N, H, W, 3] uint8, labels [N]).
      class_names: folder name per label.
      quality: JPEG quality.
    """
    from PIL import Image  # Only the writer needs PIL.

    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incomplete-", dir=parent)
    try:
        for split, (images, labels) in splits.items():
            for name in class_names:
                os.makedirs(os.path.join(staging, split, name))
            for i, (image, label) in enumerate(zip(images, labels, strict=True)):
                buffer = io.BytesIO()
                Image.fromarray(image).save(buffer, "JPEG", quality=quality)
                path = os.path.join(staging, split, class_names[label], f"{split}_{i:07d}.jpg")
                with open(path, "wb") as f:
                    f.write(buffer.getvalue())
        try:
            os.rename(staging, root)
        except OSError:
            if not os.path.isdir(root):  # Not a concurrent writer's success: a real failure.
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
