"""Ahead-of-time compilation of the real training step for TPUs or GPUs this machine does not have.

The library behind `python -m resnet_scaling.compile --config=configs/pod.py` (or `--config=gpu_v100x8`).
libtpu (the `tpu` extra) compiles for any TPU topology on a CPU-only machine, JAX's CUDA plugin (the
`gpu_compile` extra) for the GPUs of `gpu_targets.py`, over abstract state and batch (nothing allocated).
The report gives per-device memory against HBM, the FLOPs, libtpu's step-time estimate beside the FLOPs'
time at peak, and the collectives (multislice: in-slice/ICI and cross-slice/DCN apart), so a config's fit,
speed and communication are known before a pod or a GPU node is rented. The functions here take what
`training_setup.setup` built (`TrainingSetup`) and a `Target`; the commands read the config.
"""

from __future__ import annotations

from resnet_scaling.job import native_noise

native_noise.import_jax_quietly()  # Before the imports below load JAX (job/native_noise.py).

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from resnet_scaling import data as data_lib
from resnet_scaling.job import hardware
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.job.errors import MissingExtraError, RunError
from resnet_scaling.metrics import compiled as compiled_lib
from resnet_scaling.planning import gpu_targets, hlo
from resnet_scaling.training import training_setup

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class CompileReport:
    """What the compiler says about one training step of a config on a topology.

    Memory, FLOPs and collectives are per device: every device runs one SPMD program.
    """

    system: str
    topology: str
    device_kind: str
    num_devices: int
    num_chips: int
    num_hosts: int
    num_slices: int
    model: str
    compute_dtype: str
    global_batch_size: int
    per_device_batch_size: int
    num_train_examples: int
    bn_group_size: int | None
    num_params: int
    num_batch_stats: int
    compile_sec: float
    memory_bytes: dict[str, int]
    hbm_bytes_per_device: int | None
    flops_per_device: float
    flops_per_step: float
    # HBM bytes a device's step reads and writes (XLA's "bytes accessed" after fusion): with the FLOPs, the
    # step's roofline where libtpu gives no estimate (planning/step_model.py).
    bytes_accessed_per_device: float | None
    # libtpu's step estimate (`optimal_seconds`) and the FLOPs' time at peak: their ratio, how far from peak.
    estimated_step_sec: float | None
    flop_floor_sec: float | None
    # The evaluation step: its batch, steps per pass, libtpu's estimate of a step (None: not compiled).
    eval_global_batch_size: int
    eval_steps_per_pass: int
    estimated_eval_step_sec: float | None
    eval_flops_per_device: float | None
    eval_bytes_accessed_per_device: float | None
    # The recipe the config runs, by the images its steps see: its epochs, how often it evaluates (0: at the
    # end only), and whether in MLPerf mode (then the planner's epochs are MLPerf's reference convergence
    # points instead of `num_epochs`).
    num_epochs: float
    eval_every_epochs: float
    mlperf_mode: bool
    collectives: dict[str, dict[str, int]]
    collectives_by_slice: dict[str, dict[str, int]]
    collectives_by_group: list[dict[str, Any]]
    largest_collectives: list[dict[str, Any]]
    # The config compiled (`config.config_hash`): a shipped report is used only while its config is unchanged.
    config_hash: str = ""
    # "tpu" or "gpu" ("" in reports written before GPUs compiled: TPU); where the FLOPs come from: XLA's
    # cost analysis of the compiled program, or (GPU programs report none) `hlo.matmul_flops` of the
    # lowered module.
    platform: str = ""
    flops_source: str = ""


class TopologyError(RunError, RuntimeError):
    """libtpu cannot describe a topology: a name it does not know, or bounds that do not divide it."""


def _libtpu_installed() -> bool:
    """Whether JAX can load libtpu, looking where JAX looks: $TPU_LIBRARY_PATH, else the `libtpu` package
    (the `tpu` extra's jax[tpu])."""
    if os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", "")):
        return True
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


# Generations whose chips JAX runs as one device (megacore: both TensorCores on one program) where libtpu's
# ahead-of-time topology describes each TensorCore unless asked for the megacore chip config. v5p already
# describes one device per chip; v2 and v3 run each core as a device on the hardware too.
MEGACORE_GENERATIONS = ("v4:",)


