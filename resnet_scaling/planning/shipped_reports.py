"""The compile reports of the shipped TPU configs, kept in the package so that the planner answers in
seconds: compiling one for its topology takes minutes on a CPU.

`python -m resnet_scaling.compile --shipped` writes them (`compiled_reports/<config>.json`). Each records
its config's hash (`config.config_hash`); a report whose config has changed since is not used (the planner
compiles that config again), and the suite says which to regenerate.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections

from resnet_scaling import config as config_lib

REPORTS_DIR = pathlib.Path(__file__).with_name("compiled_reports")


def shipped_tpu_configs() -> list[str]:
    """The shipped configs that name a TPU topology: the ones with a compile report."""
    return [name for name in config_lib.shipped_config_names()
            if config_lib.load_config(name).system.topology]


def report_path(name: str) -> pathlib.Path:
    return REPORTS_DIR / f"{name}.json"


def load_shipped_report(name: str, config: ml_collections.ConfigDict) -> dict[str, Any] | None:
    """The shipped report of config `name` if it was compiled from `config` as it is now, else None."""
    path = report_path(name)
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    return report if report.get("config_hash") == config_lib.config_hash(config) else None
