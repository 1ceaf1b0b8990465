"""CPU ResNet-50 v1.5 float32 training step: this library, the flax ImageNet example and PyTorch, in one run.

Each framework runs in a worker subprocess of its own, so that its peak resident memory is its own
(`ru_maxrss` of the child, from `os.wait4`). The workers are set up, compiled and warmed up one after
the other; then the parent asks each in turn for one timed repeat of `--steps` steps, `--repeats` times,
so that all of them see the same machine load. Every worker but the one at work is stopped (SIGSTOP).
Synthetic data, one batch of `--batch_size` images of `--image_size` pixels; images/sec is the median
over the repeats, and a ratio to ours the median over the repeats of the ratio within each repeat.

- `ours`: the library's step (`training_setup.setup` -> `steps.jit_train_step`, compiled ahead of time,
  state donated, batches already on the device), as `train_step.py` times it; SGD momentum 0.9, L2 1e-4
  on kernels; the step on the main thread and glibc keeping what it frees, as `python -m
  resnet_scaling.train` runs CPU steps (`resnet_scaling/job/memory.py`). Memory also from XLA's memory
  analysis of the compiled step.
- `ours_nokeep`: the same without that (`--nokeep_freed_memory`): asynchronous dispatch, glibc's defaults.
- `flax_example`: the flax ImageNet example's step (`flax_example_baseline.make_step`: `pmap`, `nn.Conv`,
  `nn.max_pool`, L2 in the loss, SGD Nesterov momentum 0.9).
- `torch`: torchvision's `resnet50` (v1.5: stride 2 in the 3x3 convolutions) in channels-last layout, or,
  where torchvision's compiled ops do not load, the same architecture defined here (`torch_resnet50`);
  cross-entropy, `torch.optim.SGD` momentum 0.9, weight decay 1e-4 on conv and linear weights; eager mode
  with `torch.get_num_threads()` threads.

Where PyTorch is not installed its row says so and the others still run (exit status 0).

    python benchmarks/torch_baseline.py --batch_size=16 --steps=2 --repeats=3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness  # Beside this script.

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("ours", "ours_nokeep", "flax_example", "torch")
LABELS = {"ours": "resnet_scaling (this library)", "ours_nokeep": "resnet_scaling, --nokeep_freed_memory",
          "flax_example": "flax examples/imagenet step",
          "torch": "PyTorch ResNet-50 v1.5 (channels-last, eager)"}
TORCH_INSTALL = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"
_PROTOCOL = "@@ "  # Marks the workers' reply lines on stdout; anything else there is a library's chatter.


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--steps", type=int, default=2, help="Timed steps per repeat.")
    p.add_argument("--warmup_steps", type=int, default=1, help="Untimed steps after compiling.")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="Comma-separated, from FRAMEWORKS.")
    harness.add_flags(p, repeats=3, json_out=None,
                      json_out_help="Default: benchmarks/results/torch_baseline-cpu-b{batch_size}.json")
    p.add_argument("--worker", choices=FRAMEWORKS, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.frameworks.split(",") if n]
    if not names or set(names) - set(FRAMEWORKS):
        p.error(f"--frameworks: choose from {', '.join(FRAMEWORKS)}; got {args.frameworks!r}.")
    if args.steps < 1 or args.repeats < 1 or args.warmup_steps < 0:
        p.error("--steps and --repeats must be >= 1, --warmup_steps >= 0.")
    args.frameworks = names
    return args


def torch_available() -> bool:
    """Whether PyTorch can be imported here (without importing it)."""
    return importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------------------------------------------------------
# Workers: each builds one framework's step and answers "run" with the seconds of `--steps` steps.

def torch_resnet50(num_classes: int = 1000) -> tuple[Any, str]:
    """torchvision's resnet50, or the same ResNet-50 v1.5 defined here when torchvision does not load
    (e.g. a CUDA build of torchvision beside a CPU-only torch); returns (model, where it came from)."""
    try:
        from torchvision.models import resnet50

        return resnet50(num_classes=num_classes), "torchvision.models.resnet50"
    except (ImportError, RuntimeError, OSError):
        pass
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, in_channels: int, width: int, stride: int):
            super().__init__()
            out = width * 4
            self.conv1, self.bn1 = nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)  # v1.5: stride here.
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or in_channels != out:
                self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False),
                                                nn.BatchNorm2d(out))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + identity)

    layers = [nn.Conv2d(3, 64, 7, 2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, padding=1)]
    in_channels = 64
    for stage, num_blocks in enumerate((3, 4, 6, 3)):
        for block in range(num_blocks):
            layers.append(Bottleneck(in_channels, 64 * 2**stage, 2 if stage > 0 and block == 0 else 1))
            in_channels = 64 * 2**stage * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes)]
    return nn.Sequential(*layers), "torchvision's ResNet-50 architecture, defined in torch_baseline.py"


def _torch_worker(args: argparse.Namespace) -> tuple[Callable[[int], float], dict[str, Any]]:
    import torch

    torch.manual_seed(0)
    model, source = torch_resnet50()
    model = model.to(memory_format=torch.channels_last).train()
    kernels = [p for p in model.parameters() if p.ndim > 1]  # L2 on conv and linear weights, as ours.
    others = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD([{"params": kernels, "weight_decay": 1e-4}, {"params": others}],
                                lr=0.1, momentum=0.9)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size).contiguous(
        memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch_size,))

    def run(num_steps: int) -> float:
        start = time.perf_counter()
        for _ in range(num_steps):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
        loss.item()  # CPU ops are synchronous; this only makes the end of the step explicit.
        return time.perf_counter() - start

    start = time.perf_counter()
    run(1 + args.warmup_steps)
    return run, {"first_steps_sec": time.perf_counter() - start, "model": source,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "num_params": sum(p.numel() for p in model.parameters())}


def _jax_worker(args: argparse.Namespace, name: str) -> tuple[Callable[[int], float], dict[str, Any]]:
    sys.path.insert(0, str(HERE))  # train_step.py and flax_example_baseline.py live beside this script.
    import jax

    if name == "ours":  # As `python -m resnet_scaling.train` runs CPU steps; before the backend starts.
        from resnet_scaling.job import memory as host_memory

        jax.config.update("jax_cpu_enable_async_dispatch", False)
        host_memory.keep_freed_memory()
    import train_step

    from resnet_scaling.metrics.compiled import memory_per_device
    from resnet_scaling.training.training_setup import setup

    info: dict[str, Any] = {"jax": jax.__version__, "device_kind": jax.devices()[0].device_kind}
    start = time.perf_counter()
    if name in ("ours", "ours_nokeep"):
        config = train_step.make_config(argparse.Namespace(
            model="resnet50", dtype="float32", batch_size=args.batch_size, image_size=args.image_size,
            optimizer="sgd", num_devices=1))
        run_setup = setup(config)
        batches = run_setup.source.train_batches()
        step, info["compile_sec"] = run_setup.compile_train_step()
        state, next_batch = run_setup.state, lambda: next(batches)
        info["memory_analysis_bytes"] = memory_per_device(step)
        info["num_params"] = run_setup.num_params
    else:
        import flax_example_baseline

        step, state, batch = flax_example_baseline.make_step(args.batch_size, args.image_size)
        next_batch = lambda: batch  # noqa: E731
    holder = [state]

    def run(num_steps: int) -> float:
        holder[0], seconds = train_step.time_steps(step, holder[0], next_batch, num_steps)
        return seconds

    run(1 + args.warmup_steps)  # The flax example's first step also compiles it.
    info["first_steps_sec"] = time.perf_counter() - start
    return run, info


def worker(args: argparse.Namespace) -> None:
    """Builds `args.worker`'s step, says so, then times `args.steps` steps per "run" line on stdin."""
    run, info = _torch_worker(args) if args.worker == "torch" else _jax_worker(args, args.worker)
    _send(info)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        _send({"seconds": run(args.steps)})


