"""The collectives in a compiled XLA program: what `compiled.as_text()` says moves between devices.

For `resnet_scaling.compile`'s report of a step's communication (data parallelism: one all-reduce of the
gradients plus the BN statistics) and for tests that a sharding choice adds none. Multislice: a collective
is in-slice (ICI: each replica group in one slice) or cross-slice (DCN). libtpu compiles one program per
slice (`num_partitions` = a slice's devices) whose cross-slice part is a `send` to the "megascale" runtime
(`_xla_megascale_transfer_type="ALL_REDUCE"`), reported as a collective that crosses slices.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# Bytes per element of the HLO element types a ResNet step uses.
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                  "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_ARRAY_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
# A cross-slice (DCN) transfer of libtpu's multislice runtime, and the slices it spans ("{1,2}x{0:3}").
_DCN_TRANSFER = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_DCN_TARGET = re.compile(r'_xla_megascale_target="\{([\d,]*)\}')

IN_SLICE, CROSS_SLICE = "in-slice", "cross-slice"


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program.

    Attributes:
      kind: one of COLLECTIVE_KINDS (asynchronous `-start` forms under their base kind).
      operand_shapes: e.g. (("f32", (2048, 1000)),).
      num_elements: over all operands (what one device contributes); `num_bytes` likewise.
      group_size: devices per replica group (-1 when the text does not say).
      replica_groups: device ids (of the program's assignment) per group; () where none are listed
        (`{}`: one group of every device) or for a DCN transfer.
      over_dcn: a transfer between slices by libtpu's multislice runtime (its `group_size`: slices).
    """

    kind: str
    name: str
    operand_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    num_elements: int
    num_bytes: int
    group_size: int
    replica_groups: tuple[tuple[int, ...], ...] = ()
    over_dcn: bool = False

    def crosses_slices(self, slice_of_device: Sequence[int]) -> bool:
        """Whether some replica group has devices of two slices (or the op is a DCN transfer).

        Args:
          slice_of_device: each device id's slice (`mesh.device_slices`; for libtpu's one program per
            slice, the same for every id).
        """
        if self.over_dcn:
            return True
        groups = self.replica_groups or (tuple(range(len(slice_of_device))),)
        # An id the mapping does not know (not expected) counts as another slice: never hide traffic.
        slice_of = {i: s for i, s in enumerate(slice_of_device)}
        return any(len({slice_of.get(i, -1 - i) for i in group}) > 1 for group in groups)


def _shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Array shapes in an HLO shape string ("f32[3,4]{1,0}" or a tuple of them); token/() are skipped."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in _ARRAY_SHAPE.findall(text) if dtype in _ELEMENT_BYTES]


def _operand_names(args: str) -> list[str]:
    """Names of the operands in the text after an opcode's "(" (up to the matching ")")."""
    depth, end = 1, len(args)
    for i, char in enumerate(args):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    # Operands are "%name" or, in some printers, "f32[...] %name".
    return re.findall(r"%([\w.\-]+)", args[:end])


def _group_size(attributes: str, num_devices: int | None, groups: tuple[tuple[int, ...], ...]) -> int:
    """Devices per replica group: the first of `groups` (`_replica_groups`), else every device for
    `replica_groups={}`, 2 for a permute's pairs; -1 when unknown."""
    if groups:
        return len(groups[0])
    if re.search(r"replica_groups=\{\}", attributes) and num_devices:  # one group of every device
        return num_devices
    return 2 if "source_target_pairs" in attributes else -1


