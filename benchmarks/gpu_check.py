"""One GPU check, ready to run on a single GPU in under 8 minutes: the step speed, memory and MFU of the
library's training step, the V100 float16 recipe, the demo end to end and the host input pipeline.

    bash benchmarks/gpu_check.sh                  # on the GPU machine: installs carried wheels, then this
    python benchmarks/gpu_check.py --out=DIR      # $OUT, when set, wins over --out
    python benchmarks/gpu_check.py --out=DIR --smoke   # the same control flow on a CPU, in seconds

Stages, in order, each in a process of its own with its own time budget (a crash, an out-of-memory or a
hang in one is recorded and the next one runs; the whole run stays within `--total_budget_sec`):

- `environment`: jax/jaxlib, the devices, whether importing the training set-up pulled in TensorFlow,
  the peak of hardware.py's table for the device, a bfloat16 matmul's TFLOP/s as a measured ceiling.
- `train_step_bf16`: ResNet-50, bfloat16, batch `--batch_size` (256), timed by `train_step.run` (the
  trainer's own step, compiled ahead of time): images/sec (median of `--repeats` windows of `--steps`
  steps, each synchronised), compile time, XLA's memory analysis and the device's peak_bytes_in_use,
  XLA's FLOPs and MFU against hardware.py's peak.
- `train_step_fp16_v100`: configs/gpu_v100.py (float16 compute, dynamic loss scaling) at its batch (beside
  its shipped ahead-of-time report: memory and step time against what was compiled without a GPU), on
  synthetic data: images/sec and whether the loss scale stayed finite and sane.
- `demo`: `python -m resnet_scaling.train --config=demo` end to end: wall time, final top-1 (needs
  TensorFlow: it reads its JPEGs through tf.data; skipped with the reason where TensorFlow is missing).
- `input_pipeline`: `benchmarks/input_pipeline.py` with a decoding thread per host core (its command line;
  needs TensorFlow).
- `bf16_batch_ladder`: the same step at `--ladder` batches (384, 512, 768, 1024), largest last, until one
  runs out of memory or the time left runs out; it gets whatever time the stages before it left.

Writes OUT/gpu_check.json after every stage (a run stopped part-way leaves what it measured) and
OUT/gpu_check.log (each stage's output). The JSON: `host` (versions, cores, nvidia-smi), `xla_flags`
(XLA_FLAGS before and after, what xla_flags.apply_throughput_flags added for the detected backend, as
`python -m resnet_scaling.train` adds them), `stages` (each: `status` ok / error / timeout / skipped,
`budget_sec`, `wall_sec`, `command`, and `result`, `error` or `reason`; `log_tail` unless ok) and
`summary` (the headline figures, and warnings).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCHEMA_VERSION = 1
STAGES = ("environment", "train_step_bf16", "train_step_fp16_v100", "demo", "input_pipeline",
          "bf16_batch_ladder")
JAX_STAGES = ("environment", "train_step_bf16", "train_step_fp16_v100", "bf16_batch_ladder")
NEEDS_TENSORFLOW = {
    "demo": "TensorFlow is not installed: the demo reads its generated JPEG dataset through tf.data",
    "input_pipeline": "TensorFlow is not installed: the input-pipeline benchmark times tf.data pipelines",
}
# Seconds per stage, at most (also capped by the time left); the ladder, last, gets all that is left.
BUDGET_SEC = {"environment": 45, "train_step_bf16": 180, "train_step_fp16_v100": 150, "demo": 120,
              "input_pipeline": 45}
MIN_STAGE_SEC = 20  # Less than this left: the stage is skipped (a fresh process alone takes seconds).
KILL_GRACE_SEC = 10
PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
            "flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py", "numpy", "tensorflow",
            "tensorflow-cpu", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-nccl-cu12",
            "nvidia-nccl-cu13")
UNKNOWN_XLA_FLAG = "Unknown flag in XLA_FLAGS"  # What XLA aborts with (a flag this XLA does not have).


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command-line options (`--run_stage` is how the check starts each stage's process)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="Folder for gpu_check.json and gpu_check.log ($OUT wins).")
    p.add_argument("--scratch_dir", default=None, help="Work folder (demo workdir, stage files); default: "
                   "a new temporary folder.")
    p.add_argument("--total_budget_sec", type=float, default=450.0, help="The whole check's time limit.")
    p.add_argument("--stages", default=",".join(STAGES), help="Comma-separated stages to run.")
    p.add_argument("--smoke", action="store_true", help="Tiny model (resnet_tiny), 32 px, 1-2 steps: the "
                   "control flow on a CPU.")
    p.add_argument("--batch_size", type=int, default=None, help="The headline batch (default 256; smoke 4).")
    p.add_argument("--ladder", default=None, help="Larger batches to try (default 384,512,768,1024; "
                   "smoke 8).")
    p.add_argument("--steps", type=int, default=None, help="Steps per timed window (default 10; smoke 1).")
    p.add_argument("--repeats", type=int, default=None, help="Timed windows (default 5; smoke 2).")
    p.add_argument("--warmup_steps", type=int, default=None, help="Untimed steps (default 3; smoke 1).")
    p.add_argument("--num_devices", type=int, default=1, help="Devices per step (-1: all).")
    # For tests: failures injected where they would happen on a GPU machine.
    p.add_argument("--simulate_oom_at_batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--fail_stage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--pretend_no_tensorflow", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run_stage", default=None, choices=JAX_STAGES, help=argparse.SUPPRESS)
    p.add_argument("--stage_json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--budget_sec", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    smoke = args.smoke
    for name, full, tiny in (("batch_size", 256, 4), ("ladder", "384,512,768,1024", "8"), ("steps", 10, 1),
                             ("repeats", 5, 2), ("warmup_steps", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if smoke else full)
    args.ladder = [int(b) for b in str(args.ladder).split(",") if b]
    unknown = set(args.stages.split(",")) - set(STAGES) - {""}
    if unknown:
        p.error(f"--stages: unknown {', '.join(sorted(unknown))}; choose from {', '.join(STAGES)}.")
    return args


# ----------------------------------------------------------------------------- stages run in a child


def is_out_of_memory(error: BaseException | str) -> bool:
    """Whether an error is XLA's out-of-memory (RESOURCE_EXHAUSTED), at compile or at run time."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 2000 else text[:2000] + " [...]"


