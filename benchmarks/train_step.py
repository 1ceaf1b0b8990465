"""Times the library's real training step (the trainer's own functions) on synthetic on-device batches.

CPU:  python benchmarks/train_step.py --dtype=float32 --batch_size=16
GPU:  python benchmarks/train_step.py --dtype=bfloat16 --batch_size=256

The step is compiled ahead of time (`jit(...).lower(state, batch).compile()`) and that executable runs
every warm-up and timed step. Each repeat dispatches `--steps` steps back to back and synchronises once
at its end. Prints a table and writes JSON (timings, memory, FLOPs and MFU, environment) to `--json_out`.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import harness  # Beside this script.
import jax
import jaxlib

from resnet_scaling import config as config_lib
from resnet_scaling.config import fields as config_fields
from resnet_scaling.data import SyntheticSource
from resnet_scaling.job import memory as host_memory
from resnet_scaling.job import xla_flags
from resnet_scaling.metrics import utilisation
from resnet_scaling.metrics.compiled import flops_per_device, memory_per_device
from resnet_scaling.training.training_setup import setup

WATCHED = {"/jax/core/compile/jaxpr_trace_duration": "traces",
           "/jax/core/compile/backend_compile_duration": "compiles"}


class EventCounter:
    """Counts JAX trace and compile events per benchmark phase (from jax.monitoring; nothing wrapped)."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in WATCHED:
            self.counts[self.phase, WATCHED[event]] += 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=config_fields.MODEL_NAMES)
    p.add_argument("--dtype", default="float32", choices=config_fields.COMPUTE_DTYPES)
    p.add_argument("--batch_size", type=int, default=16, help="Global batch size.")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--optimizer", default="sgd", choices=config_fields.OPTIMIZERS)
    p.add_argument("--steps", type=int, default=5, help="Timed steps per repeat.")
    p.add_argument("--warmup_steps", type=int, default=2, help="Untimed steps after compiling.")
    p.add_argument("--num_devices", type=int, default=-1, help="-1: all devices.")
    harness.add_flags(p, repeats=3, json_out=None,
                      json_out_help="Default: benchmarks/results/train_step-....json")
    p.add_argument("--keep_freed_memory", action=argparse.BooleanOptionalAction, default=True,
                   help="CPU: steps on the main thread, glibc keeps what a step frees for the next, as "
                        "`python -m resnet_scaling.train` does (resnet_scaling/job/memory.py).")
    p.add_argument("--baseline", action="store_true",
                   help="Also time the flax ImageNet example's step (flax_example_baseline.py), "
                        "interleaved with ours in every repeat (resnet50 only).")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup_steps < 0:
        p.error("--steps and --repeats must be >= 1, --warmup_steps >= 0.")
    return args


def make_config(args: argparse.Namespace) -> Any:
    """The base config with the benchmark's overrides (`setup` validates it)."""
    config = config_lib.get_base_config()
    config.update_from_flattened_dict({
        "model.name": args.model, "model.compute_dtype": args.dtype, "data.source": "synthetic",
        "data.image_size": args.image_size, "training.global_batch_size": args.batch_size,
        "eval.global_batch_size": args.batch_size, "optimizer.name": args.optimizer,
        "mesh.num_devices": args.num_devices})
    return config


