"""What a run shows on the console: our progress lines, other libraries' warnings, and a closing headline.

The library logs through `logging.getLogger("resnet_scaling.<module>")`. Command-line entry points call
`configure_command_line_logging()` after absl has parsed the flags: our lines at INFO, every other
library's (orbax writes a dozen INFO lines per checkpoint) at WARNING, unless `--verbosity` is given.
Research code that calls `train_and_evaluate` without configuring logging still sees progress
(`show_progress()`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

LIBRARY_LOGGER = "resnet_scaling"


def configure_command_line_logging() -> None:
    """Our progress at INFO, other libraries at WARNING, unless absl's `--verbosity` asks for more
    (`--verbosity=0` shows every library's INFO lines, `--verbosity=1` their debug lines too)."""
    from absl import flags
    from absl import logging as absl_logging

    if flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(flags.FLAGS.verbosity)
        logging.getLogger(LIBRARY_LOGGER).setLevel(min(logging.INFO, logging.root.level))
        return
    absl_logging.set_verbosity(absl_logging.WARNING)  # The root logger: every other library.
    logging.getLogger(LIBRARY_LOGGER).setLevel(logging.INFO)


def show_progress() -> None:
    """Makes our INFO lines visible to code that set nothing up (a notebook, a script): our logger goes to
    INFO unless its level was set (`logging.getLogger("resnet_scaling").setLevel(logging.WARNING)`
    silences it), and gets a handler of its own only when no handler would receive its lines."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        logger.addHandler(handler)


def headline(summary: Mapping[str, Any], paths: Mapping[str, str]) -> list[str]:
    """The few lines that end a run: accuracy, throughput, time to the target, and where things are.

    Args:
      summary: the run's summary (`metrics.summary` schema).
      paths: name -> path of what the run wrote (summary, TensorBoard, checkpoints, export).
    """
    run, accuracy, throughput, time = (summary[k] for k in ("run", "accuracy", "throughput", "time"))
    status = " (preempted: run the same command to resume)" if run["preempted"] else ""
    images_per_sec = throughput["images_per_sec"]
    if images_per_sec:
        speed = (f"{images_per_sec:,.0f} images/sec in the steady state "
                 f"({throughput['images_per_sec_per_device']:,.0f} per device)")
    else:
        speed = "not measured (the run ended inside its timing warm-up)"
    target = f"time to {_percent(accuracy['target_top1'])} top-1: "
    if accuracy["reached"]:
        target += (f"{_duration(accuracy['time_to_accuracy_sec'])} timed, "
                   f"{_duration(accuracy['mlperf_time_to_accuracy_sec'])} wall, at epoch "
                   f"{accuracy['epochs_to_accuracy']:.2f}")
    else:
        target += "not reached"
    lines = [
        f"Done: step {run['final_step']} of {run['total_steps']}{status}; compile "
        f"{_duration(time['compile_sec'])}, training loop {_duration(time['wall_sec'])}.",
        f"  top-1: final {_percent(accuracy['final_eval_top1'])}, "
        f"best {_percent(accuracy['best_eval_top1'])}",
        f"  throughput: {speed}",
        f"  {target}",
    ]
    goodput = summary.get("goodput") or {}
    if goodput.get("goodput") is not None:
        causes = {k[:-len("_sec")].replace("_", " "): v for k, v in goodput.items()
                  if k.endswith("_sec") and k not in ("total_wall_sec", "productive_sec") and v}
        largest = sorted(causes.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  goodput: {_percent(goodput['goodput'])} of {_duration(goodput['total_wall_sec'])} "
                     f"over {goodput['launches']} launch(es); badput: "
                     + ", ".join(f"{name} {_duration(sec)}" for name, sec in largest))
    lines += [f"  {name}: {path}" for name, path in paths.items()]
    return lines


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _duration(seconds: float | None) -> str:
    from resnet_scaling.metrics.writers import format_duration

    return "n/a" if seconds is None else format_duration(seconds)
