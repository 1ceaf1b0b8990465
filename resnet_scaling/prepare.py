"""Entry point: prepare a TFDS dataset once, offline, without Apache Beam (imagenet2012 by default).

    python -m resnet_scaling.prepare --manual_dir=$HOME/imagenet_tars [--data_dir=$HOME/tensorflow_datasets]
    python -m resnet_scaling.prepare --dataset=imagenette/320px-v2     # any TFDS dataset TFDS can download

Runs TFDS's Python builder (`builder.download_and_prepare`): `tfds build` imports Apache Beam, which this
package does not install. For imagenet2012 it first checks manual_dir for the train and val tars. At the
end it opens the dataset as training does, checks every shard file and prints each split's size against
the full ILSVRC2012's (a subset warns; `--expect=train=N,validation=N` makes a difference an error).

Rerunning is safe: TFDS writes `<data_dir>/<name>/incomplete.XXXXXX_<version>/`, renamed `<version>/` once
every split is written and deleted on an exception or Ctrl-C, so a version folder is complete or absent. A
prepared data_dir is only verified; an interrupted run starts over (TFDS cannot resume inside a split). A
killed run (SIGKILL, power loss) leaves its incomplete.* folder, never reused: this names them for deletion.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import time

from absl import app, flags
from etils import epath

from resnet_scaling.config import command_line
from resnet_scaling.job import console
from resnet_scaling.job.errors import RunError

# Named, not __name__: run with -m this module is "__main__", outside the logger console.py shows at INFO.
logger = logging.getLogger("resnet_scaling.prepare")

# What the official ILSVRC2012 tars hold; TFDS's imagenet2012 keeps every image.
IMAGENET_SPLIT_SIZES = {"train": 1_281_167, "validation": 50_000}
# The official tars' sizes in bytes (TFDS's imagenet2012/checksums.tsv); the prepared dataset is as large.
IMAGENET_TARS = {"ILSVRC2012_img_train.tar": 147_897_477_120, "ILSVRC2012_img_val.tar": 6_744_924_160}
IMAGENET_URL = "https://image-net.org/download-images"
# Datasets whose split sizes and manual_dir files this command knows (both builders read the same tars).
_KNOWN_SPLIT_SIZES = {"imagenet2012": IMAGENET_SPLIT_SIZES}
_MANUAL_FILES = {"imagenet2012": IMAGENET_TARS, "imagenet2012_subset": IMAGENET_TARS}

_DATASET = flags.DEFINE_string("dataset", "imagenet2012", "TFDS dataset name (name[/config][:version]).")
_DATA_DIR = flags.DEFINE_string("data_dir", None,
                                "Where to write it (default: $TFDS_DATA_DIR or ~/tensorflow_datasets).")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None,
                                  "Folder of the files downloaded by hand (imagenet2012: the ILSVRC2012 "
                                  "tars; default: <data_dir>/downloads/manual).")
_EXPECT = flags.DEFINE_list("expect", [],
                            "split=N pairs, e.g. train=1281167,validation=50000: fail unless each split has "
                            "exactly N examples.")


class PrepareError(RunError, ValueError):
    """A problem the user fixes (missing files, a size that differs from --expect); the message says how."""


def default_data_dir() -> str:
    """TFDS's data_dir when none is given: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")


def base_name(dataset: str) -> str:
    """`imagenet2012` for `imagenet2012`, `imagenet2012:5.1.0` or `imagenet2012_subset/10pct` (its base)."""
    return dataset.split(":")[0].split("/")[0]


def parse_expect(pairs: list[str]) -> dict[str, int]:
    """{split: examples} from `split=N` strings (`--expect`); PrepareError names a malformed one."""
    expected = {}
    for pair in pairs:
        match = re.fullmatch(r"\s*([\w-]+)\s*=\s*([\d_]+)\s*", pair)
        if not match:
            raise PrepareError(f"--expect: {pair!r} is not split=N "
                               "(e.g. --expect=train=1281167,validation=50000)")
        expected[match[1]] = int(match[2].replace("_", ""))
    return expected


def _tfds():
    """TFDS, after TensorFlow is imported as the library imports it (GPUs hidden from it: preparing needs
    none, and a training job may be using them; quiet; without Keras)."""
    from resnet_scaling.job import tf_import

    tf_import.import_tensorflow_for_host()
    import tensorflow_datasets as tfds

    return tfds


