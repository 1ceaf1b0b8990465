"""The files a run reads back from its workdir, damaged as crashes and full disks leave them: the next launch
warns, sets the file aside and goes on; and goodput counts a launch that died before its first checkpoint."""

import json
import logging

import pytest

from resnet_scaling import checkpointing
from resnet_scaling.job import workdir
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config


def _config(**overrides):
    defaults = {"training__num_train_steps": 6, "training__log_every_steps": 1, "checkpoint__enabled": True,
                "checkpoint__every_steps": 3, "checkpoint__async_save": False}
    return tiny_config(**{**defaults, **overrides})


DAMAGED_ACCOUNTS = [b"", b'{"launches": [{"start_wall": 1', b"\xff\xfe garbage", b"[]", b'{"launches": 7}',
                    b'{"launches": [{"start_wall": "soon"}]}']


def test_a_damaged_goodput_json_and_config_changes_file_are_set_aside_and_the_run_resumes(tmp_path, caplog):
    arrays = random_arrays()
    trainer.train_and_evaluate(_config(training__num_train_steps=3), str(tmp_path), arrays=arrays)
    damage = DAMAGED_ACCOUNTS[1]  # Cut short, as a crash mid-write without an atomic rename leaves it.
    (tmp_path / "goodput.json").write_bytes(damage)
    (tmp_path / "config_changes.jsonl").write_bytes(b"\xff\xfe\x00")
    with caplog.at_level(logging.WARNING):  # 3 -> 6 steps: a change, for config_changes.jsonl.
        resumed = trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    assert resumed.start_step == 3 and int(resumed.state.step) == 6
    aside = list(tmp_path.glob("goodput.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damage
    assert "goodput counts from this launch on" in caplog.text
    # The new account holds this launch alone, and reads back whole.
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    assert [(launch["start_step"], launch["last_step"]) for launch in launches] == [(3, 6)]
    assert resumed.summary["goodput"]["launches"] == 1
    # The changes file holds this launch's change alone.
    assert "config_changes.jsonl cannot be read" in caplog.text
    changes = [json.loads(line) for line in (tmp_path / "config_changes.jsonl").read_text().splitlines()]
    assert [c["step"] for c in changes] == [3] and "training.num_train_steps" in changes[0]["changes"]


@pytest.mark.parametrize("damage", DAMAGED_ACCOUNTS)
def test_every_kind_of_damaged_account_is_set_aside(tmp_path, caplog, damage):
    (tmp_path / "goodput.json").write_bytes(damage)
    with caplog.at_level(logging.WARNING):
        recorder = trainer.metrics_lib.GoodputRecorder(str(tmp_path), start_step=5, launch_start_wall=1.0)
    assert recorder.earlier == [] and "goodput counts from this launch on" in caplog.text
    assert [p.read_bytes() for p in tmp_path.glob("goodput.json.damaged-*")] == [damage]
    assert len(json.loads((tmp_path / "goodput.json").read_text())["launches"]) == 1


def test_a_launch_that_dies_before_its_first_checkpoint_counts_in_goodput(tmp_path, monkeypatch):
    # Launch 1 trains 4 steps and dies before any checkpoint (every 100 steps); launch 2 starts again at 0.
    arrays = random_arrays()
    config = _config(training__num_train_steps=8, checkpoint__every_steps=100)
    real_save = checkpointing.Checkpointer.save

    def die(self, *args, **kwargs):
        raise RuntimeError("killed")

    steps_done = []
    real_write = trainer.metrics_lib.MetricWriters.write

    def write_then_die_at_4(self, step, values):
        real_write(self, step, values)
        steps_done.append(step)
        if step == 4:
            raise RuntimeError("killed")

    monkeypatch.setattr(checkpointing.Checkpointer, "save", die)
    monkeypatch.setattr(trainer.metrics_lib.MetricWriters, "write", write_then_die_at_4)
    with pytest.raises(RuntimeError, match="killed"):
        trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", real_save)
    monkeypatch.setattr(trainer.metrics_lib.MetricWriters, "write", real_write)
    assert steps_done[-1] == 4 and not (tmp_path / "checkpoints" / "4").exists()

    second = trainer.train_and_evaluate(config, str(tmp_path), arrays=arrays)
    assert second.start_step == 0 and int(second.state.step) == 8
    goodput = second.summary["goodput"]
    assert goodput["launches"] == 2
    assert goodput["recomputed_steps"] == 4  # steps 1-4, trained by launch 1 and again by launch 2
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    assert [(launch["start_step"], launch["last_step"]) for launch in launches] == [(0, 4), (0, 8)]
    assert goodput["total_wall_sec"] >= launches[1]["last_wall"] - launches[0]["start_wall"] - 1e-6


def test_a_launch_is_counted_from_its_start_not_its_first_log_point(tmp_path):
    recorder = trainer.metrics_lib.GoodputRecorder(str(tmp_path), start_step=0, launch_start_wall=123.0)
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    assert len(launches) == 1 and launches[0]["start_wall"] == 123.0 and launches[0]["last_step"] == 0
    again = trainer.metrics_lib.GoodputRecorder(str(tmp_path), start_step=0, launch_start_wall=456.0)
    assert len(again.earlier) == 1 and recorder.launch["start_wall"] == 123.0


def test_read_json_sets_aside_only_what_is_damaged(tmp_path, caplog):
    good = tmp_path / "good.json"
    good.write_text('{"a": 1}')
    assert workdir.read_json(good, "x") == {"a": 1}
    assert workdir.read_json(tmp_path / "missing.json", "x") is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": ')
    with caplog.at_level(logging.WARNING):
        assert workdir.read_json(bad, "the run goes on.") is None
    assert not bad.exists() and len(list(tmp_path.glob("bad.json.damaged-*"))) == 1
    assert "bad.json is empty or not valid JSON: set aside as bad.json.damaged-" in caplog.text
    assert caplog.text.rstrip().endswith("the run goes on.")


def test_a_truncated_checkpoint_is_skipped_with_its_cause_in_words(tmp_path, caplog):
    arrays = random_arrays()
    trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    data_files = sorted((p for p in (tmp_path / "checkpoints" / "6").rglob("*")
                         if p.is_file() and p.stat().st_size > 1024), key=lambda p: -p.stat().st_size)
    with open(data_files[0], "r+b") as f:  # Cut short, as a crash mid-write leaves a file.
        f.truncate(100)
    with caplog.at_level(logging.WARNING):
        resumed = trainer.train_and_evaluate(_config(training__num_train_steps=8), str(tmp_path),
                                             arrays=arrays)
    assert resumed.start_step == 3
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipping checkpoint")]
    assert len(skipped) == 1 and "/6 (moved to" in skipped[0]
    assert ": a file is truncated" in skipped[0] and "<bound method" not in skipped[0], skipped[0]
    assert "\n" not in skipped[0]


def test_metrics_lines_that_are_not_records_are_dropped_with_a_warning(tmp_path, caplog):
    from resnet_scaling.metrics import JsonLinesWriter

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe\x00garbage\n{"step": 2, "loss": 1.5}\n[3]\n'
                     b'{"step": 3, "lo')  # The last line cut by a crash.
    with caplog.at_level(logging.WARNING):
        writer = JsonLinesWriter(path, resume_step=2)
    writer.write(3, {"loss": 1.0})
    writer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] == 1.0
    assert "dropped 3 unreadable line(s) of 5" in caplog.text


