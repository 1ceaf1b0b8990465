"""Cold against cached compile seconds of the real training step, with JAX's persistent compilation cache.

  python benchmarks/compile_cache.py [--repeats=3] [--json_out=benchmarks/results/compile_cache.json]

For each workload (the demo's step; the ResNet-50 float32 step at batch 16, 224 px, synthetic data), each
repeat starts two fresh processes on one new, empty cache folder: the first compiles and fills the cache
(cold), the second finds the program there (cached), as a run restarted after a preemption does. Each
process builds the trainer's state and step (`training_setup.setup`) and times
`jit(train_step).lower(state, batch).compile()`; the cached figure still includes tracing and lowering.
Prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "demo (ResNet-18/4, 32 px, batch 128)": ["--config=demo"],
    "ResNet-50 float32, batch 16, 224 px": ["--config=default", "--config.data.source=synthetic",
                                            "--config.training.global_batch_size=16",
                                            "--config.eval.global_batch_size=16"],
}

_CHILD = """
import json, sys, jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
from absl import flags
from ml_collections import config_flags
from resnet_scaling import config as config_lib
from resnet_scaling.training import training_setup
config_flags.DEFINE_config_file("config")
flags.FLAGS(["child", *config_lib.resolve_config_flag(sys.argv[2:])])
run = training_setup.setup(flags.FLAGS.config, abstract=False)
_, seconds = run.compile_train_step()
print(json.dumps({"compile_sec": seconds}))
"""


def compile_sec(cache_dir: str, config_args: list[str]) -> float:
    """Compile seconds of the train step in a fresh process using `cache_dir`."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return harness.run_child_json(_CHILD, [cache_dir, *config_args], env, cwd=REPO)["compile_sec"]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_flags(p, repeats=3, json_out=str(REPO / "benchmarks" / "results" / "compile_cache.json"))
    args = p.parse_args(argv)
    results = {}
    for name, config_args in WORKLOADS.items():
        cold, cached = [], []
        for _ in range(args.repeats):  # Cold, then cached on the same new folder, as a restart meets it.
            with tempfile.TemporaryDirectory() as cache_dir:
                cold.append(compile_sec(cache_dir, config_args))
                cached.append(compile_sec(cache_dir, config_args))
        results[name] = {"cold_sec": cold, "cached_sec": cached, "cold_sec_median": statistics.median(cold),
                         "cached_sec_median": statistics.median(cached)}
    print(harness.markdown_table(
        ["workload", "cold compile, s (median)", "cached, s (median)", "cached / cold"],
        [[name, f"{r['cold_sec_median']:.2f}", f"{r['cached_sec_median']:.2f}",
          f"{r['cached_sec_median'] / r['cold_sec_median']:.2f}"] for name, r in results.items()]))
    harness.write_json(args.json_out, {"benchmark": "compile_cache", "environment": harness.environment(),
                                       "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
