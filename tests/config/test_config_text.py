"""`config_text.format_config`, what `--print_config` prints: a config file that loads back as the same
config, with `get_base_config`'s comments over every field and no YAML (`!!python/tuple`)."""

import inspect
import math
import re

import pytest

from resnet_scaling import config as config_lib
from resnet_scaling.config import text as config_text

FIELD_LINE = re.compile(r"^ *config\.[\w.]+ = ")


def _leaves(config) -> list[tuple[str, str, str]]:
    """(field, type, repr) of every value: equal configs, down to tuples against lists and 1 against 1.0."""
    def walk(tree, prefix):
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", type(value).__name__, repr(value)
    return sorted(walk(config.to_dict(), ""))


def _load_printed(config, tmp_path):
    path = tmp_path / "printed.py"
    path.write_text(config_text.format_config(config))
    return config_lib.load_config(str(path))


@pytest.mark.parametrize("name", config_lib.shipped_config_names())
def test_a_shipped_config_prints_as_a_file_that_loads_back_as_the_same_config(name, tmp_path):
    config = config_lib.load_config(name)
    assert _leaves(_load_printed(config, tmp_path)) == _leaves(config)


def test_awkward_values_and_added_fields_load_back_the_same(tmp_path):
    config = config_lib.get_base_config()
    config.training.num_train_steps = 12_345  # A placeholder set.
    config.data.folder = 'C:\\images\\"quoted" café\n'
    config.data.class_names = tuple(f"class {i:04d}" for i in range(1000))  # Wraps over many lines.
    config.data.crop_area_range = (0.05, 1.0)
    config.training.max_param_norm_growth = math.inf
    config.training.profile_steps = (3, 3)
    with config.unlocked():
        config.optimizer.extra_field = [1, 2.5, "three"]
        config.research = {"ablation": {"depth": 3, "names": ("a",)}, "note": None}
    printed = config_text.format_config(config)
    assert "with config.unlocked():" in printed and "import ml_collections" in printed
    assert max(len(line) for line in printed.splitlines() if "class 0" in line) <= config_text.LINE_LENGTH
    assert _leaves(_load_printed(config, tmp_path)) == _leaves(config)


def test_every_field_has_its_base_comment_and_changed_values_name_the_default():
    """A field's comment: on its line, or shared by the lines of its paragraph from above: the comment lines
    over them, or the trailing comment of the line above ("TFDS split names" covers eval_split too)."""
    printed = config_text.format_config(config_lib.load_config("demo"))
    assert "!!python" not in printed
    lines = printed.splitlines()
    fields = [i for i, line in enumerate(lines) if FIELD_LINE.match(line)]
    assert len(fields) == len(_leaves(config_lib.load_config("demo")))
    for i in fields:
        above = i
        while True:
            own = re.sub(r"\s*\(default: .*\)$", "", lines[above].partition("  # ")[2])
            if own or lines[above].strip().startswith("#"):
                break
            above -= 1
            assert lines[above].strip() and FIELD_LINE.match(lines[above]) or lines[above].strip().startswith(
                "#"), f"no comment for {lines[i]!r}"
    assert ("    # Training crop (ResNet-50 v1.5 reference): area fraction (MLPerf: 0.05-1) and aspect-ratio "
            "ranges.\n    config.data.crop_area_range = (0.35, 1.0)  # (default: (0.08, 1.0))\n") in printed
    assert ('    config.model.name = "resnet18"  # One of config_fields.MODEL_NAMES. (default: "resnet50")\n'
            in printed)
    assert "    config.data.num_train_examples = 12_000  # Epoch length for synthetic/shapes. " in printed
    assert "    config.training.num_train_steps = None\n" in printed  # A placeholder: None, not "null".
    assert "Locked" not in printed and "lock()" not in printed  # Statements that are no field stay out.


def test_without_the_source_the_fields_still_print_and_load_back(tmp_path, monkeypatch):
    """An installation without config.py's source (inspect cannot read it): no comments, same values."""
    def no_source(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_source)
    config = config_lib.load_config("demo")
    assert _leaves(_load_printed(config, tmp_path)) == _leaves(config)
