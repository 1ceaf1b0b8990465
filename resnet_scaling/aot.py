"""Ahead-of-time compilation of the real training step for a TPU topology this machine does not have.

The library behind `python -m resnet_scaling.compile --config=configs/pod.py` (see compile.py).
libtpu (the `tpu` extra) compiles for any TPU topology on a CPU-only machine:
`jax.experimental.topologies.get_topology_desc` describes its devices, the trainer's mesh and shardings are
built over them, and the jitted `train_step` is lowered with abstract arguments (no array is allocated)
and compiled. The report gives per-device memory against the chip's HBM, FLOPs from XLA's cost analysis
and the collectives of the compiled step, so a config's fit and communication are known before a pod is
rented.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from resnet_scaling import config as config_lib
from resnet_scaling import hlo, models, optim, steps
from resnet_scaling import mesh as mesh_lib

GIB = 2**30
# HBM per chip, keyed by `jax.Device.device_kind`. A TPU v2/v3 chip has 2 TensorCores that JAX sees as 2
# devices, each with half the chip's HBM; v4 and v5p chips can fuse theirs ("megacore", 1 device per
# chip); v5e and v6e chips have 1 TensorCore. `hbm_bytes_per_device` divides by the devices found per
# chip. Sources: the Cloud TPU system-architecture pages and NVIDIA's data sheets.
HBM_BYTES_PER_CHIP: dict[str, int] = {
    "TPU v2": 16 * GIB,  # 8 GiB per core
    "TPU v3": 32 * GIB,  # 16 GiB per core
    "TPU v4": 32 * GIB,
    "TPU v5 lite": 16 * GIB,  # v5e
    "TPU v5": 95 * GIB,  # v5p
    "TPU v6 lite": 32 * GIB,  # v6e (Trillium)
    "Tesla V100-SXM2-16GB": 16 * GIB,
    "Tesla V100-SXM2-32GB": 32 * GIB,
    "NVIDIA A100-SXM4-80GB": 80 * GIB,
    "NVIDIA H100 80GB HBM3": 80 * GIB,
    "NVIDIA H200": 141 * 10**9,
}


def hbm_bytes_per_device(devices: Sequence[jax.Device], device_kind: str = "") -> int | None:
    """HBM one device of `devices` can use, or None for a device kind not in HBM_BYTES_PER_CHIP.

    Args:
      devices: the devices of the mesh (TPU devices sharing `coords` are cores of one chip).
      device_kind: overrides the devices' own kind (config.system.device_kind), when set.
    """
    kind = device_kind or devices[0].device_kind
    if kind not in HBM_BYTES_PER_CHIP:
        return None
    chips = {(getattr(d, "slice_index", 0), tuple(getattr(d, "coords", (d.id,)))) for d in devices}
    return HBM_BYTES_PER_CHIP[kind] * len(chips) // len(devices)


@dataclasses.dataclass
class CompileReport:
    """What the compiler says about one training step of a config on a topology.

    Memory, FLOPs and collectives are per device: XLA compiles one SPMD program that every device runs.
    """

    system: str
    topology: str
    device_kind: str
    num_devices: int
    model: str
    compute_dtype: str
    global_batch_size: int
    per_device_batch_size: int
    bn_group_size: int | None
    num_params: int
    num_batch_stats: int
    compile_sec: float
    memory_bytes: dict[str, int]
    hbm_bytes_per_device: int | None
    flops_per_device: float
    flops_per_step: float
    collectives: dict[str, dict[str, int]]
    collectives_by_group: list[dict[str, Any]]
    largest_collectives: list[dict[str, Any]]


def topology_devices(topology: str, chips_per_host_bounds: Sequence[int] = (2, 2, 1),
                     num_slices: int = 1) -> list[jax.Device]:
    """The devices of a TPU topology such as "v2:16x16" (the full v2 Pod: 512 devices), from libtpu.

    Raises:
      RuntimeError: libtpu is not installed (`pip install -e '.[tpu]'`).
    """
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(
            platform="tpu", topology_name=topology, chips_per_host_bounds=tuple(chips_per_host_bounds),
            num_slices=num_slices)
    except Exception as e:  # noqa: BLE001 - jax raises several types when libtpu is missing.
        raise RuntimeError(
            f"Cannot describe TPU topology {topology!r}: {e}. Ahead-of-time compilation needs libtpu "
            "(pip install -e '.[tpu]'); if another process holds libtpu's lock, set "
            "ALLOW_MULTIPLE_LIBTPU_LOAD=1 (python -m resnet_scaling.compile does).") from e
    return list(description.devices)


def abstract_train_state(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                         plan: config_lib.TrainingPlan) -> tuple[steps.TrainState, Any]:
    """The train state as ShapeDtypeStructs carrying the trainer's shardings, and the LR schedule.

    Built exactly as `trainer.train_and_evaluate` builds the real state, but under `jax.eval_shape`, so
    nothing is allocated on (or needs) the target devices.
    """
    model = models.model_from_config(config, num_devices=mesh.size)
    learning_rate_fn = optim.create_learning_rate_schedule(config, plan)
    tx = optim.create_optimizer(config, learning_rate_fn)
    init = steps.train_state_init_fn(model, tx, config.data.image_size, optim.create_dynamic_scale(config))
    shapes = jax.eval_shape(init, jax.random.key(config.seed))
    shardings = steps.state_sharding(shapes, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)
    return state, learning_rate_fn


def abstract_batch(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """A training batch as ShapeDtypeStructs sharded over `data`, as the data sources make it."""
    batch, size = config.training.global_batch_size, config.data.image_size
    sharding = mesh_lib.batch_sharding(mesh)
    return {"images": jax.ShapeDtypeStruct((batch, size, size, 3), jnp.uint8, sharding=sharding),
            "labels": jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding)}


def compile_train_step(config: ml_collections.ConfigDict, devices: Sequence[jax.Device]
                       ) -> tuple[Any, steps.TrainState, config_lib.TrainingPlan, float]:
    """Lowers and compiles the trainer's jitted train step for `devices` (real or from a topology).

    Returns:
      (compiled step, abstract state, training plan, compile seconds).
    """
    config_lib.validate(config)
    mesh = mesh_lib.create_mesh(config.mesh.num_devices, list(devices))
    config_lib.validate(config, mesh.size)
    plan = config_lib.derive(config, config.data.num_train_examples, mesh.size)
    state, learning_rate_fn = abstract_train_state(config, mesh, plan)
    step_fn = steps.jit_train_step(state, mesh, learning_rate_fn, steps.StepConfig.from_config(config))
    start = time.perf_counter()
    compiled = step_fn.lower(state, abstract_batch(config, mesh)).compile()
    return compiled, state, plan, time.perf_counter() - start


def _memory_bytes(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    memory = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),  # outputs written into donated arguments
        "temp": int(m.temp_size_in_bytes),
        "generated_code": int(m.generated_code_size_in_bytes),
    }
    # Donated state buffers are reused for the new state, so aliased outputs take no extra memory.
    memory["total"] = (memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
                       + memory["generated_code"])
    return memory


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax returns one dict per program
        cost = cost[0] if cost else {}
    return dict(cost or {})


def _describe(c: hlo.Collective) -> dict[str, Any]:
    shapes = [f"{dtype}[{','.join(map(str, dims))}]" for dtype, dims in c.operand_shapes]
    return {"kind": c.kind, "name": c.name, "num_elements": c.num_elements, "num_bytes": c.num_bytes,
            "group_size": c.group_size, "operand_shapes": shapes}


def build_report(config: ml_collections.ConfigDict, devices: Sequence[jax.Device], topology: str = ""
                 ) -> CompileReport:
    """Compiles the train step of `config` for `devices` and gathers memory, FLOPs and collectives."""
    compiled, state, plan, compile_sec = compile_train_step(config, devices)
    device_kind = devices[0].device_kind
    num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))
    num_batch_stats = sum(math.prod(x.shape) for x in jax.tree.leaves(state.batch_stats))
    collectives = hlo.find_collectives(compiled.as_text(), num_devices=plan.num_devices)
    largest = sorted(collectives, key=lambda c: c.num_elements, reverse=True)[:8]
    flops_per_device = float(_cost(compiled).get("flops", 0.0))
    return CompileReport(
        system=config.system.name,
        topology=topology,
        device_kind=device_kind,
        num_devices=plan.num_devices,
        model=config.model.name,
        compute_dtype=config.model.compute_dtype,
        global_batch_size=plan.global_batch_size,
        per_device_batch_size=plan.per_device_batch_size,
        bn_group_size=config_lib.resolve_bn_group_size(config, plan.num_devices),
        num_params=num_params,
        num_batch_stats=num_batch_stats,
        compile_sec=compile_sec,
        memory_bytes=_memory_bytes(compiled),
        hbm_bytes_per_device=hbm_bytes_per_device(devices, config.system.device_kind),
        flops_per_device=flops_per_device,
        flops_per_step=flops_per_device * plan.num_devices,
        collectives=hlo.summarize(collectives),
        collectives_by_group=hlo.summarize_by_group(collectives),
        largest_collectives=[_describe(c) for c in largest],
    )


def _flops(value: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} FLOP"


def format_report(report: CompileReport) -> str:
    """The report as Markdown tables (what the command prints and benchmarks/README.md quotes)."""
    mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
    memory = report.memory_bytes
    hbm = report.hbm_bytes_per_device
    fits = "unknown HBM" if hbm is None else (
        f"{memory['total'] / hbm:.0%} of {hbm / GIB:.0f} GiB HBM" + ("" if memory["total"] <= hbm else
                                                                     " - DOES NOT FIT"))
    per_image = report.flops_per_step / report.global_batch_size
    lines = [
        f"| {report.system or report.model} | |",
        "|---|---|",
        f"| topology | {report.topology or '-'} ({report.num_devices} x {report.device_kind}) |",
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
        f"| FLOPs per step (all devices), per image | {_flops(report.flops_per_step)}, {_flops(per_image)} |",
        "",
        "| collective | devices per group | element type | ops | elements per device | MiB per device |",
        "|---|---|---|---|---|---|",
    ]
    for row in report.collectives_by_group:
        lines.append(f"| {row['kind']} | {row['group_size']} | {row['dtype']} | {row['count']} | "
                     f"{row['num_elements']:,} | {row['num_bytes'] / 2**20:,.2f} |")
    for kind, entry in sorted(report.collectives.items()):
        lines.append(f"| **{kind}, all** | | | {entry['count']} | **{entry['num_elements']:,}** | "
                     f"{entry['num_bytes'] / 2**20:,.2f} |")
    if not report.collectives:
        lines.append("| (none) | | | 0 | 0 | 0 |")
    return "\n".join(lines)