def check_manual_dir(dataset: str, manual_dir: str) -> list[str]:
    """Checks that `manual_dir` holds what `dataset` is prepared from, before hours of work start.

    Returns warnings (a tar whose size is not the official one's: fine for a subset, fatal part way through
    for a partial download); raises PrepareError naming a missing file and where to get it.
    """
    tfds = _tfds()
    folder = epath.Path(manual_dir)
    required = _MANUAL_FILES.get(base_name(dataset))
    if required is None:  # Another dataset: TFDS's own instructions say what goes in its manual_dir.
        instructions = tfds.builder_cls(base_name(dataset)).MANUAL_DOWNLOAD_INSTRUCTIONS
        if instructions and not (folder.is_dir() and any(folder.iterdir())):
            raise PrepareError(f"{dataset} is prepared from files downloaded by hand into --manual_dir, and "
                               f"{folder} is missing or empty; TFDS says: {' '.join(instructions.split())}")
        return []
    warnings = []
    for name, official_bytes in required.items():
        path = folder / name
        if not path.is_file():
            raise PrepareError(f"no {name} in {folder}: download it from {IMAGENET_URL} (registration "
                               f"required) and pass its folder as --manual_dir")
        size_bytes = path.stat().length
        if size_bytes != official_bytes:
            warnings.append(f"{path} is {_gigabytes(size_bytes)}, the official file "
                            f"{_gigabytes(official_bytes)}: fine for a subset, but a partial download fails "
                            "part way through")
    return warnings


def incomplete_dirs(dataset: str, data_dir: str) -> list[epath.Path]:
    """Temporary folders that interrupted TFDS preparations of `dataset` left in `data_dir`."""
    builder = _tfds().builder(dataset, data_dir=data_dir)
    # TFDS's temporary folder sits beside the version folder: <name>[/<config>]/incomplete.XXXXXX_<version>.
    return sorted(builder.data_path.parent.glob("incomplete.*"))


def prepare(dataset: str, data_dir: str, manual_dir: str | None = None) -> dict[str, int]:
    """Prepares `dataset` in `data_dir` with TFDS's builder (no Beam), or verifies it if already prepared.

    Args:
      dataset: TFDS name, e.g. "imagenet2012".
      data_dir: TFDS data directory (local or gs://).
      manual_dir: the files downloaded by hand; None: TFDS's default, <data_dir>/downloads/manual.
    Returns:
      {split: number of examples} of the prepared dataset, after `verify`.
    """
    tfds = _tfds()
    try:
        builder = tfds.builder(dataset, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise PrepareError(f"TFDS has no dataset {dataset!r} "
                           "(see https://www.tensorflow.org/datasets/catalog for names)") from e
    for leftover in incomplete_dirs(dataset, data_dir):
        _warn(f"{leftover} is left from an interrupted preparation and is never reused; delete it "
              f"(rm -r {leftover}) unless another preparation is running now")
    if builder.is_prepared():
        logger.info("%s is already prepared in %s; verifying it.", builder.info.full_name, builder.data_dir)
        return verify(dataset, data_dir)
    manual_dir = manual_dir or os.fspath(epath.Path(data_dir) / "downloads" / "manual")
    for warning in check_manual_dir(dataset, manual_dir):
        _warn(warning)
    _warn_if_short_of_disk(dataset, data_dir, manual_dir)
    test_tar = epath.Path(manual_dir) / "ILSVRC2012_img_test.tar"
    if base_name(dataset) in _MANUAL_FILES and not test_tar.exists():
        logger.info("No ILSVRC2012_img_test.tar: no test split (its labels were never released; training "
                    "and evaluation use train and validation), so TFDS's warning about it is expected.")
    logger.info("Preparing %s in %s from %s. TFDS shows a progress bar per split; the full ImageNet takes "
                "a few hours. Interrupted, it starts over when run again.", builder.info.full_name,
                builder.data_dir, manual_dir)
    start = time.monotonic()
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    logger.info("Prepared %s in %s.", builder.info.full_name, _duration(time.monotonic() - start))
    return verify(dataset, data_dir)


def verify(dataset: str, data_dir: str) -> dict[str, int]:
    """Opens the prepared dataset as training does and checks its shard files; returns {split: examples}."""
    from resnet_scaling.job import tf_import

    tf = tf_import.import_tensorflow_for_host()  # Before tfds_data imports it: GPUs hidden, quieter.
    from resnet_scaling.data import DataError, tfds_data

    start = time.monotonic()
    try:
        builder = tfds_data.open_builder(dataset, data_dir)
    except DataError as e:
        raise PrepareError(str(e)) from e
    sizes = {}
    for split, info in builder.info.splits.items():
        if missing := [path for path in info.filepaths if not path.exists()]:
            raise PrepareError(f"{builder.data_dir} lacks {len(missing)} of the {split} split's "
                               f"{info.num_shards} files (e.g. {missing[0]}); delete that folder and run "
                               "this again")
        if info.num_examples:
            # One record of the first shard (framing, checksum): reading all of ImageNet would take an hour.
            try:
                next(iter(tf.data.TFRecordDataset(os.fspath(info.filepaths[0])).take(1)))
            except tf.errors.OpError as e:
                raise PrepareError(f"{info.filepaths[0]} is unreadable ({e.message}); delete "
                                   f"{builder.data_dir} and run this again") from e
        sizes[str(split)] = tfds_data.num_examples(builder, str(split))
    logger.info("Verified %s (%d splits) in %s.", builder.data_dir, len(sizes),
                _duration(time.monotonic() - start))
    return sizes


def size_differences(dataset: str, sizes: dict[str, int],
                     expected: dict[str, int] | None = None) -> list[str]:
    """Where `sizes` differs from `expected`, or, with none given, from the full dataset's known sizes."""
    reference = "--expect says" if expected else "the full dataset has"
    expected = expected or _KNOWN_SPLIT_SIZES.get(base_name(dataset), {})
    differences = []
    for split, count in expected.items():
        if split not in sizes:
            differences.append(f"{dataset} has no {split} split; {reference} {count:,} examples")
        elif sizes[split] != count:
            differences.append(f"{dataset}'s {split} split has {sizes[split]:,} examples; {reference} "
                               f"{count:,}")
    return differences


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)  # stdout keeps only the results.


