"""What a run's start pays for TensorFlow: its import with and without Keras, and a TensorBoard event file.

  python benchmarks/startup.py [--repeats=5] [--json_out=benchmarks/results/startup.json]

Each variant runs in a fresh process that has first imported what a run imports before TensorFlow (JAX,
Flax, optax, orbax); the figure is the seconds of the variant's own block, timed in the child:

- `import tensorflow`: TensorFlow's own import, which imports all of Keras 3 (pandas, matplotlib with it);
- `tf_import.import_tensorflow_for_host()`: the library's, without Keras (what runs on images pay);
- TensorBoard through `tf.summary` (what clu's writer used): TensorFlow's import, a file writer, one scalar;
- the library's `TensorBoardWriter`: TensorBoard's protos and record framing, the config text, one scalar
  (what runs on arrays or synthetic data pay now, instead of the line above).

Variants alternate within each repeat; prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]

_PRELUDE = """
import json, sys, tempfile, time
import jax, flax, optax, orbax.checkpoint
folder = tempfile.mkdtemp()
start = time.perf_counter()
"""
VARIANTS = {
    "import tensorflow (with Keras)": "import tensorflow\n",
    "tf_import.import_tensorflow_for_host() (without Keras)":
        "from resnet_scaling.job import tf_import\ntf_import.import_tensorflow_for_host()\n",
    "TensorBoard through tf.summary":
        "import tensorflow as tf\n"
        "writer = tf.summary.create_file_writer(folder)\n"
        "with writer.as_default():\n"
        "    tf.summary.scalar('train/loss', 1.0, step=1)\n"
        "writer.close()\n",
    "TensorBoardWriter (no TensorFlow)":
        "from resnet_scaling.metrics import writers\n"
        "writer = writers.TensorBoardWriter(folder, 'model: resnet50')\n"
        "writer.write(1, {'loss': 1.0})\n"
        "writer.close()\n"
        "assert 'tensorflow' not in sys.modules\n",
}
_EPILOGUE = 'print(json.dumps({"seconds": time.perf_counter() - start}))\n'


def block_seconds(block: str) -> float:
    """Seconds of `block` in a fresh process, after the prelude's imports."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"}
    return harness.run_child_json(_PRELUDE + block + _EPILOGUE, [], env, cwd=REPO)["seconds"]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_flags(p, repeats=5, json_out=str(REPO / "benchmarks" / "results" / "startup.json"))
    args = p.parse_args(argv)
    runs = harness.alternate({name: (lambda b=block: block_seconds(b)) for name, block in VARIANTS.items()},
                             args.repeats)
    medians = harness.medians(runs)
    baseline = next(iter(VARIANTS))
    print(harness.markdown_table(
        ["variant", "seconds (median)", f"/ {baseline}"],
        [[name, f"{medians[name]:.2f}", f"{harness.median_ratio(runs[name], runs[baseline]):.2f}"]
         for name in VARIANTS]))
    harness.write_json(args.json_out, {"benchmark": "startup", "environment": harness.environment(),
                                       "seconds": runs, "median_seconds": medians})


if __name__ == "__main__":
    main(sys.argv[1:])
