"""What the benchmarks here do alike: the common flags, variants alternated over repeats, medians and ratios
within a repeat, a Markdown table, and JSON written with the machine it was measured on.

Variants alternate within each repeat (a, b, a, b, ... rather than a, a, b, b) so that drifts in a shared
machine's load hit them alike; a ratio between two variants is the median of the ratios within each repeat,
so that load drifting between repeats cancels out of it. Every JSON records the command, the date and the
CPU model (`lscpu`'s "Model name"), since figures compare only within one machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from resnet_scaling.job import hardware, workdir

T = TypeVar("T")


def add_flags(parser: argparse.ArgumentParser, *, repeats: int, json_out: str | None,
              json_out_help: str = "") -> None:
    """Adds `--repeats` and `--json_out` (None: the benchmark names its file from what it measured)."""
    parser.add_argument("--repeats", type=int, default=repeats,
                        help="Timed repeats, the variants alternating within each; figures are medians.")
    parser.add_argument("--json_out", default=json_out, help=json_out_help or "Where the JSON goes.")


def alternate(variants: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Calls every variant once per repeat, in turn; returns each variant's results in repeat order."""
    runs: dict[str, list[T]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, measure in variants.items():
            runs[name].append(measure())
    return runs


def run_child_json(script: str, args: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike[str],
                   timeout_sec: float = 900) -> Any:
    """Runs `script` (Python source) in a fresh interpreter; returns the JSON of its last stdout line.

    Raises:
      RuntimeError: the child failed; the message is the end of its stderr.
    """
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=dict(env), capture_output=True,
                          text=True, timeout=timeout_sec)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def medians(runs: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each variant's median."""
    return {name: statistics.median(values) for name, values in runs.items()}


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median over repeats of numerator / denominator within each repeat."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def environment(**extra: Any) -> dict[str, Any]:
    """The command, the date (UTC), Python, JAX (when imported) and the host's CPU, plus `extra`."""
    jax = sys.modules.get("jax")
    return {
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "jax": jax.__version__ if jax else None,
        "cpu_model": hardware.host_cpu_model(),
        "cpu_count": os.cpu_count(),
        **extra,
    }


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table of already formatted cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str | os.PathLike[str], result: Mapping[str, Any]) -> None:
    """Writes `result` to `path` (folders made, all at once: never half a file) and says where."""
    workdir.write_text_atomically(path, json.dumps(result, indent=2) + "\n")
    print(f"Wrote {path}")