def memory_stats(compiled: Any, device: jax.Device) -> dict[str, int | None]:
    """XLA's per-device memory analysis of the executable (as the trainer and the AOT report read it),
    and the device's peak use where reported."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU devices have none.
        stats = {}
    analysis = memory_per_device(compiled) or {}
    names = ("argument", "output", "alias", "temp", "generated_code", "total")
    return {**{f"{n}_bytes": analysis.get(n) for n in names},
            "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit")}


def time_steps(step_fn: Any, state: Any, next_batch: Callable[[], Any], num_steps: int,
               last_metrics: dict[str, Any] | None = None) -> tuple[Any, float]:
    """Dispatches `num_steps` steps back to back, syncs once; returns the new state and the seconds.

    `last_metrics`, if given, receives the last step's metrics (device arrays, read after the clock stops).
    """
    metrics = None  # num_steps may be 0 (--warmup_steps=0).
    start = time.perf_counter()
    for _ in range(num_steps):
        state, metrics = step_fn(state, next_batch())  # The state is donated: always rebind it.
    jax.block_until_ready((state, metrics))
    seconds = time.perf_counter() - start
    if last_metrics is not None and metrics is not None:
        last_metrics.update(metrics)
    return state, seconds


def _resident_bytes() -> int | None:
    """This process's resident memory now (Linux), else None."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def run(args: argparse.Namespace, events: EventCounter, *, config: Any = None) -> dict[str, Any]:
    """Builds the trainer's state and step, compiles, warms up and times; returns the results.

    Args:
      args: the options (`parse_args`); the timing ones always apply.
      events: counts traces and compiles per phase (every step after compiling must run the executable).
      config: a config to run instead of `make_config(args)` (e.g. a system config from `configs/` with
        `data.source="synthetic"`); its model, dtype and batch should match `args`, which label the result.
    """
    config = make_config(args) if config is None else config
    run_setup = setup(config)  # The trainer's own path: mesh, plan, SyntheticSource, state, jitted steps.
    assert isinstance(run_setup.source, SyntheticSource), type(run_setup.source)
    mesh, plan, state = run_setup.mesh, run_setup.plan, run_setup.state
    batches = run_setup.source.train_batches()  # A few distinct batches already sharded on the mesh.

    events.phase = "compile"
    compiled, compile_sec = run_setup.compile_train_step()  # Lowered with the shaped batch, as AOT does.

    baseline = None
    if args.baseline:
        import flax_example_baseline  # Beside this script.

        events.phase = "baseline"
        b_step, b_state, b_batch = flax_example_baseline.make_step(args.batch_size, args.image_size)
        start = time.perf_counter()
        b_state, _ = time_steps(b_step, b_state, lambda: b_batch, 1 + args.warmup_steps)
        baseline = {"first_steps_sec": time.perf_counter() - start, "repeat_sec": []}

    events.phase = "run"  # From here on every step must be the AOT executable: no tracing, no compiling.
    state, _ = time_steps(compiled, state, lambda: next(batches), args.warmup_steps)
    repeat_sec = []
    host: dict[str, list] = {"minor_page_faults_per_step": [], "resident_bytes_after": []}  # Per repeat.
    last_metrics: dict[str, Any] = {}
    for _ in range(args.repeats):  # Interleaved, so that both see the same machine load.
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        state, seconds = time_steps(compiled, state, lambda: next(batches), args.steps, last_metrics)
        repeat_sec.append(seconds)
        host["minor_page_faults_per_step"].append(
            (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / args.steps)
        host["resident_bytes_after"].append(_resident_bytes())
        if baseline is not None:
            b_state, seconds = time_steps(b_step, b_state, lambda: b_batch, args.steps)
            baseline["repeat_sec"].append(seconds)
    events.phase = "done"
    num_run_steps = args.warmup_steps + args.repeats * args.steps
    assert int(state.step) == num_run_steps, f"state.step {int(state.step)} != {num_run_steps} steps run"
    counts = events.counts
    assert counts["run", "traces"] == 0 and counts["run", "compiles"] == 0, f"Retraced: {dict(counts)}"
    if baseline is not None:
        rates = [args.batch_size * args.steps / s for s in baseline.pop("repeat_sec")]
        baseline.update({"name": "flax examples/imagenet train step (pmap, nn.Conv, L2 in the loss)",
                         "images_per_sec_repeats": rates, "images_per_sec_median": statistics.median(rates)})

    device = mesh.devices.flat[0]
    images_per_sec = [plan.global_batch_size * args.steps / s for s in repeat_sec]
    sec_per_step = statistics.median(repeat_sec) / args.steps
    flops_dev = flops_per_device(compiled)
    flops = flops_dev * mesh.size if flops_dev else None
    # Against the device's dense 16-bit peak (hardware.py); MFU is None on CPUs and unknown kinds.
    util = utilisation(flops_dev, sec_per_step, mesh.size, device.device_kind)
    return {
        "benchmark": "train_step",
        "config": {**{k: v for k, v in vars(args).items() if k != "json_out"},
                   "num_params": run_setup.num_params,
                   "per_device_batch_size": plan.per_device_batch_size},
        "compile_sec": compile_sec,  # Wall time of jit(...).lower(state, batch).compile().
        "images_per_sec_median": statistics.median(images_per_sec), "images_per_sec_min": min(images_per_sec),
        "images_per_sec_max": max(images_per_sec), "images_per_sec_repeats": images_per_sec,
        "images_per_sec_per_device": statistics.median(images_per_sec) / mesh.size,
        "sec_per_step_median": sec_per_step,
        # cost_analysis describes the partitioned program one device runs; the step's total is x devices.
        "flops_per_step_per_device": flops_dev, "flops_per_step": flops,
        "gflops_per_sec": flops / sec_per_step / 1e9 if flops else None,
        "gflops_per_sec_per_device": flops_dev / sec_per_step / 1e9 if flops_dev else None,
        "utilisation": util,
        # The last timed step's metrics (loss, top1, learning_rate; loss_scale with float16).
        "last_step_metrics": {k: float(v) for k, v in last_metrics.items()},
        "memory": memory_stats(compiled, device),
        # This process's page faults (the host's; on CPUs, the step's temporaries) and resident memory.
        "host": host,
        "jax_events": {f"{phase}_{kind}": events.counts[phase, kind] for phase in ("setup", "compile", "run")
                       for kind in ("traces", "compiles")},
        "baseline": baseline,
        "speedup_over_baseline": (statistics.median(images_per_sec) / baseline["images_per_sec_median"]
                                  if baseline else None),
        "steps_run_with_compiled_executable": num_run_steps,
        "environment": harness.environment(
            jaxlib=jaxlib.__version__, flax=flax.__version__, platform=device.platform,
            device_kind=device.device_kind, num_devices=mesh.size, num_visible_devices=jax.device_count(),
            default_matmul_precision=jax.config.jax_default_matmul_precision),
    }


def print_table(r: dict[str, Any]) -> None:
    """A small Markdown table of the headline numbers."""
    c, e, m = r["config"], r["environment"], r["memory"]

    def fmt(v: float | None, spec: str, scale: float = 1.0, unit: str = "") -> str:
        return "n/a" if v is None else f"{v / scale:{spec}}{unit}"

    keys = ("argument_bytes", "output_bytes", "temp_bytes", "peak_bytes_in_use")
    mib = " / ".join(fmt(m[k], ".1f", 2**20, " MiB") for k in keys)
    rows = [
        ("model / dtype / optimizer", f"{c['model']} / {c['dtype']} / {c['optimizer']}"),
        ("batch (global / per device), image", f"{c['batch_size']} / {c['per_device_batch_size']}, "
                                               f"{c['image_size']} px"),
        ("devices", f"{e['num_devices']} x {e['device_kind']} ({e['platform']})"),
        ("compile (lower + compile)", f"{r['compile_sec']:.2f} s"),
        ("images/sec median [min, max]", f"{r['images_per_sec_median']:.2f} [{r['images_per_sec_min']:.2f}, "
                                         f"{r['images_per_sec_max']:.2f}]"),
        ("images/sec per device; sec/step median", f"{r['images_per_sec_per_device']:.2f}; "
                                                   f"{r['sec_per_step_median'] * 1e3:.1f} ms"),
        ("GFLOP/step; achieved GFLOP/s (all devices)",
         f"{fmt(r['flops_per_step'], '.2f', 1e9)}; {fmt(r['gflops_per_sec'], '.1f')}"),
        ("MFU (against the peak in hardware.py)", fmt(r["utilisation"]["mfu"], ".1%")),
        ("memory per device: arg / out / temp / peak in use", mib),
        ("host: minor page faults per step, resident after (per repeat)",
         ", ".join(f"{f:,.0f}" for f in r["host"]["minor_page_faults_per_step"]) + "; "
         + ", ".join(fmt(b, ".2f", 2**30, " GiB") for b in r["host"]["resident_bytes_after"])),
    ]
    if r["baseline"]:
        b = r["baseline"]
        rows.append(("flax example step, images/sec median (same run)", f"{b['images_per_sec_median']:.2f}"))
        rows.append(("ours / flax example", f"{r['speedup_over_baseline']:.2f}x"))
    print("| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows))


def main(argv: list[str]) -> None:
    """Runs the benchmark, prints the table and writes the JSON."""
    args = parse_args(argv)
    if args.baseline and args.model != "resnet50":
        raise SystemExit("--baseline compares ResNet-50 steps; use --model=resnet50.")
    # Compile times are measured here: JAX's persistent cache (JAX_COMPILATION_CACHE_DIR in the caller's
    # environment) would hand back an executable compiled earlier, in milliseconds.
    jax.config.update("jax_enable_compilation_cache", False)
    kept = False
    if args.keep_freed_memory and xla_flags.detect_backend() == "cpu":  # As the training entry point.
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # Before the backend starts.
        kept = host_memory.keep_freed_memory()
    result = run(args, EventCounter())
    result["environment"]["host_memory_kept"] = kept
    print_table(result)
    out = args.json_out or str(Path(__file__).resolve().parent / "results" / (
        f"train_step-{result['environment']['platform']}-{args.model}-{args.dtype}-b{args.batch_size}.json"))
    harness.write_json(out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