def test_a_launch_that_dies_in_its_set_up_counts_and_a_refused_one_does_not(tmp_path, monkeypatch):
    from resnet_scaling.config import plan as plan_lib
    from resnet_scaling.training import training_setup

    arrays = random_arrays()
    trainer.train_and_evaluate(_config(training__num_train_steps=3), str(tmp_path), arrays=arrays)
    real_setup = training_setup.setup

    def setup_dies(*args, **kwargs):
        raise RuntimeError("the VM went away during set-up")

    monkeypatch.setattr(training_setup, "setup", setup_dies)
    with pytest.raises(RuntimeError, match="went away"):
        trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)

    def setup_refuses(*args, **kwargs):
        raise plan_lib.ConfigError("config.x: refused")

    monkeypatch.setattr(training_setup, "setup", setup_refuses)
    with pytest.raises(plan_lib.ConfigError):
        trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    monkeypatch.setattr(training_setup, "setup", real_setup)
    last = trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    launches = json.loads((tmp_path / "goodput.json").read_text())["launches"]
    steps = [(launch["start_step"], launch["last_step"]) for launch in launches]
    assert steps == [(0, 3), (None, None), (3, 6)]
    goodput = last.summary["goodput"]
    assert goodput["launches"] == 3 and goodput["recomputed_steps"] == 0
    assert goodput["restart_gaps_sec"] > 0  # The dead launch's unrecorded time is in the gaps.
