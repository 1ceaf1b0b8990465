"""benchmarks/code_structure.py on a hand-made package whose figures are known by construction."""

import pathlib

from tests.helpers import load_benchmark

code_structure = load_benchmark("code_structure")

TRAINER = '''\
import ml_collections
from resnet_scaling import helpers


def train(config: ml_collections.ConfigDict, batches, step_fn, report):
    state = helpers.init()
    for step in range(3):
        state = step_fn(state, next(batches))
        report.log(step)
        print(step)
    return _finish(state)


def _finish(state):
    return state
'''


def _package(root: pathlib.Path) -> pathlib.Path:
    package = root / "resnet_scaling"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "trainer.py").write_text(TRAINER)
    (package / "helpers.py").write_text("from resnet_scaling.data import load\n\n\ndef init():\n"
                                        "    return 0\n")
    (package / "data" / "__init__.py").write_text("from resnet_scaling import helpers\n\n\ndef load():\n"
                                                  "    return helpers\n")
    (package / "data" / "other.py").write_text("from ml_collections import ConfigDict\n\n\n"
                                               "def read(config: 'ConfigDict'):\n    return config\n")
    return root


def test_the_figures_of_a_package_with_one_cycle_and_a_two_collaborator_loop(tmp_path):
    figures = code_structure.figures(_package(tmp_path))
    assert figures["import_cycles"] == [["data/", "helpers.py"]]
    # Called or called a method on, in the loop's function: not the module `helpers`, not builtins (`print`,
    # `range`), not a name only handed to one (`next(batches)`).
    assert figures["loop_function"] == "train" and figures["loop_lines"] == 7
    assert figures["collaborators"] == ["report", "step_fn"]
    assert figures["longest_trainer_function"] == (7, "resnet_scaling/trainer.py:train")
    assert sorted(figures["whole_config_functions"]) == ["resnet_scaling/data/other.py:read",
                                                         "resnet_scaling/trainer.py:train"]
    assert figures["lines_per_folder"]["data/"] == 5 + 5
    assert figures["lines_total"] == sum(len(p.read_text().splitlines())
                                         for p in (tmp_path / "resnet_scaling").rglob("*.py"))