class StageFile:
    """The stage's JSON file, rewritten after every step of the stage, so a killed stage leaves its part."""

    def __init__(self, path: str) -> None:
        self.path, self.record = Path(path), {"status": "running", "result": {}}

    def update(self, **result: Any) -> None:
        self.record["result"].update(result)
        self.write()

    def write(self) -> None:
        write_json(self.path, self.record)


def measure(args: argparse.Namespace, events: Any, batch_size: int, config: Any = None) -> dict[str, Any]:
    """`train_step.run` (beside this script) at one batch size: ResNet-50 in bfloat16 on synthetic batches,
    or `config` (its model, dtype and optimizer label the result); without the flax-example fields."""
    import jax
    import train_step

    model, image_size = ("resnet_tiny", 32) if args.smoke else ("resnet50", 224)
    dtype, optimizer = "bfloat16", "sgd"
    if config is not None:
        model, image_size = config.model.name, config.data.image_size
        dtype, optimizer = config.model.compute_dtype, config.optimizer.name
    step_args = train_step.parse_args([
        f"--model={model}", f"--dtype={dtype}", f"--batch_size={batch_size}", f"--image_size={image_size}",
        f"--optimizer={optimizer}", f"--steps={args.steps}", f"--warmup_steps={args.warmup_steps}",
        f"--repeats={args.repeats}", f"--num_devices={args.num_devices}"])
    config = train_step.make_config(step_args) if config is None else config
    if args.smoke:  # Fewer distinct synthetic batches: the source compiles each one on its own.
        config.data.synthetic_num_batches = 1
    events.counts.clear()
    events.phase = "setup"
    start = time.perf_counter()
    try:
        if batch_size == args.simulate_oom_at_batch:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory (simulated at batch {batch_size})")
        result = train_step.run(step_args, events, config=config)
    finally:
        jax.clear_caches()  # Free this batch's executables before the next one is compiled.
        gc.collect()
    for key in ("baseline", "speedup_over_baseline"):
        result.pop(key, None)
    result["wall_sec"] = time.perf_counter() - start
    return result


