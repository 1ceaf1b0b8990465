"""What XLA says about one compiled step: its FLOPs (cost analysis) and its memory (memory analysis).

The trainer's start-up log, aot.py's report and the train-step benchmark all use these: same totals.
"""

from __future__ import annotations

from typing import Any


def _cost(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program, {} where there is none.

    `cost_analysis()`: a dict, a list (one per program) or None by jax version and backend; some raise.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements cost analysis.
        return {}
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    return cost if isinstance(cost, dict) else {}


def flops_per_device(compiled: Any) -> float | None:
    """FLOPs of one step of a compiled (per-device, SPMD-partitioned) program, or None if unknown."""
    flops = _cost(compiled).get("flops")
    return float(flops) if flops is not None and flops > 0 else None


def bytes_accessed_per_device(compiled: Any) -> float | None:
    """HBM bytes one step of a compiled program reads and writes on its device, as XLA's cost analysis
    counts them after fusion ("bytes accessed"), or None if unknown: the memory side of a roofline."""
    accessed = _cost(compiled).get("bytes accessed")
    return float(accessed) if accessed is not None and accessed > 0 else None


def estimated_seconds(compiled: Any) -> float | None:
    """The compiler's own estimate of one run of the program on its device, or None: libtpu reports it as
    `optimal_seconds` for TPU programs (jax 0.10.2); XLA's CPU and GPU compilers do not."""
    seconds = _cost(compiled).get("optimal_seconds")
    return float(seconds) if seconds is not None and seconds > 0 else None


def memory_per_device(compiled: Any) -> dict[str, int] | None:
    """Bytes one device holds for the step, by kind, with their `total`; None where not reported.

    Kinds: `argument` (state and batch), `output`, `alias` (outputs written into donated arguments),
    `temp` (activations and other temporaries), `generated_code`; `total` counts aliased outputs once.
    """
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements memory analysis.
        return None
    if m is None:
        return None
    memory = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
        "generated_code": int(m.generated_code_size_in_bytes),
    }
    memory["total"] = (memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
                       + memory["generated_code"])
    return memory
