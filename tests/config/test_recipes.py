"""A config's recipe follows the batch it trains with (recipes.resolve): the values printed and trained are
the recipe's for the final global batch, except those the user set.

The expected values are transcribed from the sources, not computed by `recipes`: tensorflow/tpu r1.12
models/official/resnet/lars_util.py (base learning rate 25.0 with 5 warm-up epochs up to 16,384 images
per step, 34.0 with 12 at 32,768), and r1.12 resnet_main.py (LARS with label smoothing 0.1 from 16,384
images per step; below it momentum SGD with linear scaling from 0.1 per 256 images).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from resnet_scaling import config as config_lib
from resnet_scaling.config import recipes

REPO = pathlib.Path(__file__).resolve().parents[2]


def _printed_config(tmp_path: pathlib.Path, *args: str) -> tuple[object, str]:
    """The config `train --print_config` prints with `args`, loaded back, and the command's stderr."""
    proc = subprocess.run([sys.executable, "-m", "resnet_scaling.train", "--print_config", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "printed.py"
    path.write_text(proc.stdout)
    return config_lib.load_config(str(path)), proc.stderr


def test_the_pod_at_16384_prints_r1_12s_row_for_16384(tmp_path):
    config, _ = _printed_config(tmp_path, "--config=pod", "--config.training.global_batch_size=16384")
    assert (config.optimizer.base_learning_rate, config.schedule.warmup_epochs) == (25.0, 5.0)
    assert (config.optimizer.name, config.optimizer.lars_variant) == ("lars", "tf1.12")
    # What the file set apart from the recipe stays.
    assert (config.model.bn_group_size, config.model.compute_dtype) == (128, "bfloat16")


def test_an_h100_node_at_16384_switches_to_lars_and_an_explicit_learning_rate_wins(tmp_path):
    config, _ = _printed_config(tmp_path, "--config=gpu_h100x8", "--config.training.global_batch_size=16384",
                                "--config.optimizer.base_learning_rate=20.0")
    o = config.optimizer
    assert (o.name, o.lr_scaling, o.nesterov) == ("lars", "none", False)
    assert (config.schedule.name, config.schedule.warmup_epochs) == ("polynomial", 5.0)
    assert config.training.label_smoothing == 0.1
    assert o.base_learning_rate == 20.0  # The command line's, not r1.12's 25.0.


def test_the_run_says_which_values_came_from_the_recipe_and_which_from_the_user(caplog):
    config = config_lib.load_config("gpu_h100x8")
    config.training.global_batch_size = 16_384
    config.optimizer.base_learning_rate = 20.0
    explicit = {"training.global_batch_size", "optimizer.base_learning_rate"}
    resolution = recipes.resolve(config, explicit=explicit)
    with caplog.at_level("INFO", logger="resnet_scaling"):
        recipes.log_resolution(resolution, kept_by="the command line")
    assert "optimizer.name 'sgd' -> 'lars'" in caplog.text
    assert "Kept as set by the command line over recipe case_study: optimizer.base_learning_rate 20.0 " \
           "(the recipe's: 25.0)" in caplog.text


def test_below_16384_the_recipe_is_momentum_sgd_with_linear_scaling():
    config = config_lib.load_config("pod")
    config.training.global_batch_size = 4096
    resolved = recipes.resolve(config).config
    o = resolved.optimizer
    assert (o.name, o.base_learning_rate, o.lr_reference_batch_size, o.lr_scaling, o.nesterov) == (
        "sgd", 0.1, 256, "linear", True)
    schedule = resolved.schedule
    assert (schedule.name, tuple(schedule.boundary_epochs)) == ("piecewise", (30.0, 60.0, 80.0))
    assert resolved.training.label_smoothing == 0.0


def test_a_users_config_file_keeps_what_it_set_after_the_recipe(tmp_path):
    """A file in the README's style: the shipped pod, then 10 epochs; the batch halved on top."""
    path = tmp_path / "my_pod.py"
    path.write_text("from resnet_scaling.configs import pod\n\n\ndef get_config():\n"
                    "    config = pod.get_config()\n    config.training.num_epochs = 10.0\n"
                    "    return config\n")
    config = config_lib.load_config(str(path))
    config.training.global_batch_size = 16_384
    resolved = recipes.resolve(config, explicit={"training.global_batch_size"}).config
    assert resolved.training.num_epochs == 10.0
    assert (resolved.optimizer.base_learning_rate, resolved.schedule.warmup_epochs) == (25.0, 5.0)


def test_resolving_twice_changes_nothing_and_a_recipe_named_alone_is_applied():
    config = config_lib.get_base_config()
    config.recipe = "case_study"  # Named, never run: every field it sets takes its value.
    config.training.global_batch_size = 32_768
    resolved = recipes.resolve(config).config
    assert (resolved.optimizer.base_learning_rate, resolved.schedule.warmup_epochs) == (34.0, 12.0)
    assert resolved.training.num_epochs == 91.0  # r1.12's v2-512.yaml: 3,558 steps of 32,768 images.
    again = recipes.resolve(resolved)
    assert again.config is resolved and not again.changed


def test_an_unknown_recipe_is_one_line():
    config = config_lib.get_base_config()
    config.recipe = "case_studdy"
    with pytest.raises(config_lib.ConfigError, match=r"^config.recipe: 'case_studdy' is not a recipe"):
        recipes.resolve(config)


@pytest.mark.parametrize("name", config_lib.shipped_config_names())
def test_every_shipped_config_names_its_recipe_for_its_own_batch(name):
    config = config_lib.load_config(name)
    assert config.recipe_batch_size in (0, config.training.global_batch_size)
    assert not recipes.resolve(config).changed
