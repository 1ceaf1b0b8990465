"""A training process for tests that need real processes: kills, preemption, several hosts.

python tests/train_worker.py --workdir=DIR --overrides='{"training__num_train_steps": 8}'
    [--num_cpu_devices=2 --num_processes=2 --process_id=0 --coordinator=127.0.0.1:PORT]
    [--peer_timeout_sec=10]
"""

import argparse
import json
import logging
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from resnet_scaling import checkpointing, distributed, trainer  # noqa: E402
from tests.helpers import random_arrays, tiny_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--overrides", default="{}", help="JSON of tiny_config keyword overrides.")
    parser.add_argument("--num_cpu_devices", type=int, default=1)
    parser.add_argument("--num_processes", type=int, default=1)
    parser.add_argument("--process_id", type=int, default=0)
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--best_every_eval", action="store_true",
                        help="Save best/ at every evaluation: makes best and regular saves coincide.")
    parser.add_argument("--peer_timeout_sec", type=float, default=None,
                        help="Join through resnet_scaling.distributed, as train.py does, with its peer "
                             "watchdog and this timeout (default: plain jax.distributed.initialize).")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    jax.config.update("jax_disable_most_optimizations", True)  # Tiny programs: compile fast.
    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if args.peer_timeout_sec is not None:
            distributed.maybe_initialize(args.coordinator, args.num_processes, args.process_id,
                                         initialization_timeout_sec=60,
                                         peer_timeout_sec=args.peer_timeout_sec)
        else:
            jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                       initialization_timeout=60)
    if args.best_every_eval:
        save_best = checkpointing.Checkpointer.save_best

        def save_every_eval(self, *a, **k):
            self._best_top1 = float("-inf")
            return save_best(self, *a, **k)

        checkpointing.Checkpointer.save_best = save_every_eval
    config = tiny_config(**json.loads(args.overrides))
    result = trainer.train_and_evaluate(config, args.workdir, arrays=random_arrays(num_train=96))
    print(f"DONE start_step={result.start_step} step={int(result.state.step)} "
          f"preempted={result.preempted}", flush=True)


if __name__ == "__main__":
    main()
