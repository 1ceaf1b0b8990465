"""Writes small image datasets for the input-pipeline tests: class folders and ILSVRC2012-style tars."""

import io
import os
import tarfile

import numpy as np
from PIL import Image


def encode(image: np.ndarray, fmt: str = "JPEG", mode: str = "RGB", quality: int = 95) -> bytes:
    """Encodes uint8 RGB pixels; `mode` "CMYK" or "L" stores them as CMYK or greyscale."""
    pil = Image.fromarray(image)
    if mode != "RGB":
        pil = pil.convert(mode)
    buffer = io.BytesIO()
    pil.save(buffer, fmt, quality=quality)
    return buffer.getvalue()


def solid(value: int, height: int = 40, width: int = 48) -> np.ndarray:
    """Red level `value` everywhere; green and blue ramps, so that crops and flips change the image."""
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = value
    image[..., 1] = np.linspace(0, 255, width)[None, :]
    image[..., 2] = np.linspace(255, 0, height)[:, None]
    return image


# Identities are red levels 0, 7, 14, ...: 7 apart, far more than JPEG's error on a flat colour.
_LEVELS_PER_IDENTITY = 7


def with_identity(number: int) -> np.ndarray:
    """A `solid` image that carries `number` (0..36) through decoding, cropping and resizing."""
    return solid(_LEVELS_PER_IDENTITY * number)


def identity(image: np.ndarray) -> int:
    """The number `with_identity` stored in an image (or any crop or resize of it)."""
    return int(round(float(np.mean(image[..., 0])) / _LEVELS_PER_IDENTITY))


def write_folders(root, num_classes: int = 3, train_per_class: int = 6, eval_per_class: int = 3) -> dict:
    """A class-folder dataset of `solid` images with identities 0, 1, 2, ...; returns {path: identity}."""
    identities = {}
    counter = 0
    for split, per_class in (("train", train_per_class), ("val", eval_per_class)):
        for c in range(num_classes):
            folder = os.path.join(root, split, f"class_{c}")
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                path = os.path.join(folder, f"{i}.JPEG")
                with open(path, "wb") as f:
                    f.write(encode(with_identity(counter)))
                identities[path] = counter
                counter += 1
    return identities


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_ilsvrc_tars(manual_dir, synsets, train_per_class: int, num_val: int) -> None:
    """ILSVRC2012_img_train.tar (one tar of JPEGs per synset) and ILSVRC2012_img_val.tar, as ImageNet
    ships them. TFDS labels the validation images from its own list by sorted file name."""
    os.makedirs(manual_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    with tarfile.open(os.path.join(manual_dir, "ILSVRC2012_img_train.tar"), "w") as train:
        for synset in synsets:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as per_class:
                for i in range(train_per_class):
                    image = rng.integers(0, 256, (36, 44, 3), dtype=np.uint8)
                    _add(per_class, f"{synset}_{i}.JPEG", encode(image, quality=90))
            _add(train, f"{synset}.tar", buffer.getvalue())
    with tarfile.open(os.path.join(manual_dir, "ILSVRC2012_img_val.tar"), "w") as val:
        for i in range(1, num_val + 1):
            image = rng.integers(0, 256, (44, 36, 3), dtype=np.uint8)
            _add(val, f"ILSVRC2012_val_{i:08d}.JPEG", encode(image, quality=90))
