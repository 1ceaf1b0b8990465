"""How soon a command answers `--help` or a mistake on its command line, and the planner its table, against
`import jax` alone.

  python benchmarks/command_line.py [--repeats=5] [--baseline_checkout=PATH] [--json_out=PATH]

Each variant is a fresh process, timed from outside (wall seconds around `subprocess.run`): what a user
waits for. The commands read their command line before importing JAX (`config/command_line.py`); each
child also reports whether JAX was imported by the time it exited. `--baseline_checkout` runs the same
commands from another checkout too (e.g. `git worktree add /tmp/before <commit>`), alternating with this
one within each repeat: before and after in one run, on one machine's minutes.

Prints a table of medians (and each variant's ratio to `import jax`) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]

# Runs a module as `python -m` does; says which package it ran and whether JAX was imported.
_CHILD = """
import json, runpy, sys
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
import resnet_scaling
print(json.dumps({"package": resnet_scaling.__file__, "jax_imported": "jax" in sys.modules}))
"""
_REFERENCE_CHILD = """
import json, sys
import jax
import resnet_scaling
print(json.dumps({"package": resnet_scaling.__file__, "jax_imported": "jax" in sys.modules}))
"""
REFERENCE = "import jax"
VARIANTS = {
    REFERENCE: ["-c", _REFERENCE_CHILD],
    "train --help": ["resnet_scaling.train", "--help"],
    "train --config=demo /tmp/run (a word for a flag)": ["resnet_scaling.train", "--config=demo", "/tmp/run"],
    "train --config=pods (no such config)": ["resnet_scaling.train", "--config=pods", "--workdir=/tmp/run"],
    "train --config=demo --print_config": ["resnet_scaling.train", "--config=demo", "--print_config"],
    "evaluate --help": ["resnet_scaling.evaluate", "--help"],
    "compile --topology=v2:2x2 (no --config)": ["resnet_scaling.compile", "--topology=v2:2x2"],
    "prepare --help": ["resnet_scaling.prepare", "--help"],
    "planner --price=pod (no price in it)": ["resnet_scaling.planner", "--price=pod"],
    "planner (every shipped system's row)": ["resnet_scaling.planner"],
}


def command_seconds(args: list[str], checkout: Path) -> dict[str, object]:
    """Wall seconds of one fresh process running `args` with `checkout` first on the path."""
    argv = [sys.executable, *(args if args[0] == "-c" else ["-c", _CHILD, *args])]
    env = {**os.environ, "PYTHONPATH": str(checkout), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    with tempfile.TemporaryDirectory() as cwd:  # Not the checkout: `-m` puts the cwd first on the path.
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        seconds = time.perf_counter() - start
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report["package"].startswith(str(checkout)):  # An installed copy ran instead.
        raise RuntimeError(f"{args}: ran {report['package']}, not the checkout {checkout}")
    return {"seconds": seconds, "jax_imported": report["jax_imported"]}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_flags(p, repeats=5, json_out=str(REPO / "benchmarks" / "results" / "command_line.json"))
    p.add_argument("--baseline_checkout", default=None, help="Another checkout to time the same commands "
                   "from, alternating with this one.")
    args = p.parse_args(argv)
    checkouts = {"this checkout": REPO}
    if args.baseline_checkout:
        checkouts["baseline"] = Path(args.baseline_checkout).resolve()
    runs = harness.alternate({(where, name): (lambda a=a, c=c: command_seconds(a, c))
                              for name, a in VARIANTS.items() for where, c in checkouts.items()},
                             args.repeats)
    seconds = {key: [r["seconds"] for r in rs] for key, rs in runs.items()}
    medians = harness.medians(seconds)
    header = ["command"]
    for where in checkouts:
        header += [f"{where}: seconds (median)", f"{where}: / {REFERENCE}", f"{where}: JAX imported"]
    rows = []
    for name in VARIANTS:
        row = [name]
        for where in checkouts:
            key, reference = (where, name), (where, REFERENCE)
            row += [f"{medians[key]:.2f}", f"{harness.median_ratio(seconds[key], seconds[reference]):.2f}",
                    "yes" if any(r["jax_imported"] for r in runs[key]) else "no"]
        rows.append(row)
    print(harness.markdown_table(header, rows))
    harness.write_json(args.json_out, {
        "benchmark": "command_line", "environment": harness.environment(),
        "checkouts": {where: str(c) for where, c in checkouts.items()},
        "runs": {f"{where}: {name}": rs for (where, name), rs in runs.items()},
        "median_seconds": {f"{where}: {name}": m for (where, name), m in medians.items()}})


if __name__ == "__main__":
    main(sys.argv[1:])
