"""Synthetic-data images/sec of the library's real training step over a list of device counts, as JSON.

Fake CPU devices (the default on a machine without accelerators):
  python benchmarks/throughput.py --device_counts=1,2,4,8 --model=resnet_tiny --image_size=32
Real chips (the first N devices of the job's mesh, in this process):
  python benchmarks/throughput.py --real_devices --device_counts=1,2,4,8 --per_device_batch_size=256 \
      --dtype=bfloat16

Each point is `train_step.py`'s measurement (the trainer's own state and step, compiled ahead of time,
synthetic batches on the device, median of `--repeats`), with the global batch `--per_device_batch_size`
x N (weak scaling, as the case study grew the batch with the pod) or a fixed `--global_batch_size`
(strong scaling). Scaling efficiency is each point's images/sec per device over the first point's.

Fake CPU devices need `--xla_force_host_platform_device_count` in XLA_FLAGS before jax is imported, so
each device count runs in its own subprocess. They share the machine's cores: they test the sharded code
path, not the scaling; use real chips for scaling figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness  # Beside this script.

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device_counts", default="1,2,4,8", help="Comma-separated device counts.")
    p.add_argument("--real_devices", action="store_true",
                   help="Use the backend's real devices in this process instead of fake CPU devices.")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--per_device_batch_size", type=int, default=16, help="Weak scaling: global = this x N.")
    p.add_argument("--global_batch_size", type=int, default=-1, help="Strong scaling: fixed global batch.")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=5, help="Timed steps per repeat.")
    p.add_argument("--warmup_steps", type=int, default=2)
    p.add_argument("--timeout_sec", type=int, default=3600, help="Per device count (fake CPU devices).")
    harness.add_flags(p, repeats=3, json_out=None,
                      json_out_help="Default: benchmarks/results/throughput-....json")
    p.add_argument("--_point", type=int, default=None, help=argparse.SUPPRESS)  # Internal: one count.
    args = p.parse_args(argv)
    args.counts = [int(c) for c in args.device_counts.split(",") if c.strip()]
    if not args.counts or min(args.counts) < 1:
        p.error("--device_counts needs positive integers, e.g. 1,2,4,8.")
    return args


def step_args(args: argparse.Namespace, num_devices: int) -> argparse.Namespace:
    """The options `train_step.run` takes, for one device count."""
    import train_step  # Beside this script.

    batch = args.global_batch_size if args.global_batch_size > 0 else args.per_device_batch_size * num_devices
    return train_step.parse_args([
        f"--model={args.model}", f"--dtype={args.dtype}", f"--batch_size={batch}",
        f"--image_size={args.image_size}", f"--optimizer={args.optimizer}", f"--steps={args.steps}",
        f"--warmup_steps={args.warmup_steps}", f"--repeats={args.repeats}", f"--num_devices={num_devices}"])


def measure(args: argparse.Namespace, num_devices: int) -> dict[str, Any]:
    """One point, measured in this process (jax must already see at least `num_devices` devices)."""
    import train_step

    r = train_step.run(step_args(args, num_devices), train_step.EventCounter())
    env = r["environment"]
    return {"num_devices": env["num_devices"], "global_batch_size": r["config"]["batch_size"],
            "per_device_batch_size": r["config"]["per_device_batch_size"],
            "images_per_sec": r["images_per_sec_median"],
            "images_per_sec_per_device": r["images_per_sec_per_device"],
            "images_per_sec_repeats": r["images_per_sec_repeats"], "sec_per_step": r["sec_per_step_median"],
            "compile_sec": r["compile_sec"], "flops_per_step": r["flops_per_step"],
            "device_kind": env["device_kind"], "platform": env["platform"], "jax": env["jax"]}


def measure_in_subprocess(args: argparse.Namespace, argv: list[str], num_devices: int) -> dict[str, Any]:
    """One point on `num_devices` fake CPU devices, in a fresh process (XLA_FLAGS before jax starts)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={num_devices}"])}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, f"--_point={num_devices}"],
                          env=env, capture_output=True, text=True, timeout=args.timeout_sec)
    if proc.returncode != 0:
        raise RuntimeError(f"{num_devices} devices failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def with_scaling(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds speedup and scaling efficiency against the first point (per device images/sec)."""
    base = points[0]
    for p in points:
        p["speedup"] = p["images_per_sec"] / base["images_per_sec"]
        p["scaling_efficiency"] = p["images_per_sec_per_device"] / base["images_per_sec_per_device"]
    return points


def main(argv: list[str]) -> dict[str, Any]:
    """Measures every device count, prints a table, writes the JSON and returns it."""
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args._point is not None:  # A worker: one point, one JSON line on stdout.
        print(json.dumps(measure(args, args._point)))
        return {}
    forwarded = [a for a in argv if not a.startswith("--json_out")]
    points = [measure(args, n) if args.real_devices else measure_in_subprocess(args, forwarded, n)
              for n in args.counts]
    points = with_scaling(points)
    result = {
        "benchmark": "throughput", "fake_cpu_devices": not args.real_devices,
        "scaling": "strong" if args.global_batch_size > 0 else "weak",
        "options": {k: v for k, v in vars(args).items() if k not in ("json_out", "_point", "counts")},
        "points": points, "environment": harness.environment(),
    }
    print(harness.markdown_table(
        ["devices", "global batch", "images/sec", "per device", "sec/step", "speedup", "efficiency"],
        [[p["num_devices"], p["global_batch_size"], f"{p['images_per_sec']:.1f}",
          f"{p['images_per_sec_per_device']:.1f}", f"{p['sec_per_step'] * 1e3:.1f} ms",
          f"{p['speedup']:.2f}x", f"{p['scaling_efficiency']:.0%}"] for p in points]))
    kind = "cpu-fake" if not args.real_devices else points[0]["platform"]
    name = f"throughput-{kind}-{args.model}-{args.dtype}.json"
    harness.write_json(args.json_out or HERE / "results" / name, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
