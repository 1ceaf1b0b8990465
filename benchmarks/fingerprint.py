"""A run's fingerprint, to show that a refactoring left training bitwise unchanged: the demo config cut to
`--steps` steps (40) on 8 fake CPU devices, through the command line (`python -m resnet_scaling.train`).

Records every step's training loss, top-1 and learning rate (`training.log_every_steps=1`), the final
evaluation's metrics, and a SHA-256 of the exported parameters and BN statistics (every array's path,
dtype, shape and bytes, in path order). Two fingerprints compare with `--compare`: equal means bitwise
equal. Takes a few minutes on 2 cores (the shapes dataset is written once into its cache first).

    python benchmarks/fingerprint.py --json_out=/tmp/fingerprint_before.json
    # ... change the code ...
    python benchmarks/fingerprint.py --json_out=/tmp/fingerprint_after.json \
        --compare=/tmp/fingerprint_before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

# Per-step figures that depend only on the computation (not the wall clock).
STEP_KEYS = ("loss", "top1", "top5", "learning_rate")
EVAL_KEYS = ("eval_loss", "eval_top1", "eval_top5", "eval_count")


def run_demo(workdir: str, num_steps: int, num_devices: int) -> None:
    """Trains the demo for `num_steps` steps into `workdir` on `num_devices` fake CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}",
               JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
               f"--config.training.num_train_steps={num_steps}", "--config.training.log_every_steps=1",
               "--config.training.compilation_cache_dir="]
    subprocess.run(command, env=env, check=True)


def parameter_hash(variables: Any) -> str:
    """SHA-256 over every array's path, dtype, shape and bytes, in path order."""
    import jax  # Here: the run above set its own XLA_FLAGS in its own process.

    digest = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(variables)[0]
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        array = np.asarray(leaf)
        digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def fingerprint(workdir: str) -> dict[str, Any]:
    """The per-step records, the evaluations and the exported parameters' hash of a finished run."""
    from resnet_scaling import checkpointing

    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [{"step": r["step"], **{k: r[k] for k in STEP_KEYS if k in r}}
             for r in records if "loss" in r]
    evals = [{"step": r["step"], **{k: r[k] for k in EVAL_KEYS if k in r}}
             for r in records if "eval_top1" in r]
    variables, _ = checkpointing.load_exported(workdir)
    return {"steps": steps, "evals": evals, "params_sha256": parameter_hash(variables)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="Training steps of the demo.")
    parser.add_argument("--devices", type=int, default=8, help="Fake CPU devices.")
    parser.add_argument("--workdir", default=None, help="The run's workdir (default: a fresh temporary one).")
    parser.add_argument("--json_out", required=True, help="Where the fingerprint's JSON goes.")
    parser.add_argument("--compare", default=None, help="An earlier fingerprint: exit 1 unless equal.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or os.path.join(scratch, "run")
        run_demo(workdir, args.steps, args.devices)
        result = {"steps_run": args.steps, "devices": args.devices, **fingerprint(workdir)}
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    last = result["evals"][-1] if result["evals"] else {}
    print(f"{len(result['steps'])} step records, final eval_top1 {last.get('eval_top1')}, "
          f"params {result['params_sha256'][:16]}")
    if args.compare:
        with open(args.compare) as f:
            expected = json.load(f)
        if expected != result:
            print(f"DIFFERENT from {args.compare}")
            sys.exit(1)
        print(f"bitwise equal to {args.compare}")


if __name__ == "__main__":
    main()
