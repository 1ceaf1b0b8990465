"""Compile seconds of the train state's initialiser on the CPU, XLA's default optimisation against the options
`steps.create_train_state` uses there (`steps.RUN_ONCE_CPU_COMPILER_OPTIONS`).

The initialiser runs once per launch, yet XLA:CPU optimises it as hard as the step: one threefry and
inverse-erf body per parameter. For each model (the tests' tiny ResNet, the demo's ResNet-18/4 at 32 px,
ResNet-50 at 224 px), the two options alternate, `--repeats` times: each repeat lowers and compiles the
initialiser afresh (no persistent cache), then runs it once. Also reports the largest difference between
the two states' values, relative to each array's largest magnitude. Prints a table of medians, writes JSON.

    python benchmarks/init_compile.py --repeats=3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import harness  # Beside this script.
import jax
import jax.numpy as jnp
import numpy as np

from resnet_scaling import models
from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.training import optim, steps

# name: (model, classes, width, image size)
MODELS = {
    "resnet_tiny": ("resnet_tiny", 10, 16, 16),
    "demo resnet18/4": ("resnet18", 10, 16, 32),
    "resnet50": ("resnet50", 1000, 64, 224),
}
OPTIONS = {"xla_default": None, "run_once": steps.RUN_ONCE_CPU_COMPILER_OPTIONS}


def time_model(name: str, repeats: int) -> dict:
    arch, classes, width, size = MODELS[name]
    model = models.create_model(arch, num_classes=classes, num_filters=width)
    tx = optim.create_optimizer(optim.OptimizerConfig(), lambda step: 0.1)
    mesh = mesh_lib.create_mesh(1)
    init = jax.jit(steps.train_state_init_fn(model, tx, size),
                   out_shardings=mesh_lib.replicated_sharding(mesh))
    rng = jax.random.key(0)

    states = {}  # Each option's last state only: ResNet-50's is hundreds of MB.

    def compile_and_run(label: str) -> tuple[float, float]:
        jax.clear_caches()  # Otherwise JAX hands back the executable it compiled for the last repeat.
        start = time.perf_counter()
        compiled = init.lower(rng).compile(compiler_options=OPTIONS[label])
        compiled_at = time.perf_counter()
        states[label] = jax.block_until_ready(compiled(rng))
        return compiled_at - start, time.perf_counter() - compiled_at

    runs = harness.alternate({label: functools.partial(compile_and_run, label) for label in OPTIONS}, repeats)
    compile_sec = {label: [r[0] for r in results] for label, results in runs.items()}
    run_sec = {label: [r[1] for r in results] for label, results in runs.items()}

    def relative(a, b):
        scale = float(jnp.max(jnp.abs(a))) if a.size else 0.0
        return float(jnp.max(jnp.abs(a - b))) / scale if scale else 0.0

    differences = jax.tree.leaves(jax.tree.map(relative, states["xla_default"], states["run_once"]))
    compile_median = {k: statistics.median(v) for k, v in compile_sec.items()}
    return {
        "model": name, "image_size": size,
        "parameters": int(sum(np.prod(x.shape) for x in jax.tree.leaves(states["run_once"].params))),
        "compile_sec": compile_median, "compile_sec_repeats": compile_sec,
        "run_sec": {k: statistics.median(v) for k, v in run_sec.items()},
        "compile_speedup": compile_median["xla_default"] / compile_median["run_once"],
        "max_relative_difference": max(differences),
    }


def print_table(result: dict) -> None:
    print(harness.markdown_table(
        ["model", "parameters", "compile, XLA default (s)", "compile, run-once (s)", "speedup",
         "run, XLA default (s)", "run, run-once (s)", "max relative difference"],
        [[row["model"], f"{row['parameters']:,}", f"{row['compile_sec']['xla_default']:.2f}",
          f"{row['compile_sec']['run_once']:.2f}", f"{row['compile_speedup']:.2f}x",
          f"{row['run_sec']['xla_default']:.2f}", f"{row['run_sec']['run_once']:.2f}",
          f"{row['max_relative_difference']:.1e}"] for row in result["models"]]))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"Comma-separated, from: {', '.join(MODELS)}.")
    harness.add_flags(p, repeats=3, json_out="benchmarks/results/init_compile.json")
    args = p.parse_args(argv)
    # Compile times are measured here: JAX's persistent cache (JAX_COMPILATION_CACHE_DIR in the caller's
    # environment) would hand back an executable compiled earlier, in milliseconds.
    jax.config.update("jax_enable_compilation_cache", False)
    names = [n for n in args.models.split(",") if n]
    if unknown := [n for n in names if n not in MODELS]:
        p.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if jax.default_backend() != "cpu":
        raise SystemExit("init_compile.py times CPU compiles; JAX's backend here is "
                         f"{jax.default_backend()}.")
    result = {
        "environment": harness.environment(), "repeats": args.repeats,
        "models": [time_model(name, args.repeats) for name in names],
    }
    print_table(result)
    harness.write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
