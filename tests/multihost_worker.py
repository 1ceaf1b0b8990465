"""One process of tests/job/test_distributed.py's runs: trains the tiny config, writes its final variables.

    python launch/local.py --num_processes=2 --cpu_devices_per_process=2 -- \
        python tests/multihost_worker.py --out=DIR
    python tests/multihost_worker.py --out=DIR --num_cpu_devices=4 --same_batches_as_processes=2

Joins a multi-process job through `resnet_scaling.job.distributed.maybe_initialize` (the launcher's
environment), trains with the arrays source unshuffled, and writes DIR/variables_<process>.npz.

Why `--same_batches_as_processes`: `ArraySource` gives each of P processes a contiguous share of the
training rows and each process fills its devices' part of the global batch from its own share, in order.
With P = 2, 64 rows and a global batch of 16, step s trains on rows [8s, 8s+8) + [32+8s, 32+8s+8), not
[16s, 16s+16). A 1-process run sees those same global batches, in the same order, when its arrays are
reordered share by share, which is what the flag does.
"""

import argparse
import contextlib
import logging
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from resnet_scaling.job import distributed
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config, xla_default_optimizations  # noqa: E402

NUM_TRAIN, GLOBAL_BATCH = 64, 16


def reorder_like_processes(images: np.ndarray, labels: np.ndarray, num_processes: int, global_batch: int):
    """Rows in the order a `num_processes` job's global batches visit them (unshuffled ArraySource)."""
    local = global_batch // num_processes
    shares = np.array_split(np.arange(len(labels)), num_processes)  # == process_share for equal shares
    steps = len(shares[0]) // local
    order = np.concatenate([share[s * local:(s + 1) * local] for s in range(steps) for share in shares])
    return images[order], labels[order]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--num_cpu_devices", type=int, default=0, help="Devices of a 1-process run.")
    parser.add_argument("--same_batches_as_processes", type=int, default=1)
    parser.add_argument("--num_train_steps", type=int, default=3)
    parser.add_argument("--xla_optimizations", choices=["off", "default"], default="off",
                        help="off: compile fast (tiny programs); default: XLA's default optimisations, as "
                             "real runs compile (tests.helpers.xla_default_optimizations).")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    jax.config.update("jax_platforms", "cpu")
    if args.num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    jax.config.update("jax_disable_most_optimizations", True)  # tiny programs: compile fast
    distributed.maybe_initialize(initialization_timeout_sec=120)

    config = tiny_config(data__shuffle=False, training__global_batch_size=GLOBAL_BATCH,
                         training__num_train_steps=args.num_train_steps, eval__global_batch_size=16)
    if "checkpoint" in config:
        config.checkpoint.enabled = False
    train_x, train_y, eval_x, eval_y = random_arrays(num_train=NUM_TRAIN, num_eval=16)
    if jax.process_count() == 1 and args.same_batches_as_processes > 1:
        train_x, train_y = reorder_like_processes(train_x, train_y, args.same_batches_as_processes,
                                                  GLOBAL_BATCH)
    index = jax.process_index()
    with xla_default_optimizations() if args.xla_optimizations == "default" else contextlib.nullcontext():
        result = trainer.train_and_evaluate(config, os.path.join(args.out, f"workdir_{index}"),
                                            arrays=(train_x, train_y, eval_x, eval_y))
    variables = {"params": result.state.params, "batch_stats": result.state.batch_stats}
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(variables)}
    np.savez(os.path.join(args.out, f"variables_{index}.npz"), **flat)
    print(f"DONE process {index} of {jax.process_count()}, {jax.device_count()} devices, "
          f"step {int(result.state.step)}, loss {result.train_history[-1]['loss']:.6f}", flush=True)


if __name__ == "__main__":
    main()
