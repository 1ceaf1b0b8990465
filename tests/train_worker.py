"""A training process for tests that need real processes: kills, preemption, several hosts.

python tests/train_worker.py --workdir=DIR --overrides='{"training__num_train_steps": 8}'
    [--num_cpu_devices=2 --num_processes=2 --process_id=0 --coordinator=127.0.0.1:PORT]
    [--peer_timeout_sec=10] [--num_eval=17 --record_eval=DIR]
    [--hold_at_step=6 --hold_dir=DIR]
"""

import argparse
import functools
import json
import logging
import os
import pathlib
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from resnet_scaling import checkpointing
from resnet_scaling.job import distributed, mesh
from resnet_scaling.training import trainer, training_setup
from tests.helpers import random_arrays, tiny_config  # noqa: E402


def worker_arrays(num_eval: int = 20, stamp_ids: bool = False):
    """The worker's (train images, train labels, eval images, eval labels); with `stamp_ids`, evaluation
    image i carries i in its first pixel's red value, so that what a process feeds can be told apart."""
    train_x, train_y, eval_x, eval_y = random_arrays(num_train=96, num_eval=num_eval)
    if stamp_ids:
        assert num_eval <= 256, "an id must fit in one uint8"
        eval_x[:, 0, 0, 0] = np.arange(num_eval)
    return train_x, train_y, eval_x, eval_y


def record_evaluations(path: pathlib.Path) -> None:
    """Appends one JSON line per evaluation to `path`: the train step, the ids of the images this process
    fed unmasked, how many padding rows it fed, and the metrics the evaluation returned."""
    fed, padding = [], [0]
    to_global = mesh.host_local_to_global  # What every source builds a global batch with.

    def recording_to_global(batch, m):
        if "mask" in batch:  # Evaluation batches only: training batches have no mask.
            mask = np.asarray(batch["mask"])
            fed.extend(int(i) for i in np.asarray(batch["images"])[mask, 0, 0, 0])
            padding[0] += int((~mask).sum())
        return to_global(batch, m)

    real_evaluate = trainer.evaluate

    def recording_evaluate(eval_step_fn, state, source, **options):
        fed.clear()
        padding[0] = 0
        metrics = real_evaluate(eval_step_fn, state, source, **options)
        record = {"step": int(state.step), "ids": fed, "padding": padding[0], **metrics}
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")
        return metrics

    mesh.host_local_to_global = recording_to_global
    trainer.evaluate = recording_evaluate


class _HoldingStep:
    """The compiled train step, which before its first dispatch after a step >= `step_at_least` is done
    writes HOLD_DIR/held-<process> (holding that step) and waits until HOLD_DIR/release-<process> exists;
    everything else (the cost analyses the trainer logs) is the compiled step's."""

    def __init__(self, compiled, step_at_least: int, hold_dir: pathlib.Path):
        self._compiled, self._step_at_least, self._hold_dir = compiled, step_at_least, hold_dir
        self._held = False

    def __call__(self, state, batch):
        if not self._held and (done := int(state.step)) >= self._step_at_least:  # Waits for that step.
            self._held = True
            index = jax.process_index()
            marker = self._hold_dir / f"held-{index}"
            marker.with_suffix(".tmp").write_text(str(done))
            marker.with_suffix(".tmp").rename(marker)  # Never seen half written.
            while not (self._hold_dir / f"release-{index}").exists():
                time.sleep(0.05)
        return self._compiled(state, batch)

    def __getattr__(self, name):
        return getattr(self._compiled, name)


def hold_at(step_at_least: int, hold_dir: pathlib.Path) -> None:
    """Holds the run once step `step_at_least` is done, before the next starts (`_HoldingStep`): a test
    sends its signal at a known step, however late it reads the log. Background work (asynchronous saves)
    goes on meanwhile."""
    compile_train_step = training_setup.TrainingSetup.compile_train_step

    def compile_holding_step(self, *args, **kwargs):
        compiled, seconds = compile_train_step(self, *args, **kwargs)
        return _HoldingStep(compiled, step_at_least, hold_dir), seconds

    training_setup.TrainingSetup.compile_train_step = compile_holding_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--overrides", default="{}", help="JSON of tiny_config keyword overrides.")
    parser.add_argument("--num_cpu_devices", type=int, default=1)
    parser.add_argument("--num_processes", type=int, default=1)
    parser.add_argument("--process_id", type=int, default=0)
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--peer_timeout_sec", type=float, default=None,
                        help="Join through resnet_scaling.job.distributed, as train.py does, with its peer "
                             "watchdog and this timeout, and fail as train.py does (default: plain "
                             "jax.distributed.initialize).")
    parser.add_argument("--num_eval", type=int, default=20, help="Evaluation images.")
    parser.add_argument("--record_eval", default="",
                        help="Directory: stamp ids into the evaluation images and record, in "
                             "eval-<process>.jsonl, which ones each evaluation of this process fed.")
    parser.add_argument("--hold_at_step", type=int, default=0, help="See `hold_at` (0: never).")
    parser.add_argument("--hold_dir", default="")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    jax.config.update("jax_disable_most_optimizations", True)  # Tiny programs: compile fast.
    job = None
    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if args.peer_timeout_sec is not None:
            job = distributed.maybe_initialize(
                args.coordinator, args.num_processes, args.process_id, initialization_timeout_sec=60,
                peer_timeout_sec=args.peer_timeout_sec,
                complete_checkpoints=functools.partial(checkpointing.complete_steps, args.workdir))
        else:
            jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                       initialization_timeout=60)
    if args.record_eval:
        record_evaluations(pathlib.Path(args.record_eval) / f"eval-{jax.process_index()}.jsonl")
    if args.hold_at_step:
        hold_at(args.hold_at_step, pathlib.Path(args.hold_dir))
    config = tiny_config(**json.loads(args.overrides))
    arrays = worker_arrays(args.num_eval, stamp_ids=bool(args.record_eval))
    try:
        result = trainer.train_and_evaluate(config, args.workdir, arrays=arrays)
    except Exception:
        distributed.blame_a_lost_peer(job)  # As train.py does: a dead peer named in one line, if one is.
        raise
    print(f"DONE start_step={result.start_step} step={int(result.state.step)} "
          f"preempted={result.preempted}", flush=True)


if __name__ == "__main__":
    main()