def topology_devices(topology: str, chips_per_host_bounds: Sequence[int] = (2, 2, 1),
                     num_slices: int = 1) -> list[jax.Device]:
    """The devices of a TPU topology such as "v2:16x16" (the full v2 Pod: 512 devices), from libtpu.

    Raises:
      MissingExtraError: libtpu is not installed (the `tpu` extra).
      TopologyError: libtpu cannot describe the topology (also a RuntimeError).
    """
    if not _libtpu_installed():
        raise MissingExtraError(
            "ahead-of-time compilation for a TPU topology needs libtpu, which is not installed: pip install "
            "'resnet_scaling[tpu]' (from a checkout: pip install -e '.[tpu]'); no TPU is needed.")
    from jax.experimental import topologies

    options = {"chip_config_name": "megacore"} if topology.startswith(MEGACORE_GENERATIONS) else {}
    try:
        description = topologies.get_topology_desc(
            platform="tpu", topology_name=topology, chips_per_host_bounds=tuple(chips_per_host_bounds),
            num_slices=num_slices, **options)
    except Exception as e:  # noqa: BLE001 - jax raises several types (JaxRuntimeError, RuntimeError).
        cause = str(e).splitlines()[0].rstrip(".") if str(e) else type(e).__name__
        lock = ("" if os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD") else
                " If another process holds libtpu's lock, set ALLOW_MULTIPLE_LIBTPU_LOAD=1.")
        raise TopologyError(
            f"TPU topology {topology!r} ({tuple(chips_per_host_bounds)} chips per host, {num_slices} "
            f"slice(s)): libtpu cannot describe it: {cause}. Topologies look like v2:16x16 or v4:2x2x4."
            + lock) from e
    return list(description.devices)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a step is compiled for: the devices, described without having them.

    Attributes:
      devices: a TPU topology's (libtpu) or GPUs' (the CUDA plugin).
      topology: how the report names them ("v2:16x16"; "1x1x8": slices x hosts x GPUs per host).
      system: the config's system name (`config.system.name`), for the report.
      device_kind: the chip or card the config names (`config.system.device_kind`), whose memory the report
        compares with; "" for the devices' own kind.
    """

    devices: list[jax.Device]
    topology: str
    system: str = ""
    device_kind: str = ""

    @property
    def platform(self) -> str:
        return "gpu" if self.devices[0].platform in ("gpu", "cuda") else self.devices[0].platform


def target_for(system: Mapping[str, Any], num_devices: int, topology: str = "") -> Target:
    """The devices a config's `system` section names: its TPU topology (or `topology`), else `num_devices`
    GPUs of its `device_kind`.

    Raises:
      MissingExtraError: libtpu (the `tpu` extra) or the CUDA plugin (`gpu_compile`) is not installed.
      TopologyError, UnknownGpuError: a topology libtpu cannot describe; a card with no description.
      RunError: the section names neither.
    """
    topology = topology or system["topology"]
    if topology:
        devices = topology_devices(topology, system["chips_per_host_bounds"], system["num_slices"])
        return Target(devices, topology, system["name"], system["device_kind"])
    if not system["device_kind"]:
        raise RunError("nothing to compile for: set config.system.topology (a TPU topology, or pass "
                       "--topology=v2:16x16) or config.system.device_kind (a GPU).")
    devices = gpu_targets.gpu_devices(system["device_kind"], num_devices)
    return Target(devices, gpu_targets.topology_name(num_devices), system["name"], system["device_kind"])


def _lowered_flops(jitted: Callable[..., Any], *args: Any) -> float:
    """FLOPs of a jitted function's whole (unpartitioned) module as lowered for `args`."""
    return hlo.matmul_flops(jitted.lower(*args).as_text(dialect="hlo"))


def _describe(c: hlo.Collective, slice_of_device: list[int]) -> dict[str, Any]:
    shapes = [f"{dtype}[{','.join(map(str, dims))}]" for dtype, dims in c.operand_shapes]
    return {"kind": c.kind, "name": c.name, "num_elements": c.num_elements, "num_bytes": c.num_bytes,
            "group_size": c.group_size, "operand_shapes": shapes,
            "crosses_slices": c.crosses_slices(slice_of_device)}


def program_device_slices(hlo_text: str, mesh: jax.sharding.Mesh) -> list[int]:
    """The slice of each device id the compiled program's collectives name.

    A program over the whole mesh numbers devices as `mesh.devices.flat`; libtpu's multislice programs (one
    per slice) number a slice's own, so every replica group is in-slice and DCN transfers cross slices.
    """
    slices = mesh_lib.device_slices(mesh)
    program_devices = hlo.program_num_devices(hlo_text) or len(slices)
    return [0] * program_devices if program_devices < len(slices) else slices


