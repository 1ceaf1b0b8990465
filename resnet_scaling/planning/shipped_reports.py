"""The compile reports of the shipped TPU and GPU configs, kept in the package so that the planner answers
in seconds: compiling one for its topology or GPUs takes minutes on a CPU.

`python -m resnet_scaling.compile --shipped` writes them (`compiled_reports/<config>.json`). Each records
its config's hash (`config.config_hash`); a report whose config has changed since is not used (the planner
compiles that config again), and the suite says which to regenerate.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from resnet_scaling import config as config_lib
from resnet_scaling.job import hardware
from resnet_scaling.planning import gpu_targets

REPORTS_DIR = pathlib.Path(__file__).with_name("compiled_reports")


def shipped_tpu_configs() -> list[str]:
    """The shipped configs that name a TPU topology."""
    return [name for name in config_lib.shipped_config_names()
            if config_lib.load_config(name).system.topology]


def shipped_gpu_configs() -> list[str]:
    """The shipped configs that name a GPU: a card `gpu_targets` describes, and no TPU topology."""
    return [name for name in config_lib.shipped_config_names()
            if gpu_targets.is_known_card((system := config_lib.load_config(name).system).device_kind)
            and not system.topology]


def shipped_compiled_configs() -> list[str]:
    """The shipped configs with a compile report: those that name a TPU topology or a GPU."""
    return shipped_tpu_configs() + shipped_gpu_configs()


def report_path(name: str) -> pathlib.Path:
    return REPORTS_DIR / f"{name}.json"


def load_shipped_report(name: str, config_hash: str) -> dict[str, Any] | None:
    """The shipped report of config `name` if it was compiled from the config whose hash is `config_hash`
    (`config.config_hash(config)`: the config as it is now), else None."""
    path = report_path(name)
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    return report if report.get("config_hash") == config_hash else None


def gpu_report_of_generation(device_kind: str) -> dict[str, Any] | None:
    """The shipped compile report of this library's step on the most GPUs of `device_kind`'s generation
    (V100, A100, H100, H200: a card of 16 or 32 GB runs the same program), or None: what a GPU system
    without a report of its own (a what-if, a published system) is modelled from."""
    spec = hardware.device_spec(device_kind)
    generation = spec.generation if spec is not None else None
    best = None
    for name in shipped_gpu_configs():
        path = report_path(name)
        if not generation or not path.is_file():
            continue
        report = json.loads(path.read_text())
        kind = hardware.device_spec(report["device_kind"])
        if kind is not None and kind.generation == generation and (
                best is None or report["num_devices"] > best["num_devices"]):
            best = report
    return best