def _replica_groups(attributes: str) -> tuple[tuple[int, ...], ...]:
    """The device ids of each replica group (or source/target pair), from any printed form; () if none."""
    if match := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes):
        ids = np.arange(math.prod(int(d) for d in match[3].split(","))).reshape(
            [int(d) for d in match[3].split(",")])
        if match[4]:
            ids = ids.transpose([int(d) for d in match[4].split(",")])
        return tuple(tuple(int(i) for i in row) for row in ids.reshape(int(match[1]), int(match[2])))
    if match := re.search(r"(?:replica_groups|source_target_pairs)=\{((?:\{[\d,]*\},?)+)\}", attributes):
        return tuple(tuple(int(i) for i in group.split(",") if i)
                     for group in re.findall(r"\{([\d,]*)\}", match[1]))
    if match := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes):
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", match[1]))
        names = list(sizes)
        grouped = [names.index(a) for a in re.findall(r"'([^']+)'", match[2])]
        ids = np.arange(math.prod(int(v) for v in sizes.values())).reshape([int(v) for v in sizes.values()])
        others = [i for i in range(len(names)) if i not in grouped]
        ids = ids.transpose(others + grouped).reshape(-1, math.prod(ids.shape[i] for i in grouped))
        return tuple(tuple(int(i) for i in row) for row in ids)
    return ()


def program_num_devices(hlo_text: str) -> int | None:
    """Devices one program runs on (`replica_count` x `num_partitions` of the module), if printed."""
    header = match[0] if (match := re.search(r"^HloModule.*$", hlo_text, re.MULTILINE)) else ""
    partitions = re.search(r"\bnum_partitions=(\d+)", header)
    replicas = re.search(r"\breplica_count=(\d+)", header)
    if not partitions and not replicas:
        return None
    return (int(partitions[1]) if partitions else 1) * (int(replicas[1]) if replicas else 1)


def find_collectives(hlo_text: str, num_devices: int | None = None) -> list[Collective]:
    """Every collective in an HLO module's text (`compiled.as_text()`), in program order.

    Args:
      hlo_text: the compiled (optimised, partitioned) HLO module.
      num_devices: the program's devices, to size `replica_groups={}` (all of them).

    Returns:
      One `Collective` per synchronous op, asynchronous `-start` (not `-done`) or DCN `send` (not `recv`).
    """
    shapes_by_name: dict[str, str] = {}
    found: list[tuple[str, str, str, str]] = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, opcode, rest = match.groups()
        shapes_by_name[name] = shape
        kind = opcode.removesuffix("-start")
        if kind == "send" and (transfer := _DCN_TRANSFER.search(rest)):
            found.append((transfer[1].lower().replace("_", "-"), name, shape, rest))
        elif kind in COLLECTIVE_KINDS:
            found.append((kind, name, shape, rest))
    collectives = []
    for kind, name, shape, rest in found:
        over_dcn = _DCN_TRANSFER.search(rest) is not None
        operands = _operand_names(rest)
        operand_shapes = [s for op in operands for s in _shapes(shapes_by_name.get(op, ""))]
        if not operand_shapes:  # operands not printed with names: fall back to the result's shape
            operand_shapes = _shapes(shape)
        num_elements = sum(math.prod(dims) for _, dims in operand_shapes)
        num_bytes = sum(math.prod(dims) * _ELEMENT_BYTES[dtype] for dtype, dims in operand_shapes)
        if over_dcn:
            target = _DCN_TARGET.search(rest)
            group_size = len(target[1].split(",")) if target else -1
            replica_groups = ()
        else:
            replica_groups = _replica_groups(rest)
            group_size = _group_size(rest, num_devices, replica_groups)
        collectives.append(Collective(kind, name, tuple(operand_shapes), num_elements, num_bytes,
                                      group_size, replica_groups, over_dcn))
    return collectives


def summarize(collectives: list[Collective]) -> dict[str, dict[str, int]]:
    """Per kind: the number of ops, and the elements and bytes they move per device."""
    summary: dict[str, dict[str, int]] = {}
    for c in collectives:
        entry = summary.setdefault(c.kind, {"count": 0, "num_elements": 0, "num_bytes": 0})
        entry["count"] += 1
        entry["num_elements"] += c.num_elements
        entry["num_bytes"] += c.num_bytes
    return summary


def summarize_by_slice(collectives: list[Collective], slice_of_device: Sequence[int]
                       ) -> dict[str, dict[str, int]]:
    """In-slice (ICI) and cross-slice (DCN) collectives: ops, and elements and bytes moved per device."""
    summary = {where: {"count": 0, "num_elements": 0, "num_bytes": 0} for where in (IN_SLICE, CROSS_SLICE)}
    for c in collectives:
        entry = summary[CROSS_SLICE if c.crosses_slices(slice_of_device) else IN_SLICE]
        entry["count"] += 1
        entry["num_elements"] += c.num_elements
        entry["num_bytes"] += c.num_bytes
    return summary


