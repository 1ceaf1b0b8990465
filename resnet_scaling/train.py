"""Entry point: `python -m resnet_scaling.train --config=configs/demo.py --workdir=/tmp/demo`.

`--config`: a config file's path or a shipped config's name (`--config=demo`); override any field with
`--config.training.global_batch_size=256`. The console shows our progress, other libraries' warnings
(`--verbosity=0`: their INFO too) and a headline; the config goes to WORKDIR/config.json (`--print_config`
prints it and exits). Multi-process jobs (TPU pod slices, SLURM, launch/local.py) join up first.

JAX and the training code load once the command line is read: `--help`, `--print_config` and a usage
mistake answer in a fraction of a second, not the seconds those imports take.
"""

from __future__ import annotations

from resnet_scaling.job import stopping

if __name__ == "__main__":  # First: a Ctrl-C or SIGTERM during the imports (seconds) ends in one line.
    stopping.StopSignals.install(doing="starting")

import functools
import logging
import os
from typing import TYPE_CHECKING

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling.config import command_line
from resnet_scaling.config import text as config_text
from resnet_scaling.job import console, errors, native_noise, xla_flags
from resnet_scaling.job import workdir as workdir_lib

if TYPE_CHECKING:
    from resnet_scaling.job import distributed

logger = logging.getLogger("resnet_scaling.train")  # Not __name__: "__main__" under `python -m`.

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py) or the name of a shipped one: " +
    ", ".join(config_lib.shipped_config_names()) + ".", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, summaries and checkpoints "
                                "(required, except with --print_config).")
flags.mark_flags_as_required(["config"])
# Multi-process settings; unset, they come from the environment or the cluster (distributed.py).
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
_INIT_TIMEOUT = flags.DEFINE_integer(
    "initialization_timeout_sec", None,
    "Fail if the job's processes have not all connected by then (default: 300).")
_PEER_TIMEOUT = flags.DEFINE_float(
    "peer_timeout_sec", None, "Multi-process jobs: stop, naming the lost process, when another process has "
    "shown no sign of life for this long (default: $RESNET_SCALING_PEER_TIMEOUT_SEC or 60; 0 turns it off).")
_THROUGHPUT_FLAGS = flags.DEFINE_bool(
    "throughput_flags", True, "Add the XLA/libtpu flags of job/xla_flags.py for the detected backend.")
_KEEP_FREED_MEMORY = flags.DEFINE_bool(
    "keep_freed_memory", True, "Steps on the CPU: run them on the main thread and have glibc keep the memory "
    "a step frees for the next, instead of faulting it in again (1.3x the ResNet-50 step on 2 cores; "
    "job/memory.py). No effect on accelerators.")
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the config, overrides applied, as a config file with each field's comment "
    "(--config=FILE runs it), and exit without training (a run writes it to WORKDIR/config.json).")


def main(argv: list[str]) -> None:
    command_line.refuse_arguments(argv)
    if _PRINT_CONFIG.value:  # Before anything starts: no backend, no job, no workdir.
        config = command_line.read_config_flag(_CONFIG, log=False)
        print(config_text.format_config(config), end="", flush=True)
        return
    if not _WORKDIR.value:
        raise SystemExit("error: --workdir is required: the directory for the run's checkpoints, metrics and "
                         "logs (--print_config alone shows the config without one).")
    new_workdir = not workdir_lib.as_path(_WORKDIR.value).exists()
    log_file = console.configure_command_line_logging(_WORKDIR.value)
    with stopping.phase("starting JAX (and joining the job)"):
        native_noise.import_jax_quietly()  # Before the imports below load JAX.
        from resnet_scaling.job import distributed
        from resnet_scaling.training import trainer

        job = _start_process()
    config = command_line.read_config_flag(_CONFIG)
    if cache_dir := compilation_cache_dir(config, _WORKDIR.value):
        enable_compilation_cache(cache_dir)  # The trainer's "Compiled" line names it, once the run starts.
    try:
        refuse_a_config_for_more_devices(config)
        result = trainer.train_and_evaluate(config, _WORKDIR.value)  # Validates the config first, once.
    except errors.RunError as e:  # Bad config, data, workdir, checkpoints, divergence: say what to do.
        if new_workdir:  # A refused first launch leaves no empty workdir behind.
            workdir_lib.remove_refused_launch(_WORKDIR.value, log_file)
        console.exit_after_error(f"error: {e}")
    except Exception:  # A bug: its traceback, then the same bounded exit.
        distributed.blame_a_lost_peer(job)  # Where a dead process is the cause, one line that names it.
        logger.exception("The run failed:")
        console.exit_after_error("error: the run failed with the traceback above; the last complete "
                                 "checkpoint (if any) resumes with the same command.")
    if result.preempted:
        # Everything is saved and closed; do not wait for the input pipeline's threads to wind down
        # (tens of seconds with a large shuffle buffer) while a preempted VM's grace period runs out.
        distributed.leave(job)
        logging.shutdown()
        os._exit(stopping.STOPPED_EXIT_STATUS)


def _start_process() -> distributed.DistributedSettings | None:
    """The platform, XLA's flags and the job (`process_setup.start_process`), from the flags."""
    from resnet_scaling import checkpointing
    from resnet_scaling.job import process_setup

    return process_setup.start_process(
        throughput_flags=_THROUGHPUT_FLAGS.value, keep_freed_memory=_KEEP_FREED_MEMORY.value,
        coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        initialization_timeout_sec=_INIT_TIMEOUT.value,  # None: the default, which --help states.
        peer_timeout_sec=_PEER_TIMEOUT.value,
        complete_checkpoints=functools.partial(checkpointing.complete_steps, _WORKDIR.value))


def refuse_a_config_for_more_devices(config: ml_collections.ConfigDict) -> None:
    """`setup`'s refusal of a config written for more devices than the job has, made here, where the
    `--config` value its advice names (`compile --config=pod`) is known.

    Raises:
      ConfigError: `config.mesh.num_devices` exceeds the job's devices.
    """
    import jax

    devices = jax.devices()
    if config.mesh.num_devices > len(devices):
        value = config_lib.config_flag_value(config_flags.get_config_filename(flags.FLAGS["config"]))
        raise config_lib.too_few_devices_error(config, len(devices), devices[0].platform, config_arg=value)


def compilation_cache_dir(config: ml_collections.ConfigDict, workdir: str) -> str | None:
    """Where JAX keeps compiled programs for this run (`training.compilation_cache_dir`), or None (off)."""
    template = config.training.compilation_cache_dir
    if not template:
        return None
    return template.replace("{workdir}", workdir.rstrip("/"))


def enable_compilation_cache(cache_dir: str) -> None:
    """Turns on JAX's persistent compilation cache in `cache_dir` (before the first compilation)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    if xla_flags.detect_backend() != "gpu":
        # JAX points XLA's (GPU-only) autotuning cache into the cache dir, and that path enters every
        # program's cache key: a copied or moved workdir would never find its compiled programs.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")


if __name__ == "__main__":
    app.run(main, flags_parser=command_line.parse_config_flags)
