"""Entry point: compile the training step ahead of time for a TPU topology or GPUs, and report on it.

    python -m resnet_scaling.compile --config=pod [--topology=v2:16x16] [--json_out=PATH]
    python -m resnet_scaling.compile --config=gpu_v100x8   # 8 V100s, described by XLA's target config
    python -m resnet_scaling.compile --shipped      # every shipped TPU and GPU config, into the package

Needs libtpu (`pip install -e '.[tpu]'`) for a TPU, JAX's CUDA plugin and ptxas (`pip install -e
'.[gpu_compile]'`) for a GPU; neither the TPU nor the GPU. Prints per-device memory against the chip's or
card's, FLOPs per step and the step's collectives (planning/aot.py). JAX loads once the command line is
read: `--help` and a usage mistake answer in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling.config import command_line
from resnet_scaling.job import console, errors, native_noise, workdir

if TYPE_CHECKING:
    from resnet_scaling.planning import aot

logger = logging.getLogger("resnet_scaling.compile")  # Not __name__: "__main__" under `python -m`.

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py) or the name of a shipped one (pod, tpu_v2_256, ...).",
    lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None,
                                "TPU topology, e.g. v2:16x16 (default: config.system.topology; a config "
                                "with none compiles for its GPUs, config.system.device_kind).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the report as JSON to this path.")
_SHIPPED = flags.DEFINE_bool("shipped", False, "Compile every shipped config that names a TPU topology "
                             "or a GPU and write its report into the package (planning/compiled_reports/), "
                             "where the planner reads it instead of compiling.")


def main(argv: list[str]) -> None:
    command_line.refuse_arguments(argv)
    if not _SHIPPED.value and _CONFIG.value is None:
        raise SystemExit("error: --config is required (or --shipped): the config to compile.")
    console.configure_command_line_logging()
    native_noise.import_jax_quietly()  # Before the imports below load JAX.
    from resnet_scaling.job import process_setup
    from resnet_scaling.planning import aot

    process_setup.start_host_compiler()
    if _SHIPPED.value:
        write_shipped_reports()
        return
    config = command_line.read_config_flag(_CONFIG)
    try:  # libtpu or the CUDA plugin missing, a target it cannot describe, an invalid config: one line each.
        report = compile_config(config, _TOPOLOGY.value or "")
    except errors.RunError as e:
        raise SystemExit(f"error: {e}") from None
    print(aot.format_report(report))
    if _JSON_OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
        with open(_JSON_OUT.value, "w") as f:
            json.dump(dataclasses.asdict(report), f, indent=2)
        logger.info("Wrote %s.", _JSON_OUT.value)


def compile_config(config: ml_collections.ConfigDict, topology: str = "") -> aot.CompileReport:
    """`config`'s train and evaluation steps compiled for its target (`topology`, else its own TPU topology
    or GPUs), and their report."""
    from resnet_scaling.planning import aot
    from resnet_scaling.training import training_setup

    target = aot.target_for(config.system, max(1, config.mesh.num_devices), topology)
    logger.info("Compiling the %s train and evaluation steps for %s: %d x %s.", config.model.name,
                target.topology, len(target.devices), target.devices[0].device_kind)
    run = training_setup.setup(config, devices=target.devices, abstract=True)
    return aot.build_report(run, target, config_hash=config_lib.config_hash(config),
                            mlperf_mode=bool(config.mlperf.enabled))


def write_shipped_reports(names: list[str] | None = None) -> None:
    """Compiles every shipped TPU and GPU config (or those of `names`) for its target and writes its report
    into the package."""
    from resnet_scaling.planning import shipped_reports

    names = shipped_reports.shipped_compiled_configs() if names is None else names
    for i, name in enumerate(names, 1):
        config = config_lib.load_config(name)
        logger.info("%d of %d: %s.", i, len(names), name)
        report = compile_config(config)
        path = shipped_reports.report_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        workdir.write_text_atomically(path, json.dumps(dataclasses.asdict(report), indent=2) + "\n")
        logger.info("Wrote %s (compiled in %.0f s).", path, report.compile_sec)


if __name__ == "__main__":
    app.run(main, flags_parser=command_line.parse_config_flags)