def _send(message: dict[str, Any]) -> None:
    print(_PROTOCOL + json.dumps(message), flush=True)


# ---------------------------------------------------------------------------------------------------------
# The parent: start the workers one by one, alternate their repeats, collect their peak memory.

class Worker:
    """One framework's worker subprocess."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name = name
        env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
        # One CPU device, whatever the caller's XLA_FLAGS faked (the tests' 8 devices, for one).
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                    if not f.startswith("--xla_force_host_platform_device_count"))
        command = [sys.executable, str(Path(__file__).resolve()), f"--worker={name}",
                   f"--batch_size={args.batch_size}", f"--image_size={args.image_size}",
                   f"--steps={args.steps}", f"--warmup_steps={args.warmup_steps}"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=env, cwd=HERE.parent)
        self.info = self._receive()

    def _receive(self) -> dict[str, Any]:
        for line in self.process.stdout:
            if line.startswith(_PROTOCOL):
                return json.loads(line[len(_PROTOCOL):])
        raise RuntimeError(f"The {self.name} worker exited with status {self.process.wait()} "
                           "before answering (its stderr is above).")

    def pause(self) -> None:
        """Stops the worker's process (SIGSTOP) while another framework is set up or timed: an idle
        framework is not idle on the CPU (PyTorch's OpenMP threads spin-wait after their work), and with
        the PyTorch worker merely alive the JAX step measured up to 1.5x slower on 2 cores."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def time_repeat(self) -> float:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return self._receive()["seconds"]

    def time_repeat_alone(self) -> float:
        """One timed repeat with only this framework running (the others stay paused)."""
        self.resume()
        try:
            return self.time_repeat()
        finally:
            self.pause()

    def close(self) -> int:
        """Stops the worker; returns its peak resident set size in bytes."""
        self.resume()
        self.process.stdin.close()
        _, status, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        if self.process.returncode != 0:
            raise RuntimeError(f"The {self.name} worker exited with status {self.process.returncode}.")
        return usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # Linux reports KiB.


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Starts the workers, alternates their repeats and returns the results."""
    rows: dict[str, dict[str, Any]] = {}
    workers: dict[str, Worker] = {}
    try:
        for name in args.frameworks:
            if name == "torch" and not torch_available():
                rows[name] = {"skipped": f"PyTorch is not installed here ({TORCH_INSTALL})"}
                print(f"{name}: skipped: {rows[name]['skipped']}", flush=True)
                continue
            workers[name] = Worker(name, args)  # One at a time: no compile competes with another.
            workers[name].pause()
        seconds = harness.alternate({name: w.time_repeat_alone for name, w in workers.items()}, args.repeats)
    except BaseException:
        for w in workers.values():
            w.process.kill()
            w.process.wait()
        raise
    peak_rss = {name: w.close() for name, w in workers.items()}
    for name, w in workers.items():
        rates = [args.batch_size * args.steps / s for s in seconds[name]]
        rows[name] = {**w.info, "images_per_sec_repeats": rates,
                      "images_per_sec_median": statistics.median(rates),
                      "sec_per_step_median": statistics.median(seconds[name]) / args.steps,
                      "peak_rss_bytes": peak_rss[name]}
    if "ours" in workers:
        for name in workers:
            rows[name]["ours_over_this"] = harness.median_ratio(rows["ours"]["images_per_sec_repeats"],
                                                                rows[name]["images_per_sec_repeats"])
    return {
        "benchmark": "torch_baseline",
        "config": {k: v for k, v in vars(args).items() if k not in ("json_out", "worker")},
        "frameworks": rows,
        "environment": harness.environment(machine=platform.machine()),
    }


def print_table(result: dict[str, Any]) -> None:
    """A Markdown table: images/sec, ratio to ours, peak memory."""
    print("| step | images/sec, median [per repeat] | sec/step | ours / this | peak memory |")
    print("|---|---|---|---|---|")
    for name, row in result["frameworks"].items():
        if "skipped" in row:
            print(f"| {LABELS[name]} | skipped: {row['skipped']} | | | |")
            continue
        repeats = ", ".join(f"{r:.2f}" for r in row["images_per_sec_repeats"])
        memory = f"peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB"
        analysis = row.get("memory_analysis_bytes")
        if analysis:
            memory = (f"XLA: {analysis['total'] / 2**30:.2f} GiB (temporaries {analysis['temp'] / 2**30:.2f} "
                      f"GiB); {memory}")
        ratio = f"{row['ours_over_this']:.2f}x" if "ours_over_this" in row else "n/a"
        print(f"| {LABELS[name]} | {row['images_per_sec_median']:.2f} [{repeats}] | "
              f"{row['sec_per_step_median']:.2f} | {ratio} | {memory} |")
    if "model" in result["frameworks"].get("torch", {}):
        row = result["frameworks"]["torch"]
        print(f"PyTorch {row['torch']}, {row['threads']} threads, model: {row['model']}")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Runs the benchmark (or, with --worker, one framework's worker)."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return None
    result = run(args)
    print_table(result)
    default_out = HERE / "results" / f"torch_baseline-cpu-b{args.batch_size}.json"
    harness.write_json(args.json_out or default_out, result)
    return result


if __name__ == "__main__":
    main()
