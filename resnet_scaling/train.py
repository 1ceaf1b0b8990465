"""Entry point: `python -m resnet_scaling.train --config=configs/demo.py --workdir=/tmp/demo`.

Override any config field on the command line: `--config.training.global_batch_size=256`.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling import trainer

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, summaries and checkpoints.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.INFO)
    config = _CONFIG.value
    try:
        config_lib.validate(config)
    except config_lib.ConfigError as e:
        raise app.UsageError(str(e)) from None
    logging.info("Config:\n%s", config)
    trainer.train_and_evaluate(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
