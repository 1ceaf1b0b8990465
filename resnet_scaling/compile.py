"""Entry point: compile the training step ahead of time for a TPU topology, and report on it.

    python -m resnet_scaling.compile --config=pod [--topology=v2:16x16] [--json_out=PATH]
    python -m resnet_scaling.compile --shipped      # every shipped TPU config, into the package's reports

Needs libtpu (`pip install -e '.[tpu]'`), not a TPU: libtpu describes the topology's devices. Prints
per-device memory against the chip's HBM, FLOPs per step and the step's collectives (planning/aot.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from absl import app, flags
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling.job import errors, process_setup, workdir
from resnet_scaling.metrics import console
from resnet_scaling.planning import aot, shipped_reports

logger = logging.getLogger("resnet_scaling.compile")  # Not __name__: "__main__" under `python -m`.

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py) or the name of a shipped one (pod, tpu_v2_256, ...).",
    lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None,
                                "TPU topology, e.g. v2:16x16 (default: config.system.topology).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the report as JSON to this path.")
_SHIPPED = flags.DEFINE_bool("shipped", False, "Compile every shipped config that names a TPU topology and "
                             "write its report into the package (planning/compiled_reports/), where the "
                             "planner reads it instead of compiling.")


def main(argv: list[str]) -> None:
    console.refuse_arguments(argv)
    console.configure_command_line_logging()
    process_setup.start_host_compiler()
    if _SHIPPED.value:
        write_shipped_reports()
        return
    if _CONFIG.value is None:
        raise SystemExit("error: --config is required (or --shipped): the config to compile.")
    config = console.read_config_flag(_CONFIG)
    topology = _TOPOLOGY.value or config.system.topology
    if not topology:
        raise SystemExit("error: no TPU topology to compile for: set config.system.topology or pass "
                         "--topology=v2:16x16.")
    try:  # libtpu missing, a topology it cannot describe, an invalid config: one line each.
        report = aot.compile_for_topology(config, topology)
    except errors.RunError as e:
        raise SystemExit(f"error: {e}") from None
    print(aot.format_report(report))
    if _JSON_OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
        with open(_JSON_OUT.value, "w") as f:
            json.dump(dataclasses.asdict(report), f, indent=2)
        logger.info("Wrote %s.", _JSON_OUT.value)


def write_shipped_reports() -> None:
    """Compiles every shipped TPU config for its topology and writes its report into the package."""
    names = shipped_reports.shipped_tpu_configs()
    for i, name in enumerate(names, 1):
        config = config_lib.load_config(name)
        logger.info("%d of %d: compiling %s for %s.", i, len(names), name, config.system.topology)
        report = aot.compile_for_topology(config)
        path = shipped_reports.report_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        workdir.write_text_atomically(path, json.dumps(dataclasses.asdict(report), indent=2) + "\n")
        logger.info("Wrote %s (compiled in %.0f s).", path, report.compile_sec)


if __name__ == "__main__":
    app.run(main, flags_parser=console.parse_config_flags)
