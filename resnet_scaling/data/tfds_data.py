"""Prepared TFDS image-classification datasets (imagenet2012 and any other by name) as record shares.

Each process reads its `tfds.even_splits` share (disjoint, covering the split, sizes within one example).
Images stay encoded until the pipeline decodes (and crops) them.
"""

from __future__ import annotations

import os

import tensorflow as tf
import tensorflow_datasets as tfds

from resnet_scaling.data.base import DataError
from resnet_scaling.data.records import TFRecordShards

# Datasets TFDS cannot download: the files must be fetched by hand and put in a manual_dir.
_MANUAL_INSTRUCTIONS = {
    "imagenet2012": (
        "Download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org "
        "(registration required) into one folder, then run\n"
        "  python -m resnet_scaling.prepare --dataset={name} --manual_dir=<that folder> "
        "--data_dir={data_dir}\n"
        "(about 150 GB of disk and a few hours), and pass --config.data.data_dir={data_dir}."
    ),
}


def open_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The prepared dataset's builder, or a DataError that says how to prepare it."""
    shown_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise DataError(f"config.data.dataset: TFDS has no dataset {name!r} "
                        "(see https://www.tensorflow.org/datasets/catalog for names).") from e
    # A missing folder is simply unprepared: `is_prepared` would first warn that it has no
    # dataset_info.json, a line before ours about a folder that does not exist.
    if not builder.data_path.exists() or not builder.is_prepared():
        base = name.split(":")[0].split("/")[0]
        # Our command, not `tfds build`: that one needs Apache Beam, which this package does not install.
        how = _MANUAL_INSTRUCTIONS.get(base, "Prepare it with\n"
                                       "  python -m resnet_scaling.prepare --dataset={name} "
                                       "--data_dir={data_dir}\n"
                                       "on a machine with internet access, or copy a prepared copy there.")
        raise DataError(f"TFDS dataset {name!r} is not prepared in {shown_dir} "
                        f"(no {builder.data_dir}). " + how.format(name=name, data_dir=shown_dir))
    return builder


def record_share(builder: tfds.core.DatasetBuilder, split: str, *, image_key: str, label_key: str,
                 process_index: int, process_count: int, seed: int, shuffle: bool,
                 shuffle_buffer_size: int = 16_384, cycle_length: int = 16) -> TFRecordShards:
    """One process's share of `split` as (image_bytes, label) records."""
    if split not in builder.info.splits:
        raise DataError(f"{builder.info.full_name} has no split {split!r}; it has "
                        f"{sorted(builder.info.splits.keys())} (check config.data.train_split / eval_split).")
    features, name = builder.info.features, builder.info.full_name
    for key in (image_key, label_key):
        if key not in features.keys():
            raise DataError(f"{name} has no feature {key!r}; it has {sorted(features.keys())} "
                            "(set config.data.image_key / label_key).")
    if not isinstance(features[image_key], tfds.features.Image):
        raise DataError(f"{name}'s {image_key!r} is a {type(features[image_key]).__name__}, not an image "
                        "(set config.data.image_key).")
    share = tfds.even_splits(split, n=process_count)[process_index]
    pieces = [(f.filename, f.skip, f.take) for f in builder.info.splits[share].file_instructions]
    decoders = {image_key: tfds.decode.SkipDecoding()}

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = features.deserialize_example(serialized, decoders=decoders)
        return example[image_key], tf.cast(example[label_key], tf.int32)

    return TFRecordShards(pieces, parse, seed=seed, process_index=process_index, shuffle=shuffle,
                          shuffle_buffer_size=shuffle_buffer_size, cycle_length=cycle_length)


def num_classes(builder: tfds.core.DatasetBuilder, label_key: str) -> int | None:
    """Classes of the label feature, if TFDS knows them."""
    return getattr(builder.info.features[label_key], "num_classes", None)


def class_names(builder: tfds.core.DatasetBuilder, label_key: str) -> list[str] | None:
    """The label feature's names in label order (imagenet2012: WordNet ids such as n01440764), if TFDS
    knows them (a `ClassLabel`; one made from a count names its labels "0", "1", ...)."""
    names = getattr(builder.info.features[label_key], "names", None)
    return [str(name) for name in names] if names else None


def num_examples(builder: tfds.core.DatasetBuilder, split: str) -> int:
    """Examples in `split` (sub-split strings count too)."""
    return builder.info.splits[split].num_examples
