"""Seconds to save a replicated train state: orbax's replica-parallel writes for every array against the
checkpointer's, which split an array over the replicas only in slices of 1 MiB or more.

  python benchmarks/checkpoint_save.py [--repeats=3] [--devices=8]
      [--json_out=benchmarks/results/checkpoint_save.json]

Each repeat runs each variant in a fresh process (alternating), on `--devices` fake CPU devices: a train
state with the shapes and shardings `training_setup.setup` gives the config (replicated over the devices,
as in a data-parallel run), filled with noise, saved by `checkpointing.Checkpointer` 4 times, each save
waited for. The first save of a process includes what is
compiled for it (orbax slices each replicated array per device); the later ones are the median of 3.
"orbax's default" sets `checkpointing.MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL` to None in its process (orbax's
own default: every replicated array sliced). Prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "resnet_tiny (8 filters, 10 classes)": ["model.name=resnet_tiny", "model.num_filters=8",
                                             "model.num_classes=10"],
    "ResNet-50 (1,000 classes)": ["model.name=resnet50"],
}
VARIANTS = ("orbax's default", "the checkpointer's")

_CHILD = """
import json, sys, tempfile, time
import jax
import numpy as np
from resnet_scaling import checkpointing, config as config_lib
from resnet_scaling.training import sections, training_setup
variant, overrides = sys.argv[1], sys.argv[2:]
if variant == "orbax's default":
    checkpointing.MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL = None
config = config_lib.get_base_config()
config.data.source = "synthetic"
config.data.image_size = 32
config.training.global_batch_size = config.eval.global_batch_size = 8 * jax.device_count()
for override in overrides:
    key, value = override.split("=")
    section, name = key.split(".")
    config[section][name] = type(config[section][name])(value)
run = training_setup.setup(config, abstract=True)
parts = sections.read(run.config)
# The state's shapes and shardings filled with noise (not zeros, which compress): no initialiser to compile.
rng = np.random.default_rng(0)
state = jax.tree.map(lambda s: jax.device_put(rng.standard_normal(s.shape).astype(s.dtype), s.sharding),
                     run.state)
seconds = []
with tempfile.TemporaryDirectory() as workdir:
    checkpointer = checkpointing.Checkpointer(workdir, parts.checkpoint, parts.record)
    for step in range(1, 5):
        start = time.perf_counter()
        checkpointer.save(step, state, clock={})
        checkpointer.wait()
        seconds.append(time.perf_counter() - start)
    checkpointer.close()
print(json.dumps({"seconds": seconds}))
"""


def save_seconds(variant: str, overrides: list[str], num_devices: int) -> list[float]:
    """The 4 saves' seconds in a fresh process with `num_devices` fake CPU devices."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={num_devices}"}
    return harness.run_child_json(_CHILD, [variant, *overrides], env, cwd=REPO)["seconds"]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_flags(p, repeats=3, json_out=str(REPO / "benchmarks" / "results" / "checkpoint_save.json"))
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices the state is replicated over")
    args = p.parse_args(argv)
    results = {}
    for name, overrides in WORKLOADS.items():
        runs = harness.alternate(
            {v: functools.partial(save_seconds, v, overrides, args.devices) for v in VARIANTS}, args.repeats)
        results[name] = {v: {"saves_sec": r, "first_sec_median": statistics.median(s[0] for s in r),
                             "later_sec_median": statistics.median(statistics.median(s[1:]) for s in r)}
                         for v, r in runs.items()}
    rows = []
    for name, by_variant in results.items():
        default, ours = (by_variant[v] for v in VARIANTS)
        rows.append([name, f"{default['first_sec_median']:.2f}", f"{ours['first_sec_median']:.2f}",
                     f"{default['later_sec_median']:.2f}", f"{ours['later_sec_median']:.2f}"])
    print(f"{args.devices} devices, medians of {args.repeats} processes each")
    print(harness.markdown_table(
        ["state", "first save, orbax's default (s)", "first save, the checkpointer's (s)",
         "later saves, orbax's default (s)", "later saves, the checkpointer's (s)"], rows))
    harness.write_json(args.json_out, {"benchmark": "checkpoint_save", "devices": args.devices,
                                       "environment": harness.environment(), "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
