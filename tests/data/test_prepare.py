"""`python -m resnet_scaling.prepare` on small ILSVRC2012-style tars: preparation without Beam, split sizes
against the real ImageNet's, reruns, interruptions, missing tars and --expect."""

import logging
import os
import pathlib
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

from resnet_scaling import prepare
from resnet_scaling.data import tfds_data
from tests.image_files import write_ilsvrc_tars

REPO = pathlib.Path(__file__).resolve().parents[2]
# The first three ImageNet classes; 4 training images each and 10 validation images: seconds to prepare.
SYNSETS = ("n01440764", "n01443537", "n01484850")
SIZES = {"train": 12, "validation": 10}


def _write_tars(manual_dir) -> None:
    write_ilsvrc_tars(manual_dir, SYNSETS, train_per_class=4, num_val=10)


def _run(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it (TFDS's progress bars go to stderr with the logs)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "resnet_scaling.prepare", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """imagenet2012 prepared once by the command; (process, data_dir, seconds)."""
    root = tmp_path_factory.mktemp("prepare")
    _write_tars(root / "manual")
    start = time.monotonic()
    proc = _run(f"--manual_dir={root / 'manual'}", f"--data_dir={root / 'tfds'}")
    return proc, str(root / "tfds"), time.monotonic() - start


def test_the_command_prepares_imagenet2012_and_warns_that_it_is_not_the_full_dataset(prepared):
    proc, data_dir, seconds = prepared
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train: 12 examples\nvalidation: 10 examples\n" in proc.stdout  # After TFDS's own lines.
    assert f"--config.data.data_dir={data_dir}" in proc.stdout
    assert "Preparing imagenet2012/5.1.0" in proc.stderr and "Prepared imagenet2012/5.1.0 in" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any("train split has 12 examples; the full dataset has 1,281,167" in w for w in warnings)
    assert any("validation split has 10 examples; the full dataset has 50,000" in w for w in warnings)
    assert prepare.incomplete_dirs("imagenet2012", data_dir) == []  # TFDS renamed its temporary folder.
    # The library reads what the command wrote.
    builder = tfds_data.open_builder("imagenet2012", data_dir)
    assert {s: tfds_data.num_examples(builder, s) for s in SIZES} == SIZES
    share = tfds_data.record_share(builder, "validation", image_key="image", label_key="label",
                                   process_index=0, process_count=1, seed=0, shuffle=False)
    labels = [int(label) for _, label in share.in_order()]
    assert len(labels) == 10 and all(0 <= label < 1000 for label in labels)
    print(f"prepare command, first run: {seconds:.1f} s")


def test_a_second_run_only_verifies(prepared, monkeypatch, caplog):
    _, data_dir, _ = prepared

    def must_not_run(*args, **kwargs):
        raise AssertionError("a prepared dataset was prepared again")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", must_not_run)
    caplog.set_level(logging.INFO, logger="resnet_scaling.prepare")
    # No manual_dir needed: the tars may be gone once the dataset is prepared.
    assert prepare.prepare("imagenet2012", data_dir, manual_dir="/nonexistent") == SIZES
    assert "already prepared" in caplog.text and "Verified" in caplog.text
    expected = prepare.parse_expect(["train=12", "validation=10"])
    assert prepare.size_differences("imagenet2012", SIZES, expected) == []


def test_expect_makes_a_size_difference_an_error(prepared):
    _, data_dir, _ = prepared
    start = time.monotonic()
    proc = _run(f"--data_dir={data_dir}", "--expect=train=12,validation=11")
    seconds = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "already prepared" in proc.stderr and "Traceback" not in proc.stderr
    assert _error_lines(proc) == ["error: imagenet2012's validation split has 10 examples; --expect says 11"]
    assert "train: 12 examples\nvalidation: 10 examples\n" in proc.stdout
    with pytest.raises(prepare.PrepareError, match="'train' is not split=N"):
        prepare.parse_expect(["train"])
    print(f"prepare command, second run (verifies only): {seconds:.1f} s")


def test_a_missing_tar_is_a_one_line_error_before_anything_is_written(tmp_path):
    _write_tars(tmp_path / "manual")
    (tmp_path / "manual" / "ILSVRC2012_img_val.tar").unlink()
    proc = _run(f"--manual_dir={tmp_path / 'manual'}", f"--data_dir={tmp_path / 'tfds'}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert _error_lines(proc) == [
        f"error: no ILSVRC2012_img_val.tar in {tmp_path / 'manual'}: download it from "
        "https://image-net.org/download-images (registration required) and pass its folder as --manual_dir"]
    assert not (tmp_path / "tfds" / "imagenet2012").exists()
    with pytest.raises(prepare.PrepareError, match="no ILSVRC2012_img_train.tar in"):
        prepare.check_manual_dir("imagenet2012", str(tmp_path / "empty"))


def test_an_interrupted_preparation_leaves_nothing_behind_and_a_rerun_completes(tmp_path, monkeypatch,
                                                                                 capsys):
    _write_tars(tmp_path / "manual")
    data_dir, manual_dir = str(tmp_path / "tfds"), str(tmp_path / "manual")
    builder_cls = tfds.builder_cls("imagenet2012")
    generate = builder_cls._generate_examples
    written_before_ctrl_c = []

    def ctrl_c_during_validation(self, archive, validation_labels=None, labels_exist=True):
        if validation_labels:  # TFDS writes the train split first: it sits in the temporary folder now.
            written_before_ctrl_c.extend(p.name for d in prepare.incomplete_dirs("imagenet2012", data_dir)
                                         for p in d.iterdir())
            raise KeyboardInterrupt
        yield from generate(self, archive, validation_labels, labels_exist)

    monkeypatch.setattr(builder_cls, "_generate_examples", ctrl_c_during_validation)
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare("imagenet2012", data_dir, manual_dir)
    assert any(name.startswith("imagenet2012-train.tfrecord") for name in written_before_ctrl_c)
    assert prepare.incomplete_dirs("imagenet2012", data_dir) == []  # Deleted on the way out.
    assert not tfds.builder("imagenet2012", data_dir=data_dir).is_prepared()
    monkeypatch.undo()
    assert prepare.prepare("imagenet2012", data_dir, manual_dir) == SIZES
    # What a killed run (no Python clean-up) leaves is named, never reused.
    leftover = tmp_path / "tfds" / "imagenet2012" / "incomplete.K1LLED_5.1.0"
    leftover.mkdir()
    capsys.readouterr()
    assert prepare.prepare("imagenet2012", data_dir, manual_dir) == SIZES
    assert f"warning: {leftover} is left from an interrupted preparation" in capsys.readouterr().err