def summarize_by_group(collectives: list[Collective], slice_of_device: Sequence[int] | None = None
                       ) -> list[dict[str, object]]:
    """Per (kind, devices per group, element type): ops, elements and bytes per device, largest first.

    Tells a gradient all-reduce over every device from BN reductions within a few. With `slice_of_device`
    (multislice), rows also say where the ops run ("slices": in-slice or cross-slice).
    """
    rows: dict[tuple[str, int, str, str], dict[str, object]] = {}
    for c in collectives:
        where = "" if slice_of_device is None else (
            CROSS_SLICE if c.crosses_slices(slice_of_device) else IN_SLICE)
        keys = set()
        for dtype, dims in c.operand_shapes or (("?", ()),):
            key = (c.kind, c.group_size, dtype, where)
            keys.add(key)
            row = rows.setdefault(key, {"kind": c.kind, "group_size": c.group_size, "dtype": dtype,
                                        **({"slices": where} if where else {}),
                                        "count": 0, "num_elements": 0, "num_bytes": 0})
            elements = math.prod(dims)
            row["num_elements"] += elements
            row["num_bytes"] += elements * _ELEMENT_BYTES.get(dtype, 0)
        for key in keys:
            rows[key]["count"] += 1
    return sorted(rows.values(), key=lambda r: -int(r["num_elements"]))


_DIM_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_LHS_DILATE = re.compile(r"lhs_dilate=([\dx]+)")
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")


def _operand_list(args: str) -> list[str]:
    """Operand names after an opcode's "(", as any printer writes them: "a, b", "%a, %b" or
    "f32[2,3]{1,0} %a, ..." (commas inside brackets and braces are not separators)."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(args + ")"):
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif depth == 0 and char in ",)":
            token = args[start:i].split()
            names.append(token[-1].lstrip("%") if token else "")
            start = i + 1
            if char == ")":
                break
    return [n for n in names if n]


def matmul_flops(hlo_text: str) -> float:
    """FLOPs of the convolutions and dot products of an HLO module (2 per multiply-add), counted from the
    shapes its text gives; elementwise operations, reductions and the like are not counted.

    For programs whose compiler reports no cost (XLA's GPU compiler without a GPU): count the module as
    lowered (`lowered.as_text(dialect="hlo")`), before fusion and rematerialisation. A convolution's output
    element sums over its kernel's window and input features: the kernel's elements over its output
    features (`dim_labels`' `o`), padding taps included as published counts include them, the holes of an
    `lhs_dilate`d input not; a dot's, over the left operand's contracting dimensions.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    flops = 0.0
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, shape_text, opcode, rest = match.groups()
        result = _shapes(shape_text)
        if len(result) == 1:
            shapes[name] = result[0][1]
        if opcode not in ("convolution", "dot") or len(result) != 1:
            continue
        operands = [shapes.get(n) for n in _operand_list(rest)]
        if len(operands) != 2 or None in operands:
            raise ValueError(f"HLO {opcode} {name!r}: operand shapes not found in the text.")
        output_elements = math.prod(result[0][1])
        if opcode == "convolution":
            labels = _DIM_LABELS.search(rest)
            kernel = operands[1]
            output_features = kernel[labels.group(1).index("o")] if labels else 1
            # An input's gradient through a strided convolution dilates the input with holes: of a window's
            # taps, 1 / dilation land on values (as the forward pass counts them).
            dilate = _LHS_DILATE.search(rest)
            holes = math.prod(int(d) for d in dilate.group(1).split("x")) if dilate else 1
            flops += 2.0 * output_elements * math.prod(kernel) / output_features / holes
        else:
            contracting = _LHS_CONTRACTING.search(rest)
            dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
            flops += 2.0 * output_elements * math.prod(operands[0][d] for d in dims)
    return flops
