"""The CPU forms of ResNet-50's strided convolutions against XLA's own, one layer at a time.

For each strided convolution of ResNet-50 (the 7x7 stem and the 3x3 of stages 2-4's first blocks), at
`--batch_size`, times the gradient of <conv(x, w), g> in both forms: `cpu_lowering.patch_grad_conv` (the
weight gradient as one product over the input's patches) and `lax.conv_general_dilated` differentiated by
JAX (XLA:CPU writes the weight gradient as a convolution dilated by the stride). The stem's gradient is
taken for the weights only, as in training, where the image gets none. The forms alternate, a block of
`--calls` calls each per repeat; a ratio is the median over repeats of XLA's time over the patch form's.
Prints a table and writes JSON.

    python benchmarks/cpu_lowering.py --batch_size=16 --repeats=5 --calls=5
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

from resnet_scaling.job import memory as host_memory
from resnet_scaling.models import cpu_lowering

# name, input size, input channels, output channels, kernel, stride, padding, weights only
LAYERS = (
    ("stem_conv 7x7/2", 224, 3, 64, 7, 2, 3, True),
    ("stage2_block1/conv2 3x3/2", 56, 128, 128, 3, 2, 1, False),
    ("stage3_block1/conv2 3x3/2", 28, 256, 256, 3, 2, 1, False),
    ("stage4_block1/conv2 3x3/2", 14, 512, 512, 3, 2, 1, False),
)


def xla_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding) -> jax.Array:
    """The convolution as `nn.Conv` writes it."""
    return jax.lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def gradient_fn(conv, strides, padding, weights_only: bool):
    """jit of the gradient of <conv(x, w), g> with respect to w (and x unless `weights_only`)."""
    argnums = 1 if weights_only else (0, 1)
    return jax.jit(jax.grad(lambda x, w, g: jnp.vdot(conv(x, w, strides, padding), g), argnums=argnums))


def seconds(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _block_median(fn, operands: tuple, calls: int) -> float:
    """The median time of `calls` calls in a row of `fn(*operands)`."""
    return statistics.median(seconds(fn, *operands) for _ in range(calls))


def run(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(0)
    rows = []
    for name, size, cin, cout, kernel, stride, pad, weights_only in LAYERS:
        out = (size + 2 * pad - kernel) // stride + 1
        x = jnp.asarray(rng.standard_normal((args.batch_size, size, size, cin), np.float32))
        w = jnp.asarray(rng.standard_normal((kernel, kernel, cin, cout), np.float32))
        g = jnp.asarray(rng.standard_normal((args.batch_size, out, out, cout), np.float32))
        strides, padding = (stride, stride), ((pad, pad), (pad, pad))
        forms = {"patch": gradient_fn(cpu_lowering.patch_grad_conv, strides, padding, weights_only),
                 "xla": gradient_fn(xla_conv, strides, padding, weights_only)}
        patch_dw, xla_dw = (jax.tree.leaves(f(x, w, g))[-1] for f in forms.values())  # Also the warm-up.
        error = float(jnp.max(jnp.abs(patch_dw - xla_dw)) / jnp.max(jnp.abs(xla_dw)))
        # A block of calls per form, its median: the first calls after the other form ran are slower (its
        # temporaries land where the other's were), which a step never sees.
        times = harness.alternate(
            {form: functools.partial(_block_median, fn, (x, w, g), args.calls) for form, fn in forms.items()},
            args.repeats)
        gflop = 2 * args.batch_size * out * out * kernel * kernel * cin * cout / 1e9
        rows.append({"layer": name, "input": [args.batch_size, size, size, cin],
                     "kernel": [kernel, kernel, cin, cout],
                     "weights_only": weights_only, "weight_grad_gflop": gflop,
                     "ms_median": {form: 1e3 * statistics.median(t) for form, t in times.items()},
                     "ms_repeats": {form: [1e3 * s for s in t] for form, t in times.items()},
                     "xla_over_patch": harness.median_ratio(times["xla"], times["patch"]),
                     "max_relative_difference": error})
    return {"benchmark": "cpu_lowering", "config": vars(args), "layers": rows,
            "environment": harness.environment(device_kind=jax.devices()[0].device_kind)}


def print_table(result: dict) -> None:
    print("| layer | input | weight-gradient GFLOP | XLA ms | patch form ms | XLA / patch |")
    print("|---|---|---|---|---|---|")
    for r in result["layers"]:
        ms = r["ms_median"]
        layer = r["layer"] + (" (weights only)" if r["weights_only"] else "")
        shape = "x".join(map(str, r["input"]))
        print(f"| {layer} | {shape} | {r['weight_grad_gflop']:.2f} | {ms['xla']:.1f} | {ms['patch']:.1f} "
              f"| {r['xla_over_patch']:.2f}x |")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--calls", type=int, default=5, help="Calls of one form in a row per repeat.")
    harness.add_flags(p, repeats=5, json_out="benchmarks/results/cpu_lowering.json")
    args = p.parse_args(argv)
    # As the training entry point runs CPU steps: on the main thread, freed memory kept for the next. The
    # dispatch setting is read when the backend starts, so it comes first (after it, the layers timed
    # 39-95 ms for the same stem gradient from run to run).
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if jax.default_backend() != "cpu":
        raise SystemExit(f"cpu_lowering.py times CPU forms; JAX's backend here is {jax.default_backend()}.")
    host_memory.keep_freed_memory()
    result = run(args)
    print_table(result)
    harness.write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
