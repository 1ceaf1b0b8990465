"""Evaluation only: `python -m resnet_scaling.evaluate --workdir=DIR [--weights=export|best] [--split=SPLIT]`.

Loads a run's final (`export/`) or best (its best evaluation's checkpoint) parameters with its own config,
makes one exact pass over its evaluation split and writes `WORKDIR/eval_<weights>_<split>.json`
(`evaluation.evaluate_workdir` from Python). For a moved dataset: `--override=data.data_dir=/mnt/tfds`.

The package imports `inference/evaluation.py`, never this module: runpy warns if `python -m` finds it
imported. JAX and the evaluation code load once the command line is read: `--help` and a usage mistake
answer in a fraction of a second.
"""

from __future__ import annotations

from resnet_scaling.job import native_noise, stopping

if __name__ == "__main__":  # First: a Ctrl-C or SIGTERM during the imports (seconds) ends in one line.
    stopping.StopSignals.install(safe="nothing was written; rerun the same command to evaluate")

from resnet_scaling import config as config_lib
from resnet_scaling.job import workdir

# Flags only when run as the command: importing must not add ones that clash (train.py has `--workdir`).


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "The run's workdir (holding export/ or evaluated checkpoints).",
                        required=True)
    flags.DEFINE_enum("weights", "export", workdir.WEIGHTS,
                      "The final (export) or the best evaluation's parameters.")
    flags.DEFINE_string("split", None, "A TFDS split to evaluate instead of config.data.eval_split.")
    flags.DEFINE_multi_string("override", [], "FIELD=VALUE for a data.* or eval.* field of the run's config, "
                              "e.g. data.data_dir=/mnt/tfds (a moved dataset); repeatable.")
    flags.DEFINE_bool("keep_freed_memory", True, "On the CPU: run the evaluation step on the main thread and "
                      "have glibc keep the memory a step frees for the next, as training does "
                      "(job/memory.py). No effect on accelerators.")


def main(argv: list[str]) -> None:
    """The command: evaluates, prints the figures and writes the JSON; errors end as one `error:` line."""
    from absl import flags

    from resnet_scaling.config import command_line
    from resnet_scaling.job import console

    command_line.refuse_arguments(argv)
    console.configure_command_line_logging()  # Our lines; other libraries' (orbax's) only as warnings.
    options = flags.FLAGS
    overrides = {}
    for item in options.override:
        field, value = config_lib.parse_override(item)
        if value is None:
            raise SystemExit(f"error: --override takes FIELD=VALUE (e.g. data.data_dir=/mnt/tfds), got "
                             f"{item!r}.")
        overrides[field] = value
    native_noise.import_jax_quietly()  # Before the imports below load JAX.
    import jax

    from resnet_scaling import data as data_lib
    from resnet_scaling.inference.evaluation import evaluate_workdir, format_result
    from resnet_scaling.job import process_setup

    process_setup.start_process(keep_freed_memory=options.keep_freed_memory)  # As train.py does.
    try:
        with stopping.phase(f"evaluating the {options.weights} weights"):
            result = evaluate_workdir(options.workdir, options.weights, options.split, overrides=overrides)
    except (FileNotFoundError, config_lib.ConfigError, data_lib.DataError) as e:
        # No export/best, an arrays run, a split or override that does not apply, a missing dataset.
        raise SystemExit(f"error: {e}") from None
    if jax.process_index() == 0:
        print(format_result(result))
        print(f"Written to {result['path']}.")


if __name__ == "__main__":
    from absl import app

    from resnet_scaling.config import command_line

    _define_flags()
    app.run(main, flags_parser=command_line.parse_flags)
