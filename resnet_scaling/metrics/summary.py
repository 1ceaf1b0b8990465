"""`summary.json`: the headline figures of a run and its config, written at the end of every run; the
headline, the lines on the console that end a run (`headline`).

Keys and types: `SUMMARY_SCHEMA`, plus `schema_version` and `config` (`config.to_dict()`). Figures are
plain numbers, null where unknown (no timed region, target not reached, no published peak). Meanings:

- `throughput`: steady state (after the warm-up; compile, evaluation and checkpoints off the clock);
  step-time percentiles over log intervals after the warm-up.
- `time`: `train_sec` is the whole training clock (warm-up included), `wall_sec` the loop's wall time.
- `accuracy`: `time_to_accuracy_sec` on the case study's timed region; `mlperf_time_to_accuracy_sec` on the
  loop's wall clock over every launch (`mlperf.time_to_train_sec`: MLPerf's own, from its log).
- `goodput` (`metrics/goodput.py`): over every launch; `goodput` is `productive_sec / total_wall_sec`,
  the `*_sec` besides them badput by cause.
- `mlperf` (`metrics/mlperf_log.py`): this launch's WORKDIR/mlperf_log.txt on the log's own clock;
  `time_to_train_sec` is run_start to the first evaluation at or above `target_top1` (MLPerf mode's
  run_stop; null if none or the launch resumed), `epochs_to_target` that evaluation's `epoch_num`.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from typing import Any

from etils import epath

from resnet_scaling.job import workdir as workdir_lib
from resnet_scaling.job.console import format_duration

SUMMARY_SCHEMA_VERSION = 3  # 2: the goodput section; 3: the mlperf section.
SUMMARY_FILENAME = "summary.json"

# Each section's keys and the JSON types a value may take (None: null); read-only, so no caller changes it.
_NUM = (int, float)
_SCHEMA = {
    "run": {"devices": (int,), "device_kind": (str,), "platform": (str,), "process_count": (int,),
            "global_batch_size": (int,), "per_device_batch_size": (int,), "steps_per_epoch": (int,),
            "start_step": (int,), "final_step": (int,), "total_steps": (int,),
            "timing_warmup_steps": (int,), "preempted": (bool,)},
    "throughput": {"images_per_sec": (*_NUM, None), "images_per_sec_per_device": (*_NUM, None),
                   "steady_state_steps": (int,), "steady_state_sec": _NUM,
                   "step_time_sec_p50": (*_NUM, None), "step_time_sec_p90": (*_NUM, None),
                   "step_time_sec_p99": (*_NUM, None), "input_wait_fraction": (*_NUM, None)},
    "time": {"compile_sec": _NUM, "train_sec": _NUM, "eval_sec": _NUM, "checkpoint_sec": _NUM,
             "wall_sec": _NUM},
    "accuracy": {"target_top1": _NUM, "reached": (bool,), "time_to_accuracy_sec": (*_NUM, None),
                 "mlperf_time_to_accuracy_sec": (*_NUM, None), "epochs_to_accuracy": (*_NUM, None),
                 "steps_to_accuracy": (int, None), "final_eval_top1": (*_NUM, None),
                 "best_eval_top1": (*_NUM, None), "num_evals": (int,)},
    "utilisation": {"flops_per_step": (*_NUM, None), "flops_per_step_per_device": (*_NUM, None),
                    "tflops_per_sec_per_device": (*_NUM, None), "peak_tflops_per_device": (*_NUM, None),
                    "mfu": (*_NUM, None)},
    "goodput": {"total_wall_sec": (*_NUM, None), "productive_sec": (*_NUM, None), "goodput": (*_NUM, None),
                "launches": (int, None), "recomputed_steps": (int, None),
                **{f"{cause}_sec": (*_NUM, None) for cause in (
                    "initialization", "compilation", "input_wait", "evaluation", "checkpointing",
                    "recomputed_steps", "restart_gaps", "other")}},
    "mlperf": {"mode": (str, None), "log_file": (str, None), "target_top1": (*_NUM, None),
               "status": (str, None), "time_to_train_sec": (*_NUM, None), "epochs_to_target": (*_NUM, None),
               "run_sec": (*_NUM, None), "init_sec": (*_NUM, None), "resumed": (bool, None)},
}
SUMMARY_SCHEMA: Mapping[str, Mapping[str, tuple[type | None, ...]]] = types.MappingProxyType(
    {name: types.MappingProxyType(keys) for name, keys in _SCHEMA.items()})
del _SCHEMA


def build_summary(*, run: Mapping[str, Any], throughput: Mapping[str, Any], time: Mapping[str, Any],
                  accuracy: Mapping[str, Any], utilisation: Mapping[str, Any],
                  config: Mapping[str, Any], goodput: Mapping[str, Any] | None = None,
                  mlperf: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assembles a summary from its sections, keeping only the schema's keys (so it cannot drift).

    `goodput` and `mlperf` may be left out (no launch history or MLPerf log: fixtures, other tools): null.

    Raises:
      KeyError: if a section lacks a key of the schema.
    """
    sections = {"run": run, "throughput": throughput, "time": time, "accuracy": accuracy,
                "utilisation": utilisation,
                "goodput": goodput if goodput is not None else dict.fromkeys(SUMMARY_SCHEMA["goodput"]),
                "mlperf": mlperf if mlperf is not None else dict.fromkeys(SUMMARY_SCHEMA["mlperf"])}
    summary: dict[str, Any] = {"schema_version": SUMMARY_SCHEMA_VERSION}
    for name, keys in SUMMARY_SCHEMA.items():
        summary[name] = {key: sections[name][key] for key in keys}
    summary["config"] = dict(config)
    return summary


