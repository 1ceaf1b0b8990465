"""Launches on a workdir whose run is already done: the same command again changes nothing (summary,
goodput, config and exported parameters stay as the finished run left them), and a shorter run than the
checkpoint's step is refused in one line instead of passing the later state off as its result."""

import json

import pytest

from resnet_scaling.config import plan
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config


def _config(**overrides):
    defaults = {"training__num_train_steps": 6, "checkpoint__enabled": True, "checkpoint__every_steps": 3,
                "checkpoint__async_save": False, "eval__every_steps": 3}
    return tiny_config(**{**defaults, **overrides})


def test_a_finished_run_run_again_trains_and_rewrites_nothing_and_a_shorter_one_is_refused_in_one_line(
        tmp_path, caplog):
    arrays = random_arrays()
    first = trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    files = ("summary.json", "goodput.json", "config.json", "metrics.jsonl")
    before = {name: (tmp_path / name).read_bytes() for name in files}
    with caplog.at_level("INFO"):
        again = trainer.train_and_evaluate(_config(), str(tmp_path), arrays=arrays)
    assert {name: (tmp_path / name).read_bytes() for name in files} == before
    assert again.start_step == 6 and again.train_history == [] and again.eval_history == []
    as_written = json.loads(json.dumps(first.summary, default=str))
    assert again.summary == json.loads(before["summary.json"]) == as_written
    assert "Nothing to train: this workdir's run finished at step 6 of 6" in caplog.text
    assert "Compiled the train step" not in caplog.text.split("Nothing to train")[-1]

    # The same finished run, asked for fewer steps than its checkpoint's.
    config_before = (tmp_path / "config.json").read_bytes()
    with pytest.raises(plan.ConfigError) as refused:
        trainer.train_and_evaluate(_config(training__num_train_steps=4), str(tmp_path), arrays=arrays)
    message = str(refused.value)
    assert "at step 6, past this run's 4 steps" in message and "ask for at least 6 steps" in message
    assert "\n" not in message
    assert (tmp_path / "config.json").read_bytes() == config_before  # The refused settings are not recorded.
    longer = trainer.train_and_evaluate(_config(training__num_train_steps=9), str(tmp_path), arrays=arrays)
    assert longer.start_step == 6 and int(longer.state.step) == 9