def build_report(run: training_setup.TrainingSetup, target: Target, *, config_hash: str = "",
                 mlperf_mode: bool = False, eval_step: bool = True) -> CompileReport:
    """Compiles `run`'s train step (an abstract setup for `target.devices`): memory, FLOPs, collectives;
    with `eval_step`, also the evaluation step, for libtpu's estimate of its time (the planner's
    evaluation cost) and its FLOPs.

    Args:
      run: `training_setup.setup(config, devices=target.devices, abstract=True)`.
      config_hash: `config.config_hash(config)`, recorded for the shipped reports.
      mlperf_mode: the config's `mlperf.enabled` (the planner's epochs are then MLPerf's).
    """
    compiled, compile_sec = run.compile_train_step()
    compiled_eval = run.compile_eval_step()[0] if eval_step else None
    plan = run.plan
    devices = target.devices
    num_batch_stats = sum(math.prod(x.shape) for x in jax.tree.leaves(run.state.batch_stats))
    hlo_text = compiled.as_text()
    slice_of_device = program_device_slices(hlo_text, run.mesh)
    collectives = hlo.find_collectives(hlo_text, num_devices=len(slice_of_device))
    largest = sorted(collectives, key=lambda c: c.num_elements, reverse=True)[:8]
    num_slices = mesh_lib.num_mesh_slices(run.mesh)
    flops_per_device = compiled_lib.flops_per_device(compiled)
    eval_flops = compiled_eval and compiled_lib.flops_per_device(compiled_eval)
    flops_source = "XLA's cost analysis"
    if flops_per_device is None:  # XLA's GPU compiler reports no cost: count the lowered module.
        flops_source = "convolutions and dots of the lowered module"
        flops_per_device = _lowered_flops(run.train_step, run.state, run.shaped_batch) / plan.num_devices
        if compiled_eval is not None:
            eval_batch = data_lib.shaped_eval_batch(plan.batch, run.sections.data.image_size, run.mesh)
            eval_flops = _lowered_flops(run.eval_step, run.state, eval_batch) / plan.num_devices
    peak_tflops = hardware.peak_tflops_per_device(devices[0].device_kind)
    return CompileReport(
        system=target.system,
        topology=target.topology,
        device_kind=devices[0].device_kind,
        num_devices=plan.num_devices,
        num_chips=hardware.chip_count(devices),
        num_hosts=len({d.process_index for d in devices}),
        num_slices=num_slices,
        model=run.sections.model.name,
        compute_dtype=run.sections.model.compute_dtype,
        global_batch_size=plan.global_batch_size,
        per_device_batch_size=plan.per_device_batch_size,
        num_train_examples=plan.num_train_examples,
        bn_group_size=plan.bn_group_size,
        num_params=run.num_params,
        num_batch_stats=num_batch_stats,
        compile_sec=compile_sec,
        memory_bytes=compiled_lib.memory_per_device(compiled),
        hbm_bytes_per_device=hardware.hbm_bytes_per_device(devices, target.device_kind),
        flops_per_device=flops_per_device,
        flops_per_step=flops_per_device * plan.num_devices,
        bytes_accessed_per_device=compiled_lib.bytes_accessed_per_device(compiled),
        estimated_step_sec=compiled_lib.estimated_seconds(compiled),
        flop_floor_sec=flops_per_device / (peak_tflops * 1e12) if peak_tflops and flops_per_device else None,
        eval_global_batch_size=plan.batch.eval_global_batch_size,
        eval_steps_per_pass=plan.eval_steps,
        estimated_eval_step_sec=compiled_eval and compiled_lib.estimated_seconds(compiled_eval),
        eval_flops_per_device=eval_flops,
        eval_bytes_accessed_per_device=compiled_eval and compiled_lib.bytes_accessed_per_device(
            compiled_eval),
        num_epochs=plan.epoch_length.epochs(plan.total_steps),
        eval_every_epochs=plan.epoch_length.epochs(plan.eval_every_steps),
        mlperf_mode=mlperf_mode,
        collectives=hlo.summarize(collectives),
        collectives_by_slice=hlo.summarize_by_slice(collectives, slice_of_device),
        collectives_by_group=hlo.summarize_by_group(collectives, slice_of_device if num_slices > 1 else None),
        largest_collectives=[_describe(c, slice_of_device) for c in largest],
        config_hash=config_hash,
        platform=target.platform,
        flops_source=flops_source,
    )


def _flops(value: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} FLOP"


def _step_time(report: CompileReport) -> str:
    estimate = ("none" if report.estimated_step_sec is None else
                f"{report.estimated_step_sec * 1e3:,.2f} ms "
                f"({report.global_batch_size / report.estimated_step_sec:,.0f})")
    floor = "unknown peak" if report.flop_floor_sec is None else f"{report.flop_floor_sec * 1e3:,.2f} ms"
    return f"{estimate}, {floor}"