def stage_environment(args: argparse.Namespace, stage: StageFile) -> None:
    """Versions, devices, the peak of hardware.py's table, TensorFlow's absence, a matmul's TFLOP/s."""
    start = time.perf_counter()
    import resnet_scaling.training.training_setup  # noqa: F401 - what every step stage imports.

    stage.update(import_sec=time.perf_counter() - start,
                 tensorflow_imported_by_training_setup="tensorflow" in sys.modules,
                 ml_collections_from=getattr(sys.modules.get("ml_collections"), "__file__", None))
    import jax
    import jax.numpy as jnp
    import jaxlib

    from resnet_scaling.job import hardware

    device = jax.devices()[0]
    try:
        memory = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU devices have none.
        memory = {}
    try:
        platform_version = device.client.platform_version  # CUDA and driver versions on GPUs.
    except Exception:  # noqa: BLE001 - not on every jax version.
        platform_version = None
    spec = hardware.device_spec(device.device_kind)
    table = None if spec is None else {
        "kind_substring": spec.kind_substring, "peak_tflops_per_device": spec.peak_tflops_per_device,
        "hbm_bytes_per_chip": spec.hbm_bytes_per_chip, "source": spec.source}
    stage.update(jax=jax.__version__, jaxlib=jaxlib.__version__, backend=jax.default_backend(),
                 platform=device.platform, platform_version=platform_version,
                 device_kind=device.device_kind, num_devices=jax.device_count(),
                 devices=[str(d) for d in jax.devices()], bytes_limit=memory.get("bytes_limit"),
                 hardware_table_entry=table,
                 env={k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS",
                                                     "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                                     "XLA_PYTHON_CLIENT_PREALLOCATE")})
    # A measured ceiling beside the table's peak: a large dense bfloat16 matmul on random data, median of
    # 3 windows of 10 back-to-back products, each window synchronised once.
    n = 8192 if device.platform == "gpu" and not args.smoke else 256
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    matmul(a).block_until_ready()
    seconds = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready([matmul(a) for _ in range(10)])
        seconds.append((time.perf_counter() - t) / 10)
    stage.update(matmul_bf16_size=n, matmul_bf16_tflops=2 * n**3 / sorted(seconds)[1] / 1e12)


def stage_train_step_bf16(args: argparse.Namespace, stage: StageFile) -> None:
    """The headline: bfloat16 at `--batch_size`."""
    import train_step

    stage.update(**measure(args, train_step.EventCounter(), args.batch_size))


def stage_bf16_batch_ladder(args: argparse.Namespace, stage: StageFile) -> None:
    """Each `--ladder` batch in turn until one runs out of memory or the next would not fit the budget."""
    import train_step

    deadline = time.monotonic() + (args.budget_sec or math.inf) - KILL_GRACE_SEC
    events, rungs, stop_reason, last = train_step.EventCounter(), [], None, None
    for batch_size in args.ladder:
        if stop_reason is None and last is not None:
            # Set-up and compiling take about as long at any batch; the steps grow with it.
            steps_sec = last["sec_per_step_median"] * last["steps_run_with_compiled_executable"]
            estimate = 1.2 * (last["wall_sec"] + steps_sec * (batch_size / last["batch_size"] - 1))
            if time.monotonic() + estimate > deadline:
                stop_reason = (f"the stage's time budget would run out (batch {batch_size} needs "
                               f"~{estimate:.0f} s)")
        if stop_reason is not None:
            rungs.append({"batch_size": batch_size, "status": "not_run", "reason": stop_reason})
            continue
        try:
            figures = measure(args, events, batch_size)
            last = {"batch_size": batch_size, "status": "ok", **figures}
            rungs.append(last)
        except Exception as e:  # noqa: BLE001 - anything but out-of-memory ends the stage below.
            rungs.append({"batch_size": batch_size, "status": "out_of_memory" if is_out_of_memory(e)
                          else "error", "error": _short(e)})
            if not is_out_of_memory(e):
                stage.update(rungs=rungs)
                raise
            stop_reason = f"batch {batch_size} ran out of memory"
        fits = [r["batch_size"] for r in rungs if r["status"] == "ok"]
        stage.update(rungs=rungs, largest_batch_that_fits=max(fits) if fits else None)
    stage.update(rungs=rungs, stopped_because=stop_reason)


def stage_train_step_fp16_v100(args: argparse.Namespace, stage: StageFile) -> None:
    """configs/gpu_v100.py (float16 + dynamic loss scaling) at its batch, on synthetic batches."""
    import train_step

    from resnet_scaling import config as config_lib
    from resnet_scaling.training import optim

    path = config_lib.find_config_file("gpu_v100")
    spec = importlib.util.spec_from_file_location("gpu_v100_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    aot = _shipped_report("gpu_v100", config)
    config.data.source = "synthetic"
    config.mesh.num_devices = args.num_devices
    if args.smoke:
        config.model.name, config.data.image_size = "resnet_tiny", 32
        config.training.global_batch_size = config.eval.global_batch_size = args.batch_size
    initial_scale = float(optim.create_dynamic_scale(config.model.compute_dtype).scale)
    stage.update(config_file=path, compute_dtype=config.model.compute_dtype, initial_loss_scale=initial_scale)
    figures = measure(args, train_step.EventCounter(), config.training.global_batch_size, config)
    last = figures["last_step_metrics"]
    scale, loss = last.get("loss_scale"), last.get("loss")
    sane = (scale is not None and math.isfinite(scale) and 1.0 <= scale <= initial_scale
            and loss is not None and math.isfinite(loss))
    # The scale halves at every overflowing step and grows only after 2,000 clean ones.
    halvings = round(math.log2(initial_scale / scale)) if scale and math.isfinite(scale) else None
    stage.update(**figures, loss_scale=scale, loss_scale_halvings=halvings, loss_scale_sane=sane)
    if aot is not None and not args.smoke:  # The same program compiled here without a GPU, and shipped.
        stage.update(aot_report=_against_aot(aot, figures))


def _shipped_report(name: str, config: Any) -> dict[str, Any] | None:
    """The shipped compile report of config `name` (compiled without a GPU), while `config` is as compiled."""
    from resnet_scaling import config as config_lib
    from resnet_scaling.planning import shipped_reports

    return shipped_reports.load_shipped_report(name, config_lib.config_hash(config))


def _against_aot(report: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The real step's memory and time beside the ahead-of-time report's: XLA's buffers (the same count
    on both sides; the real compile autotunes), the device's peak (cuDNN workspaces and the rest included),
    and the step time against the report's FLOPs at the card's peak."""
    memory = figures.get("memory") or {}
    aot_total = report["memory_bytes"]["total"]
    step_sec = figures.get("sec_per_step_median")
    floor = report.get("flop_floor_sec")
    return {
        "aot_total_bytes": aot_total,
        "real_total_bytes": memory.get("total_bytes"),
        "real_over_aot": memory["total_bytes"] / aot_total if memory.get("total_bytes") else None,
        "peak_bytes_in_use": memory.get("peak_bytes_in_use"),
        "peak_over_aot": memory["peak_bytes_in_use"] / aot_total if memory.get("peak_bytes_in_use") else None,
        "aot_compile_sec": report["compile_sec"],
        "aot_flops_per_image": report["flops_per_step"] / report["global_batch_size"],
        "aot_flop_floor_sec": floor,
        "step_sec": step_sec,
        "step_over_flop_floor": step_sec / floor if step_sec and floor else None,
    }


CHILD_STAGES = {"environment": stage_environment, "train_step_bf16": stage_train_step_bf16,
                "train_step_fp16_v100": stage_train_step_fp16_v100,
                "bf16_batch_ladder": stage_bf16_batch_ladder}


def run_child_stage(args: argparse.Namespace) -> int:
    """Runs one JAX stage in this process, writing its JSON as it goes; 1 if it raised."""
    sys.path.insert(0, str(HERE))  # train_step.py lives beside this script.
    stage = StageFile(args.stage_json)
    stage.write()
    try:
        if args.fail_stage == args.run_stage:
            raise RuntimeError(f"injected failure (--fail_stage={args.fail_stage})")
        CHILD_STAGES[args.run_stage](args, stage)
    except Exception as e:  # noqa: BLE001 - recorded for the parent, which goes on with the next stage.
        traceback.print_exc()
        stage.record.update(status="error", error=_short(e))
        stage.write()
        return 1
    stage.record["status"] = "ok"
    stage.write()
    return 0


# ----------------------------------------------------------------------------- the parent


def write_json(path: Path, data: Any) -> None:
    """Writes JSON atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_command(command: list[str], env: dict[str, str], timeout_sec: float, log: Path) -> tuple[int, bool]:
    """Runs `command` in its own process group with its output in `log`; (exit code, timed out).

    On timeout the whole group (a trainer's workers too) gets SIGTERM, then SIGKILL after a grace period.
    """
    with open(log, "w") as f:
        proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_sec), False
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, KILL_GRACE_SEC), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return proc.wait(), True


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def stage_command(name: str, args: argparse.Namespace, scratch: Path, budget_sec: float
                  ) -> tuple[list[str], Path]:
    """The command of a stage and the file it leaves its results in."""
    if name in JAX_STAGES:
        out = scratch / "stages" / f"{name}.json"
        forwarded = [f"--{k}={getattr(args, k)}" for k in (
            "batch_size", "steps", "repeats", "warmup_steps", "num_devices", "simulate_oom_at_batch",
            "fail_stage") if getattr(args, k) is not None]
        return [sys.executable, str(Path(__file__).resolve()), f"--run_stage={name}", f"--stage_json={out}",
                f"--budget_sec={budget_sec}", f"--ladder={','.join(map(str, args.ladder))}", *forwarded,
                *(["--smoke"] if args.smoke else [])], out
    if name == "demo":
        workdir = scratch / "demo"
        overrides = ["--config.data.num_train_examples=256", "--config.data.num_eval_examples=100",
                     "--config.training.num_epochs=1", "--config.training.global_batch_size=32",
                     "--config.eval.global_batch_size=50", "--config.eval.every_epochs=1"]
        return [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
                f"--config.data.cache_dir={scratch / 'demo_data'}", *(overrides if args.smoke else [])
                ], workdir / "summary.json"
    out = scratch / "input_pipeline.json"
    sizes = ["--images=64", "--batch_size=16", "--num_jpegs=8"] if args.smoke else []
    return [sys.executable, str(HERE / "input_pipeline.py"), f"--threads={usable_cores()}",
            "--repeats=1" if args.smoke else "--repeats=3", "--variants=library", *sizes,
            f"--json_out={out}"], out


def parse_stage_output(name: str, path: Path) -> dict[str, Any]:
    """The stage's figures from the file it wrote (a JAX stage's file holds its own status and error)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if name in JAX_STAGES:
        return data
    if name == "demo":
        t, a, r = data["throughput"], data["accuracy"], data["run"]
        return {"result": {"final_eval_top1": a["final_eval_top1"], "best_eval_top1": a["best_eval_top1"],
                           "images_per_sec": t["images_per_sec"], "compile_sec": data["time"]["compile_sec"],
                           "train_loop_wall_sec": data["time"]["wall_sec"], "final_step": r["final_step"],
                           "device_kind": r["device_kind"], "input_wait_fraction": t["input_wait_fraction"]}}
    return {"result": {"threads": data.get("threads"),
                       "library_images_per_sec": data.get("images_per_sec", {}).get("library"),
                       "images_per_sec": data.get("images_per_sec"), "environment": data.get("environment")}}


class Check:
    """The parent: runs each stage in a process of its own, records it, writes the report after each."""

    def __init__(self, args: argparse.Namespace, argv: list[str], out_dir: Path, scratch: Path) -> None:
        self.args, self.out_dir, self.scratch = args, out_dir, scratch
        self.start = time.monotonic()
        self.json_path, self.log_path = out_dir / "gpu_check.json", out_dir / "gpu_check.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        host = host_info()
        xla = self.apply_xla_flags(gpu_listed=bool(host["nvidia_smi"].get("gpus")))
        self.report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "check": "gpu_check", "smoke": args.smoke,
            "command": shlex.join([sys.executable, str(Path(__file__).resolve()), *argv]),
            "out_dir": str(out_dir),
            "scratch_dir": str(scratch),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "finished": None,
            "total_budget_sec": args.total_budget_sec, "host": host, "xla_flags": xla, "summary": {},
            "stages": {}}
        self.log_path.write_text("")

    def apply_xla_flags(self, gpu_listed: bool) -> dict[str, Any]:
        """xla_flags.py's throughput flags for the detected backend, added to the stages' environment.

        A GPU that nvidia-smi lists counts even where its device files are not where detect_backend looks
        (a container runtime's own layout): the stages must not be pinned to the CPU on a GPU machine.
        """
        record: dict[str, Any] = {"xla_flags_before": self.env.get("XLA_FLAGS")}
        try:
            from resnet_scaling.job import xla_flags

            backend = xla_flags.detect_backend(self.env)
            if backend == "cpu" and gpu_listed and not self.env.get("JAX_PLATFORMS"):
                backend = "gpu"
            record["backend_detected"] = backend
            if backend == "cpu" and not self.env.get("JAX_PLATFORMS"):  # As train.py: no TPU probing.
                self.env["JAX_PLATFORMS"] = "cpu"
            record["added_by_apply_throughput_flags"] = xla_flags.apply_throughput_flags(backend, self.env)
        except Exception as e:  # noqa: BLE001 - the stages then run without them; the import error says why.
            record["error"] = _short(e)
        record.update(xla_flags=self.env.get("XLA_FLAGS"), libtpu_init_args=self.env.get("LIBTPU_INIT_ARGS"),
                      jax_platforms=self.env.get("JAX_PLATFORMS"))
        return record

    def drop_flags(self) -> bool:
        """Takes back the flags xla_flags.py added (this XLA lacks one of them); False if none were added."""
        record = self.report["xla_flags"]
        if not record.get("added_by_apply_throughput_flags", {}).get("XLA_FLAGS"):
            return False
        if record["xla_flags_before"] is None:
            self.env.pop("XLA_FLAGS", None)
        else:
            self.env["XLA_FLAGS"] = record["xla_flags_before"]
        record.update(xla_flags=self.env.get("XLA_FLAGS"),
                      dropped=f"XLA aborted with '{UNKNOWN_XLA_FLAG}': the added flags were taken back")
        return True

    def remaining_sec(self) -> float:
        return self.args.total_budget_sec - (time.monotonic() - self.start)

    def skip_reason(self, name: str) -> str | None:
        if name not in self.args.stages.split(","):
            return "not selected (--stages)"
        if name in NEEDS_TENSORFLOW and (self.args.pretend_no_tensorflow or
                                         importlib.util.find_spec("tensorflow") is None):
            return NEEDS_TENSORFLOW[name]
        headline = self.report["stages"].get("train_step_bf16", {})
        if name == "bf16_batch_ladder" and is_out_of_memory(headline.get("error", "")):
            return f"batch {self.args.batch_size} already ran out of memory"
        budget = min(BUDGET_SEC.get(name, math.inf), self.remaining_sec())
        if budget < (1 if self.args.smoke else MIN_STAGE_SEC):
            return f"not enough of the {self.args.total_budget_sec:.0f} s budget left ({budget:.0f} s)"
        return None

    def run_stage(self, name: str) -> dict[str, Any]:
        """One stage's record: status ok / error / timeout / skipped, with figures, an error or a reason."""
        if reason := self.skip_reason(name):
            return {"status": "skipped", "reason": reason}
        budget = min(BUDGET_SEC.get(name, math.inf), self.remaining_sec())
        record: dict[str, Any] = {"status": "running", "budget_sec": round(budget, 1)}
        self.report["stages"][name] = record
        self.write()
        log = self.scratch / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        try:
            if self.args.fail_stage == name and name not in JAX_STAGES:
                raise RuntimeError(f"injected failure (--fail_stage={name})")
            command, output = stage_command(name, self.args, self.scratch, budget)
            output.unlink(missing_ok=True)  # Nothing from an earlier run in the same scratch folder counts,
            if name == "demo":  # and the demo must not resume one.
                shutil.rmtree(output.parent, ignore_errors=True)
            record["command"] = shlex.join(command)
            returncode, timed_out = run_command(command, self.env, budget, log)
            record.update(parse_stage_output(name, output))
            if timed_out:
                record.update(status="timeout", error=f"stopped at its time budget ({budget:.0f} s)")
            elif returncode != 0:
                record["status"] = "error"
                record.setdefault("error", f"exited with status {returncode} (log_tail has its output)")
            elif record["status"] == "running":
                record["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded; the next stage runs.
            record.update(status="error", error=_short(e))
        record["wall_sec"] = round(time.monotonic() - start, 2)
        if record["status"] != "ok":
            record["log_tail"] = _tail(log)
        with open(self.log_path, "a") as f:
            f.write(f"===== {name}: {record['status']} ({record['wall_sec']} s) =====\n{_tail(log, 10**6)}\n")
        return record

    def run(self) -> dict[str, Any]:
        for name in STAGES:
            self.report["stages"][name] = record = self.run_stage(name)
            if name == "environment" and UNKNOWN_XLA_FLAG in record.get("log_tail", "") and self.drop_flags():
                self.report["stages"][name] = record = self.run_stage(name)
            reason = record.get("reason") or record.get("error") or ""
            print(f"[gpu_check] {name}: {record['status']} {reason} ({self.remaining_sec():.0f} s left)",
                  flush=True)
            self.report["summary"] = summarize(self.report["stages"], self.args.batch_size, self.args.smoke)
            self.write()
        self.report["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.report["wall_sec"] = round(time.monotonic() - self.start, 1)
        self.write()
        return self.report

    def write(self) -> None:
        write_json(self.json_path, self.report)


def usable_cores() -> int:
    """The host cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def host_info() -> dict[str, Any]:
    """Python, cores, package versions (without importing them) and nvidia-smi's driver and CUDA."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "usable_cores": usable_cores(), "packages": versions, "nvidia_smi": nvidia_smi()}


def nvidia_smi() -> dict[str, Any]:
    """The GPU's name, driver, memory and the driver's CUDA version, or why they are unknown."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"available": False, "reason": "nvidia-smi not found"}
    try:
        query = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        plain = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return {"available": False, "reason": _short(e)}
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", plain.stdout)
    return {"available": True, "gpus": [line.strip() for line in query.stdout.splitlines() if line.strip()],
            "fields": "name, driver_version, memory.total, clocks.max.sm",
            "cuda_version": cuda.group(1) if cuda else None}


def summarize(stages: dict[str, Any], batch_size: int, smoke: bool = False) -> dict[str, Any]:
    """The headline figures of the stages so far (None where a stage gave none), and warnings."""

    def get(stage: str, *keys: str) -> Any:
        value: Any = stages.get(stage, {}).get("result", {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    headline = get("train_step_bf16")
    rungs = [{"batch_size": batch_size, **headline}] if headline and "compile_sec" in headline else []
    rungs += [r for r in get("bf16_batch_ladder", "rungs") or [] if r.get("status") == "ok"]
    largest = max(rungs, key=lambda r: r["batch_size"], default=None)
    platform_ = get("environment", "platform") or get("train_step_bf16", "environment", "platform")
    device_kind = get("environment", "device_kind") or get("train_step_bf16", "environment", "device_kind")
    warnings = []
    if platform_ and platform_ != "gpu" and not smoke:
        warnings.append(f"the stages ran on {platform_!r}, not on a GPU")
    return {
        "warnings": warnings,
        "stage_status": {name: stage["status"] for name, stage in stages.items()},
        "platform": platform_,
        "device_kind": device_kind,
        "matmul_bf16_tflops": get("environment", "matmul_bf16_tflops"),
        "bf16_batch_size": batch_size,
        "bf16_images_per_sec": get("train_step_bf16", "images_per_sec_median"),
        "bf16_compile_sec": get("train_step_bf16", "compile_sec"),
        "bf16_tflops_per_sec_per_device": get("train_step_bf16", "utilisation", "tflops_per_sec_per_device"),
        "bf16_mfu": get("train_step_bf16", "utilisation", "mfu"),
        "bf16_peak_bytes_in_use": get("train_step_bf16", "memory", "peak_bytes_in_use"),
        "largest_batch_that_fits": largest["batch_size"] if largest else None,
        "largest_batch_images_per_sec": largest["images_per_sec_median"] if largest else None,
        "ladder_stopped_because": get("bf16_batch_ladder", "stopped_because"),
        # No batch ran out of memory: the largest that fits is at least this (the limit was not reached).
        "largest_batch_is_a_lower_bound": largest is not None and not any(
            r.get("status") == "out_of_memory" for r in get("bf16_batch_ladder", "rungs") or []),
        "fp16_v100_images_per_sec": get("train_step_fp16_v100", "images_per_sec_median"),
        "fp16_v100_loss_scale": get("train_step_fp16_v100", "loss_scale"),
        "fp16_v100_loss_scale_sane": get("train_step_fp16_v100", "loss_scale_sane"),
        # The real V100 step's memory over the shipped ahead-of-time report's (compiled without a GPU).
        "fp16_v100_memory_over_aot": get("train_step_fp16_v100", "aot_report", "real_over_aot"),
        "fp16_v100_peak_over_aot": get("train_step_fp16_v100", "aot_report", "peak_over_aot"),
        "demo_final_top1": get("demo", "final_eval_top1"),
        "demo_wall_sec": stages.get("demo", {}).get("wall_sec") if get("demo", "final_step") else None,
        "input_pipeline_images_per_sec": get("input_pipeline", "library_images_per_sec"),
        "input_pipeline_threads": get("input_pipeline", "threads"),
    }


def main(argv: list[str]) -> int:
    """Runs the check (or, with --run_stage, one JAX stage); returns the exit status."""
    args = parse_args(argv)
    if args.run_stage:
        return run_child_stage(args)
    out = os.environ.get("OUT") or args.out
    if not out:
        raise SystemExit("error: set $OUT or pass --out=DIR for gpu_check.json.")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch_dir or tempfile.mkdtemp(prefix="gpu_check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        report = Check(args, argv, out_dir, scratch).run()
    finally:
        if args.scratch_dir is None:  # Ours: the stage logs are in gpu_check.log already.
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report["summary"], indent=2))
    print(f"[gpu_check] wrote {out_dir / 'gpu_check.json'} and gpu_check.log in {report['wall_sec']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
