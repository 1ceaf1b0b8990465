"""What the train state's checks cost a launch: the first call of each (tracing, compiling and running it) and
a later call (running it), on the CPU with XLA's default optimisations, as a user's run compiles them.

  python benchmarks/state_checks.py [--repeats=3] [--models=...] [--baseline_checkout=PATH] [--json_out=PATH]

The checks (`checkpointing/state_checks.py`): `health` (finite, and the parameters' norm: before every
checkpoint and at the start of a run), `all_finite` (the final parameters, before the export) and
`fingerprint` (every checkpoint's arrays). For each model (the tests' tiny ResNet, the demo's ResNet-18/4,
ResNet-50), a fresh process builds a real initial train state on one CPU device, without a persistent
compilation cache, then calls each check four times. `--baseline_checkout` runs the same from another
checkout too (e.g. `git worktree add /tmp/before <commit>`), alternating with this one within each repeat.
`--gpu=CARD` (a card `python -m resnet_scaling.compile --gpu` knows, e.g. "Tesla V100-SXM2-16GB") compiles
each check for one GPU of that card instead, on the state's shapes, and times the compile: no GPU needed,
only JAX's CUDA plugin (the `gpu_compile` extra).

Prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from pathlib import Path

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]
# name: (model, classes, width, image size), as benchmarks/init_compile.py.
MODELS = {
    "resnet_tiny": ("resnet_tiny", 10, 16, 16),
    "demo resnet18/4": ("resnet18", 10, 16, 32),
    "resnet50": ("resnet50", 1000, 64, 224),
}
CHECKS = ("health", "all_finite", "fingerprint")

# Builds the state, times each check's first call and the median of three later ones, prints JSON.
_CHILD = """
import json, statistics, sys, time
import jax
import resnet_scaling
from resnet_scaling import models
from resnet_scaling.checkpointing import state_checks
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.training import optim, steps

arch, classes, width, size = json.loads(sys.argv[1])
model = models.create_model(arch, num_classes=classes, num_filters=width)
tx = optim.create_optimizer(optim.OptimizerConfig(), lambda step: 0.1)
state = steps.create_train_state(jax.random.key(0), model, tx, size, mesh_lib.create_mesh(1))
calls = {
    "health": lambda: state_checks.health(state),
    "all_finite": lambda: state_checks.all_finite({"params": state.params, "batch_stats": state.batch_stats}),
    "fingerprint": lambda: state_checks.fingerprint(state.params),
}
result = {"package": resnet_scaling.__file__, "arrays": len(jax.tree.leaves(state)), "checks": {}}
for name, call in calls.items():
    seconds = []
    for _ in range(4):
        start = time.perf_counter()
        call()  # Each returns host values: the work is done when it returns.
        seconds.append(time.perf_counter() - start)
    result["checks"][name] = {"first_call_sec": seconds[0], "later_call_sec": statistics.median(seconds[1:])}
print(json.dumps(result))
"""
# Compiles each check for one GPU of the card in argv[2] on the state's shapes, prints JSON.
_GPU_CHILD = """
import json, sys, time
import jax
import resnet_scaling
from resnet_scaling import models
from resnet_scaling.checkpointing import state_checks
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.planning import gpu_targets
from resnet_scaling.training import optim, steps

arch, classes, width, size = json.loads(sys.argv[1])
model = models.create_model(arch, num_classes=classes, num_filters=width, platform="gpu")
tx = optim.create_optimizer(optim.OptimizerConfig(), lambda step: 0.1)
mesh = mesh_lib.create_mesh(1, gpu_targets.gpu_devices(sys.argv[2], 1))
state = steps.abstract_train_state(jax.random.key(0), model, tx, size, mesh)
others = [x for x in jax.tree.leaves((state.batch_stats, state.opt_state)) if x.dtype.kind == "f"]
programs = {
    "health": lambda: state_checks._health.lower(state.params, others),
    "all_finite": lambda: state_checks._all_finite.lower({"params": state.params,
                                                         "batch_stats": state.batch_stats}),
    "fingerprint": lambda: state_checks._fingerprints.lower(state.params),
}
result = {"package": resnet_scaling.__file__, "arrays": len(jax.tree.leaves(state)), "checks": {}}
for name, lower in programs.items():
    start = time.perf_counter()
    lower().compile()
    result["checks"][name] = {"compile_sec": time.perf_counter() - start}