def _eval_time(report: CompileReport) -> str:
    sec = report.estimated_eval_step_sec
    if sec is None:
        return "none"
    return f"{sec * 1e3:,.2f} ms ({report.eval_global_batch_size / sec:,.0f} images/sec)"


def format_report(report: CompileReport) -> str:
    """The report as Markdown tables (what the command prints and benchmarks/README.md quotes)."""
    mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
    memory = report.memory_bytes
    hbm = report.hbm_bytes_per_device
    fits = "unknown HBM" if hbm is None else (
        f"{memory['total'] / hbm:.0%} of {hbm / hardware.GIB:.0f} GiB HBM"
        + ("" if memory["total"] <= hbm else " - DOES NOT FIT"))
    per_image = report.flops_per_step / report.global_batch_size
    accessed = report.bytes_accessed_per_device
    accessed = "unknown" if accessed is None else mib(accessed)
    multislice = report.num_slices > 1
    slices = f" x {report.num_slices} slices" if multislice else ""
    lines = [
        f"| {report.system or report.model} | |",
        "|---|---|",
        f"| topology | {report.topology or '-'}{slices} ({report.num_devices} x {report.device_kind}) |",
        f"| model, compute dtype | {report.model}, {report.compute_dtype} |",
        f"| parameters, BN statistics | {report.num_params:,}, {report.num_batch_stats:,} |",
        f"| global batch (per device) | {report.global_batch_size:,} ({report.per_device_batch_size}) |",
        f"| BN group | {report.bn_group_size or 'global batch'} images |",
        f"| compile time | {report.compile_sec:.1f} s |",
        f"| memory per device: arguments | {mib(memory['argument'])} |",
        f"| memory per device: outputs (aliased to donated arguments) | {mib(memory['output'])} "
        f"({mib(memory['alias'])}) |",
        f"| memory per device: temporaries | {mib(memory['temp'])} |",
        f"| memory per device: total (+ code, - aliased outputs) | {mib(memory['total'])}, {fits} |",
        f"| FLOPs per device per step | {_flops(report.flops_per_device)} |",
        f"| HBM bytes per device per step (XLA's \"bytes accessed\") | {accessed} |",
        f"| FLOPs per step (all devices), per image | {_flops(report.flops_per_step)}, {_flops(per_image)}"
        f"{f' ({report.flops_source})' if report.platform == 'gpu' else ''} |",
        f"| step time: libtpu's estimate (images/sec), FLOPs at peak | {_step_time(report)} |",
        f"| evaluation step: global batch, steps per pass, libtpu's estimate | "
        f"{report.eval_global_batch_size:,}, {report.eval_steps_per_pass}, {_eval_time(report)} |",
    ]
    if report.platform == "gpu" and hbm is not None:
        lines.insert(lines.index(next(line for line in lines if line.startswith("| FLOPs per device"))),
                     f"| card's memory left for what is chosen only on the card (cuDNN workspaces and "
                     f"algorithms, autotuned kernels, the CUDA context) | "
                     f"{(hbm - memory['total']) / hardware.GIB:,.2f} GiB |")
    if multislice:
        for where, network in ((hlo.IN_SLICE, "ICI"), (hlo.CROSS_SLICE, "DCN")):
            entry = report.collectives_by_slice[where]
            lines.append(f"| {where} collectives ({network}): ops, MiB per device | {entry['count']}, "
                         f"{entry['num_bytes'] / 2**20:,.2f} MiB |")
    slices_column = ("| slices ", "|---") if multislice else ("", "")
    lines += [
        "",
        f"| collective {slices_column[0]}| devices per group | element type | ops | elements per device | "
        "MiB per device |",
        f"|---{slices_column[1]}|---|---|---|---|---|",
    ]
    for row in report.collectives_by_group:
        where = f"| {row['slices']} " if multislice else ""
        lines.append(f"| {row['kind']} {where}| {row['group_size']} | {row['dtype']} | {row['count']} | "
                     f"{row['num_elements']:,} | {row['num_bytes'] / 2**20:,.2f} |")
    for kind, entry in sorted(report.collectives.items()):
        lines.append(f"| **{kind}, all** {'| ' if multislice else ''}| | | {entry['count']} | "
                     f"**{entry['num_elements']:,}** | {entry['num_bytes'] / 2**20:,.2f} |")
    if not report.collectives:
        lines.append(f"| (none) {'| ' if multislice else ''}| | | 0 | 0 | 0 |")
    return "\n".join(lines)
