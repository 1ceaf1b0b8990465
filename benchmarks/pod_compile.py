"""Compile time of the pod's training step against the flax ImageNet example's, for the same TPU topology.

  python benchmarks/pod_compile.py [--config=pod] [--repeats=1] [--json_out=...]

Needs libtpu (the `tpu` extra), not a TPU. For `configs/pod.py` (ResNet-50, bfloat16, global batch 32,768,
LARS, 512 TPU v2 cores of topology v2:16x16) it compiles, one after the other in each repeat:

- ours: the trainer's real step (`training_setup.setup(..., abstract=True).compile_train_step()`),
  with the convolution and pooling forms `models` picks for TPUs;
- ours with the CPU forms (1x1 convolutions as dots, max pooling as strided maxima), which the library
  used on every backend before choosing per backend;
- the flax ImageNet example's model (`flax_example_baseline.ResNet`: `nn.Conv`, `nn.max_pool`) in a plain
  `jit` step over the same mesh and batch: global batch norm, optax LARS, bfloat16.

Each figure is the wall time of `jit(step).lower(...).compile()` for abstract arguments (nothing is
allocated). Prints a table of medians and the ratios to the baseline, and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # The compiler runs on the host: no local accelerator.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flax_example_baseline  # noqa: E402
import harness  # noqa: E402

from resnet_scaling import config as config_lib  # noqa: E402
from resnet_scaling.job import mesh
from resnet_scaling.metrics import compiled as compiled_lib
from resnet_scaling.planning import aot
from resnet_scaling.training import training_setup


def load_config(name: str) -> Any:
    """A shipped config by name (or a path), as `--config` resolves it."""
    import importlib.util

    path = config_lib.find_config_file(name)
    spec = importlib.util.spec_from_file_location("config_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def compile_ours(config: Any, devices: list[Any], lowering: str) -> dict[str, Any]:
    """Compiles the trainer's step with `model.lowering` set; returns seconds, FLOPs and memory."""
    config = config.copy_and_resolve_references()
    config.model.lowering = lowering
    compiled, seconds = training_setup.setup(config, devices=devices, abstract=True).compile_train_step()
    return {"compile_sec": seconds, "flops_per_device": compiled_lib.flops_per_device(compiled),
            "memory": compiled_lib.memory_per_device(compiled)}


def compile_baseline(config: Any, devices: list[Any]) -> dict[str, Any]:
    """Compiles the flax example's model in a plain jit step (global BN, LARS) for the same mesh/batch."""
    m = mesh.create_mesh(len(devices), devices)
    model = flax_example_baseline.ResNet(stage_sizes=(3, 4, 6, 3), num_classes=1000, dtype=jnp.bfloat16,
                                         bn_axis_name=None)
    tx = optax.lars(optax.polynomial_schedule(32.0, 1e-4, 2.0, 3558), weight_decay=1e-4, momentum=0.9)
    size, batch_size = config.data.image_size, config.training.global_batch_size

    def init(rng):
        variables = model.init(rng, jnp.ones((1, size, size, 3), jnp.bfloat16), train=False)
        return flax_example_baseline.TrainState.create(apply_fn=model.apply, params=variables["params"],
                                                       tx=tx, batch_stats=variables["batch_stats"])

    shapes = jax.eval_shape(init, jax.random.key(0))
    replicated = mesh.replicated_sharding(m)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), shapes)
    batch = {"image": jax.ShapeDtypeStruct((batch_size, size, size, 3), jnp.bfloat16,
                                           sharding=mesh.batch_sharding(m)),
             "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=mesh.batch_sharding(m))}
    step = jax.jit(functools.partial(flax_example_baseline.jit_train_step, num_classes=1000),
                   donate_argnums=(0,))
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    seconds = time.perf_counter() - start
    return {"compile_sec": seconds, "flops_per_device": compiled_lib.flops_per_device(compiled),
            "memory": compiled_lib.memory_per_device(compiled)}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="pod")
    p.add_argument("--variants", default="ours,ours_cpu_forms,baseline")
    harness.add_flags(p, repeats=1, json_out=str(Path(__file__).resolve().parent / "results" /
                                                 "pod_compile.json"))
    args = p.parse_args(argv)
    # Compile times are measured here: JAX's persistent cache (JAX_COMPILATION_CACHE_DIR in the caller's
    # environment) would hand back an executable compiled earlier, in milliseconds.
    jax.config.update("jax_enable_compilation_cache", False)
    config = load_config(args.config)
    devices = aot.topology_devices(config.system.topology, config.system.chips_per_host_bounds,
                                   config.system.num_slices)
    variants = {"ours": lambda: compile_ours(config, devices, "auto"),
                "ours_cpu_forms": lambda: compile_ours(config, devices, "cpu"),
                "baseline": lambda: compile_baseline(config, devices)}

    def compile_and_say(name: str) -> dict[str, Any]:
        result = variants[name]()
        print(f"{name}: {result['compile_sec']:.1f} s", flush=True)
        return result

    runs = harness.alternate({name: functools.partial(compile_and_say, name)
                              for name in args.variants.split(",")}, args.repeats)
    medians = harness.medians({name: [r["compile_sec"] for r in rs] for name, rs in runs.items()})
    print(f"\n| step ({config.system.topology}, {len(devices)} devices, batch "
          f"{config.training.global_batch_size}) | compile s (median) | / baseline | GFLOP per device | "
          "temporaries MiB |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        ratio = f"{medians[name] / medians['baseline']:.2f}x" if "baseline" in medians else "-"
        flops, memory = rs[-1]["flops_per_device"], rs[-1]["memory"] or {}
        print(f"| {name} | {medians[name]:.1f} | {ratio} | {flops / 1e9 if flops else float('nan'):,.0f} | "
              f"{memory.get('temp', 0) / 2**20:,.0f} |")
    harness.write_json(args.json_out, {
        "benchmark": "pod_compile", "config": args.config, "topology": config.system.topology,
        "num_devices": len(devices), "compile_sec_median": medians, "runs": runs,
        "environment": harness.environment()})


if __name__ == "__main__":
    main(sys.argv[1:])