def _warn_if_short_of_disk(dataset: str, data_dir: str, manual_dir: str) -> None:
    """The prepared dataset is about as large as the tars it comes from; say so before, not hours in."""
    folder = epath.Path(manual_dir)
    needed_bytes = sum(path.stat().length for name in _MANUAL_FILES.get(base_name(dataset), {})
                       if (path := folder / name).is_file())
    existing = os.path.abspath(data_dir)
    if not needed_bytes or "://" in data_dir:
        return
    while not os.path.exists(existing):  # The data_dir may not exist yet: ask about the disk it will be on.
        existing = os.path.dirname(existing)
    free_bytes = shutil.disk_usage(existing).free
    if free_bytes < needed_bytes:
        _warn(f"{dataset} needs about {_gigabytes(needed_bytes)} in {data_dir}, and its disk has "
              f"{_gigabytes(free_bytes)} free")


def _gigabytes(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if num_bytes >= scale / 10:
            return f"{num_bytes / scale:,.1f} {unit}"
    return f"{num_bytes / 1e3:,.1f} kB"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}h {minutes % 60:02d}m {secs:02d}s"


def main(argv: list[str]) -> None:
    command_line.refuse_arguments(argv)
    console.configure_command_line_logging()  # Our lines at INFO, TFDS's at WARNING (--verbosity=0: all).
    # `--data_dir=~/x` reaches us unexpanded: shells expand a ~ after `=` only in variable assignments.
    data_dir = os.path.expanduser(_DATA_DIR.value) if _DATA_DIR.value else default_data_dir()
    manual_dir = os.path.expanduser(_MANUAL_DIR.value) if _MANUAL_DIR.value else None
    dataset = _DATASET.value
    try:
        expected = parse_expect(_EXPECT.value)  # Before hours of work, not after.
        sizes = prepare(dataset, data_dir, manual_dir)
        for split, count in sorted(sizes.items()):
            print(f"{split}: {count:,} examples", flush=True)
        if expected and (differences := size_differences(dataset, sizes, expected)):
            raise PrepareError("; ".join(differences))
        for difference in [] if expected else size_differences(dataset, sizes):
            _warn(f"{difference} (fine for a subset; --expect=split=N makes a difference an error)")
    except PrepareError as e:  # Something the user fixes: say what, without a traceback.
        raise SystemExit(f"error: {e}") from None
    print(f"Ready: train with --config.data.dataset={dataset} --config.data.data_dir={data_dir}", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=command_line.parse_flags)