def check_summary(summary: Mapping[str, Any]) -> list[str]:
    """Differences between `summary` and the schema (missing or extra keys, wrong types); [] if none."""
    problems = []
    if summary.get("schema_version") != SUMMARY_SCHEMA_VERSION:
        problems.append(f"schema_version {summary.get('schema_version')!r} != {SUMMARY_SCHEMA_VERSION}")
    expected_top = {"schema_version", "config", *SUMMARY_SCHEMA}
    problems += [f"unexpected section {k!r}" for k in sorted(set(summary) - expected_top)]
    if not isinstance(summary.get("config"), dict):
        problems.append("config is not an object")
    for name, keys in SUMMARY_SCHEMA.items():
        section = summary.get(name)
        if not isinstance(section, dict):
            problems.append(f"section {name!r} missing")
            continue
        problems += [f"{name}.{k}: unexpected" for k in sorted(set(section) - set(keys))]
        for key, allowed in keys.items():
            if key not in section:
                problems.append(f"{name}.{key}: missing")
                continue
            value = section[key]
            # bool is an int subclass in Python: True must not pass as a count.
            ok = (value is None and None in allowed) or any(
                t is not None and isinstance(value, t) and not (isinstance(value, bool) and t is not bool)
                for t in allowed)
            if not ok:
                problems.append(f"{name}.{key}: {value!r} is not {allowed}")
    return problems


def write_summary(workdir: str, summary: Mapping[str, Any]) -> str:
    """Writes `WORKDIR/summary.json` (the caller decides who writes: process 0) and returns its path."""
    path = workdir_lib.as_path(workdir) / SUMMARY_FILENAME
    # default=str: config values such as tuples' odd types.
    workdir_lib.write_text_atomically(path, json.dumps(summary, indent=2, default=str) + "\n")
    return str(path)


def read_summary(path: str) -> dict[str, Any]:
    """Loads a `summary.json` (a file or a workdir holding one)."""
    path = epath.Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILENAME
    return json.loads(path.read_text())


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
        speed = "not measured (the run ended before its timed steps: training.timing_warmup_*)"
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
    return "n/a" if seconds is None else format_duration(seconds)
