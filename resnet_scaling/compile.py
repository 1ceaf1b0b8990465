"""Entry point: compile the training step ahead of time for a TPU topology, and report on it.

    python -m resnet_scaling.compile --config=pod [--topology=v2:16x16] [--json_out=PATH]

Needs libtpu (`pip install -e '.[tpu]'`), not a TPU: libtpu describes the topology's devices. Prints
per-device memory against the chip's HBM, FLOPs per step and the step's collectives (analysis/aot.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from absl import app, flags
from ml_collections import config_flags

from resnet_scaling import console, errors
from resnet_scaling.analysis import aot
from resnet_scaling.host import process_setup

logger = logging.getLogger("resnet_scaling.compile")  # Not __name__: "__main__" under `python -m`.

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py) or the name of a shipped one (pod, tpu_v2_256, ...).",
    lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None,
                                "TPU topology, e.g. v2:16x16 (default: config.system.topology).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the report as JSON to this path.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    console.refuse_arguments(argv)
    console.configure_command_line_logging()
    process_setup.start_host_compiler()
    config = console.read_config_flag(_CONFIG)
    topology = _TOPOLOGY.value or config.system.topology
    if not topology:
        raise SystemExit("error: no TPU topology to compile for: set config.system.topology or pass "
                         "--topology=v2:16x16.")
    try:  # libtpu missing, a topology it cannot describe, an invalid config: one line each.
        devices = aot.topology_devices(topology, config.system.chips_per_host_bounds,
                                       config.system.num_slices)
        logger.info("Compiling the %s train and evaluation steps for %s: %d x %s.", config.model.name,
                    topology, len(devices), devices[0].device_kind)
        report = aot.build_report(config, devices, topology)
    except errors.RunError as e:
        raise SystemExit(f"error: {e}") from None
    print(aot.format_report(report))
    if _JSON_OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
        with open(_JSON_OUT.value, "w") as f:
            json.dump(dataclasses.asdict(report), f, indent=2)
        logger.info("Wrote %s.", _JSON_OUT.value)


if __name__ == "__main__":
    app.run(main, flags_parser=console.parse_config_flags)
