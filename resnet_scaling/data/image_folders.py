"""Datasets stored as image files in one folder per class, and writing arrays into that layout.

    <root>/train/<class name>/<any name>.jpg   (.jpeg, .png, any case)
    <root>/val/<class name>/...                (or validation/)

Classes are numbered in sorted order, as torchvision's ImageFolder does. No TensorFlow: listing costs no
TF start-up.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence

import numpy as np

from resnet_scaling.data.base import DataError
from resnet_scaling.job import workdir

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
EVAL_FOLDER_NAMES = ("val", "validation")


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """One split of a class-folder dataset."""

    paths: list[str]
    labels: np.ndarray  # int32, index into class_names.
    class_names: list[str]
    num_ignored: int  # Files without an image extension.
    empty_folders: list[str] = dataclasses.field(default_factory=list)  # Class folders without images.


def name_few(names: Sequence[str], limit: int = 3) -> str:
    """The first `limit` names and how many more: "a, b, c and 6 more"."""
    shown = ", ".join(str(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def list_class_folders(split_dir: str, class_names: Sequence[str] | None = None) -> ImageFiles:
    """Lists `split_dir/<class>/<image>` in sorted order.

    Args:
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
    paths, labels, ignored, empty = [], [], [], []
    for name in found:
        folder = os.path.join(split_dir, name)
        before = len(paths)
        for file in sorted(os.scandir(folder), key=lambda e: e.name):
            if not file.is_file():
                continue
            if file.name.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(file.path)
                labels.append(index[name])
            else:
                ignored.append(file.path)
        if len(paths) == before:
            empty.append(folder)
    if not paths:
        others = f"; the {len(ignored)} other files ({name_few(ignored)}) are ignored" if ignored else ""
        raise DataError(f"{split_dir!r} has no image files ({', '.join(IMAGE_EXTENSIONS)}) in any of its "
                        f"{len(found)} class folders ({name_few(empty)}){others}; put the images in "
                        f"{split_dir}/<class name>/.")
    return ImageFiles(paths, np.asarray(labels, np.int32), list(class_names), len(ignored), empty)


def list_splits(root: str) -> tuple[ImageFiles, ImageFiles]:
    """The training and evaluation splits of the class-folder dataset at `root`.

    An imageless training class raises DataError (as in ImageFolder: never trained); an evaluation one warns.
    """
    train = list_class_folders(os.path.join(root, "train"))
    if train.empty_folders:
        raise DataError(f"{len(train.empty_folders)} training class folder(s) hold no image files "
                        f"({', '.join(IMAGE_EXTENSIONS)}): {name_few(train.empty_folders)}; add their "
                        "images, or remove those classes' folders from train/ and the evaluation folder "
                        "and set config.model.num_classes to the classes left.")
    if len(train.class_names) < 2:
        raise DataError(f"{os.path.join(root, 'train')} holds {len(train.class_names)} class folder(s) "
                        f"({name_few(train.class_names)}): a classifier needs at least 2 classes (with one, "
                        "every prediction is right and top-1 says nothing). Put each class's images in a "
                        "folder of its own under train/ (and the evaluation folder).")
    eval_dir = find_eval_folder(root)
    evaluation = list_class_folders(eval_dir, train.class_names)
    counts = np.bincount(evaluation.labels, minlength=len(train.class_names))
    missing = [name for name, count in zip(train.class_names, counts, strict=True) if not count]
    if missing:
        logger.warning("%d of %d classes have no evaluation images in %s (empty or missing folders): %s; "
                       "accuracy leaves them out - add their images if that is not intended.",
                       len(missing), len(train.class_names), eval_dir, name_few(missing))
    return train, evaluation


def find_eval_folder(root: str) -> str:
    """The evaluation split's folder under `root` (val/ or validation/)."""
    for name in EVAL_FOLDER_NAMES:
        if os.path.isdir(os.path.join(root, name)):
            return os.path.join(root, name)
    raise DataError(f"{root!r} has no evaluation folder: add {root}/val/<class>/*.jpg (or validation/).")


_STAGING_PREFIX = ".incomplete-"


def _remove_abandoned_staging(parent: str) -> None:
    """Removes the staging folders in `parent` of this host's writers that are gone."""
    host = socket.gethostname()
    for name in os.listdir(parent):
        writer = name.removeprefix(f"{_STAGING_PREFIX}{host}-").split("-", 1)[0]
        if name.startswith(_STAGING_PREFIX) and writer.isdigit() and not workdir.process_alive(int(writer)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def write_class_folders(root: str, splits: dict[str, tuple[np.ndarray, np.ndarray]],
                        class_names: Sequence[str], quality: int = 95) -> None:
    """Writes uint8 images as JPEG files in the class-folder layout, atomically.

    Staged beside `root` and renamed into place: a crash leaves no half-written dataset, and concurrent
    writers (one per host) do not collide. A staging folder this host's earlier writer left (it was
    stopped or killed: Ctrl-C while the demo's files were written) is removed first.

    Args:
      root: the dataset folder to create; must not exist yet.
      splits: split name (train, val) -> (images [N, H, W, 3] uint8, labels [N]).
      class_names: folder name per label.
    """
    from PIL import Image  # Only the writer needs PIL.

    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    _remove_abandoned_staging(parent)
    staging = tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=parent)
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