print(json.dumps(result))
"""


def measure(checkout: Path, model: str, gpu: str | None = None) -> dict:
    """One fresh process of `checkout` on `model` (compiling for `gpu` if given): its child's JSON."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
           and key not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")}
    env.update({"PYTHONPATH": str(checkout), "JAX_PLATFORMS": "cpu"})
    args = [json.dumps(MODELS[model]), *([gpu] if gpu else [])]
    result = harness.run_child_json(_GPU_CHILD if gpu else _CHILD, args, env, cwd=checkout)
    if not Path(result["package"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"The child ran {result['package']}, not {checkout}'s package.")
    return result


def _medians(children: list[dict]) -> dict:
    """Each check's median of each figure over the repeats."""
    return {check: {field: statistics.median(child["checks"][check][field] for child in children)
                    for field in figures}
            for check, figures in children[0]["checks"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_flags(parser, repeats=3, json_out=None,
                      json_out_help="Where the JSON goes (default: benchmarks/results/"
                                    "state_checks.json, with --gpu state_checks_gpu.json).")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"Comma-separated, of {', '.join(MODELS)}.")
    parser.add_argument("--baseline_checkout", default=None,
                        help="Another checkout of the repository to measure alternately (before and after).")
    parser.add_argument("--gpu", default=None,
                        help='Compile the checks for one GPU of this card (e.g. "Tesla V100-SXM2-16GB").')
    args = parser.parse_args()
    models = args.models.split(",")
    if unknown := sorted(set(models) - set(MODELS)):
        parser.error(f"--models: no such model {', '.join(unknown)}; choose from {', '.join(MODELS)}.")
    checkouts = {"now": REPO}
    if args.baseline_checkout:
        checkouts["baseline"] = Path(args.baseline_checkout)
        if not (checkouts["baseline"] / "resnet_scaling").is_dir():
            parser.error(f"--baseline_checkout={args.baseline_checkout}: no resnet_scaling/ package there.")

    results = {}
    for model in models:
        runs = harness.alternate({label: functools.partial(measure, path, model, args.gpu)
                                  for label, path in checkouts.items()}, args.repeats)
        results[model] = {label: {"arrays": children[0]["arrays"], "checks": _medians(children),
                                   "repeats": children}
                           for label, children in runs.items()}

    # (the figure, its column's title, its scale and format)
    columns = ([("compile_sec", f"compile for a {args.gpu}, {{}} (s)", 1, ".2f")] if args.gpu else
               [("first_call_sec", "first call, {} (s)", 1, ".2f"),
                ("later_call_sec", "later call, {} (ms)", 1e3, ".1f")])
    header = ["model", "arrays", "check",
              *(title.format(label) for _, title, _, _ in columns for label in checkouts)]
    rows = [[model, by_checkout["now"]["arrays"], check,
             *(f"{scale * by_checkout[label]['checks'][check][field]:{spec}}"
               for field, _, scale, spec in columns for label in checkouts)]
            for model, by_checkout in results.items() for check in CHECKS]
    print(harness.markdown_table(header, rows))
    suffix = "_gpu" if args.gpu else ""
    json_out = args.json_out or str(REPO / f"benchmarks/results/state_checks{suffix}.json")
    harness.write_json(json_out, {**harness.environment(repeats=args.repeats, gpu=args.gpu,
                                                        baseline_checkout=args.baseline_checkout),
                                  "models": results})


if __name__ == "__main__":
    main()
