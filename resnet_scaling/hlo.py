"""The collectives in a compiled XLA program: what `compiled.as_text()` says moves between devices.

Used by `resnet_scaling.compile` to report a step's communication (for data parallelism: one gradient
all-reduce of the parameters plus the batch-norm statistics) and by tests that check a sharding choice
adds no communication.
"""

from __future__ import annotations

import dataclasses
import math
import re

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# Bytes per element of the HLO element types a ResNet step uses.
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                  "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_ARRAY_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program.

    Attributes:
      kind: one of COLLECTIVE_KINDS (asynchronous `-start` forms are reported under their base kind).
      name: the HLO instruction name.
      operand_shapes: element type and dimensions of each operand, e.g. ("f32", (2048, 1000)).
      num_elements: elements over all operands (what one device contributes).
      num_bytes: bytes over all operands.
      group_size: devices taking part in each replica group (-1 when the text does not say).
    """

    kind: str
    name: str
    operand_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    num_elements: int
    num_bytes: int
    group_size: int


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


def _group_size(attributes: str, num_devices: int | None) -> int:
    """Devices per replica group, from any of the printed forms of `replica_groups`."""
    if match := re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes):  # iota: [groups, size]
        return int(match[2])
    if match := re.search(r"replica_groups=\{\{([\d,]*)\}", attributes):  # explicit lists
        return len(match[1].split(","))
    if match := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes):  # named axes
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", match[1]))
        axes = re.findall(r"'([^']+)'", match[2])
        return math.prod(int(sizes[a]) for a in axes)
    if re.search(r"replica_groups=\{\}", attributes) and num_devices:  # one group of every device
        return num_devices
    if "source_target_pairs" in attributes:
        return 2
    return -1


def find_collectives(hlo_text: str, num_devices: int | None = None) -> list[Collective]:
    """Every collective in an HLO module's text (`compiled.as_text()`), in program order.

    Args:
      hlo_text: the compiled (optimised, partitioned) HLO module.
      num_devices: devices of the program, to size `replica_groups={}` (all of them).

    Returns:
      One `Collective` per synchronous op or per asynchronous `-start` (its `-done` is not counted).
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
        if kind in COLLECTIVE_KINDS:
            found.append((kind, name, shape, rest))
    collectives = []
    for kind, name, shape, rest in found:
        operands = _operand_names(rest)
        operand_shapes = [s for op in operands for s in _shapes(shapes_by_name.get(op, ""))]
        if not operand_shapes:  # operands not printed with names: fall back to the result's shape
            operand_shapes = _shapes(shape)
        num_elements = sum(math.prod(dims) for _, dims in operand_shapes)
        num_bytes = sum(math.prod(dims) * _ELEMENT_BYTES[dtype] for dtype, dims in operand_shapes)
        collectives.append(Collective(kind, name, tuple(operand_shapes), num_elements, num_bytes,
                                      _group_size(rest, num_devices)))
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


def summarize_by_group(collectives: list[Collective]) -> list[dict[str, object]]:
    """Per (kind, devices per group, element type): ops, elements and bytes per device, largest first.

    Tells a gradient all-reduce over every device from batch-norm reductions within a few devices.
    """
    rows: dict[tuple[str, int, str], dict[str, object]] = {}
    for c in collectives:
        for dtype, dims in c.operand_shapes or (("?", ()),):
            key = (c.kind, c.group_size, dtype)
            row = rows.setdefault(key, {"kind": c.kind, "group_size": c.group_size, "dtype": dtype,
                                        "count": 0, "num_elements": 0, "num_bytes": 0})
            elements = math.prod(dims)
            row["num_elements"] += elements
            row["num_bytes"] += elements * _ELEMENT_BYTES.get(dtype, 0)
        for key in {(c.kind, c.group_size, dtype) for dtype, _ in c.operand_shapes or (("?", ()),)}:
            rows[key]["count"] += 1
    return sorted(rows.values(), key=lambda r: -int(r["num_elements"]))
