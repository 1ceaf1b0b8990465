"""The planner against published results it was not fitted to: each prediction beside the published time.

  python benchmarks/planner_checks.py          # compiles the reports results/compile/ lacks (minutes each)
  python benchmarks/planner_checks.py --extract_from PATH/training_results_v0.6 PATH/..._v0.7 PATH/..._v1.0

The published results (`published_results.json`, beside this file) are MLPerf submissions' own logs, read
by `parse_mlperf_result`: run_start to run_stop (MLPerf's clock: training and evaluation, no
initialisation), the epoch of the evaluation that reached the target, the global batch and BN span. For
each system the benchmark compiles this library's ResNet-50 step with the submission's topology, batch and
BN span (`compile_args`: the pod config with those fields overridden), and the planner predicts, with the
one TPU factor from the case study's pod (its own compile report):

- **seconds per epoch on MLPerf's clock** (training and its share of evaluation): the hardware model alone,
  published = the run's time over its epochs;
- **time to the target**: published = MLPerf's score for 5 runs (the mean without the fastest and slowest),
  predicted with MLPerf's reference epochs at that batch (the planner's own) and with the runs' own epochs.

The case study's pod appears only uncompensated: its compensated prediction is the factor's source, so it
agrees by construction. Nothing in this file or the planner is tuned to these results.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resnet_scaling.analysis import planning

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

PUBLISHED = Path(__file__).resolve().parent / "published_results.json"
_LINE_V06 = re.compile(r":::MLL (?P<ts>[0-9.]+) (?P<key>\w+): (?P<json>.*)")


def _entries(text: str) -> list[tuple[float, str, dict[str, Any]]]:
    """(seconds, key, {"value", "metadata"}) of each log line: v0.6's `:::MLL <time> <key>: <json>` or
    mllog's `:::MLLOG <json>` (v0.7 on)."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[len(":::MLLOG "):])
            entries.append((entry["time_ms"] / 1000, entry["key"], entry))
        elif match := _LINE_V06.match(line):
            entries.append((float(match["ts"]), match["key"], json.loads(match["json"])))
    return entries


def parse_mlperf_result(text: str) -> dict[str, Any]:
    """The figures of one MLPerf result file (either log format, `_entries`).

    Returns:
      run_sec (run_start to run_stop), epochs (epoch_num of the last evaluation), top1 (its accuracy),
      status, global_batch, bn_span, platform.

    Raises:
      ValueError: a file without run_start, run_stop or an evaluation.
    """
    first: dict[str, tuple[float, Any]] = {}
    evals = []
    for stamp, key, entry in _entries(text):
        if key == "eval_accuracy":
            evals.append((entry["metadata"]["epoch_num"], entry["value"]))
        first.setdefault(key, (stamp, entry))
    missing = [k for k in ("run_start", "run_stop", "global_batch_size") if k not in first]
    if missing or not evals:
        raise ValueError(f"not an MLPerf result: no {', '.join(missing) or 'eval_accuracy'}")
    return {"run_sec": first["run_stop"][0] - first["run_start"][0], "epochs": evals[-1][0],
            "top1": evals[-1][1], "status": first["run_stop"][1]["metadata"].get("status"),
            "global_batch": first["global_batch_size"][1]["value"],
            "bn_span": first.get("model_bn_span", (0, {"value": None}))[1]["value"],
            "platform": first.get("submission_platform", (0, {"value": None}))[1]["value"]}


def olympic_mean(values: Sequence[float]) -> float:
    """MLPerf's score over 5 runs: the mean without the fastest and the slowest."""
    ordered = sorted(values)
    return statistics.fmean(ordered[1:-1])


# Google's TPU submissions, by MLPerf round: results folder -> (device kind, chips, topology). A slice is
# named by its cores ("v3-32": 32 cores, 16 chips; "v4-128": 64 chips); v2 and v3 slices are 2-D tori of
# chips, v4 slices 3-D.
SUBMISSIONS = {
    "v0.6": {"tpu-v3-32": ("TPU v3", 16, "v3:4x4"), "tpu-v3-128": ("TPU v3", 64, "v3:8x8"),
             "tpu-v3-256": ("TPU v3", 128, "v3:8x16"), "tpu-v3-512": ("TPU v3", 256, "v3:16x16"),
             "tpu-v3-1024": ("TPU v3", 512, "v3:16x32"), "tpu-v3-2048": ("TPU v3", 1024, "v3:32x32")},
    "v0.7": {"tpu-v3-32-TF2.0": ("TPU v3", 16, "v3:4x4"), "tpu-v3-8192-JAX": ("TPU v3", 4096, "v3:64x64")},
    "v1.0": {"tpu-v4-128-TF": ("TPU v4", 64, "v4:4x4x4")},
}


def extract(repo: Path, mlperf_round: str) -> list[dict[str, Any]]:
    """The published_results.json entries from a clone of mlcommons/training_results_<round>."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    entries = []
    for platform, (kind, chips, topology) in SUBMISSIONS[mlperf_round].items():
        paths = [f"Google/results/{platform}/resnet/result_{i}.txt" for i in range(5)]
        runs = [parse_mlperf_result(subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{p}"],
                                                   capture_output=True, text=True, check=True).stdout)
                for p in paths]
        entries.append({
            "name": f"MLPerf {mlperf_round}, Google, {platform}", "clock": "mlperf", "device_kind": kind,
            "num_chips": chips, "topology": topology, "global_batch": runs[0]["global_batch"],
            "bn_span": runs[0]["bn_span"], "epochs": [r["epochs"] for r in runs],
            "minutes": [round(r["run_sec"] / 60, 3) for r in runs],
            "score_minutes": round(olympic_mean([r["run_sec"] / 60 for r in runs]), 3),
            "source": f"mlcommons/training_results_{mlperf_round} at {commit[:12]}: "
                      f"{paths[0][:-5]}[0-4].txt"})
    return entries


def compile_args(entry: Mapping[str, Any]) -> list[str]:
    """`python -m resnet_scaling.compile` flags for a published system: the pod config (ResNet-50,
    bfloat16, LARS) with the submission's topology (all its devices), batch and BN span."""
    batch = entry["global_batch"]
    return ["--config=pod", f"--config.system.topology={entry['topology']}",
            f"--config.system.device_kind={entry['device_kind']}", "--config.mesh.num_devices=-1",
            f"--config.training.global_batch_size={batch}", f"--config.eval.global_batch_size={batch}",
            f"--config.model.bn_group_size={entry['bn_span']}", f"--config.system.name={entry['name']}"]


def ensure_report(name: str, args: Sequence[str], reports_dir: Path) -> dict[str, Any]:
    """The compile report `reports_dir/NAME.json`, compiled first if it is not there."""
    path = reports_dir / f"{name}.json"
    if not path.is_file():
        print(f"Compiling {name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "resnet_scaling.compile", *args, f"--json_out={path}"],
                       check=True, stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def _error(predicted: float | None, published: float) -> float | None:
    return None if predicted is None else predicted / published - 1


def check(entry: Mapping[str, Any], report: Mapping[str, Any], factor: planning.Figure) -> dict[str, Any]:
    """One published result beside its predictions, uncompensated and compensated."""
    system = planning.system_from_report(report)
    prediction = planning.predict(system, factor)
    epochs = statistics.median(entry["epochs"])
    own = planning.predict(system, factor, epochs_override=planning.Figure(epochs, "published", "the runs'"))
    published_min = entry["score_minutes"]
    published_epoch_sec = statistics.median(m * 60 / e for m, e in zip(entry["minutes"], entry["epochs"],
                                                                          strict=True))
    out = {"name": entry["name"], "num_chips": entry["num_chips"], "global_batch": entry["global_batch"],
           "published_minutes": published_min, "published_epochs": epochs,
           "published_sec_per_epoch": published_epoch_sec, "rcp_epochs": prediction.mlperf.epochs.value,
           "source": entry["source"]}
    for label, pred, own_pred in (("uncompensated", prediction.mlperf, own.mlperf),
                                  ("compensated", prediction.compensated_mlperf, own.compensated_mlperf)):
        per_epoch = own_pred.total_sec / epochs if own_pred and own_pred.total_sec else None
        out[label] = {
            "sec_per_epoch": per_epoch, "sec_per_epoch_error": _error(per_epoch, published_epoch_sec),
            "minutes_rcp_epochs": pred.total_sec / 60 if pred and pred.total_sec else None,
            "minutes_rcp_epochs_error": _error(pred.total_sec / 60 if pred and pred.total_sec else None,
                                               published_min),
            "minutes_own_epochs": own_pred.total_sec / 60 if own_pred and own_pred.total_sec else None,
            "minutes_own_epochs_error": _error(own_pred.total_sec / 60 if own_pred and own_pred.total_sec
                                               else None, published_min)}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _num(x: float | None, fmt: str = "{:,.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def main(argv: list[str]) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reports_dir", default=str(Path(__file__).resolve().parent / "results" / "compile"),
                   help="Compile reports: read, or written when missing.")
    p.add_argument("--extract_from", nargs="*", default=[],
                   help="Clones of mlcommons/training_results_v0.6, _v0.7 and _v1.0 (the round read from "
                        "the path): "
                        f"rewrite {PUBLISHED.name} from their logs and stop.")
    harness.add_flags(p, repeats=1, json_out="benchmarks/results/planner_checks.json")
    args = p.parse_args(argv)
    if args.extract_from:
        entries = []
        for path in args.extract_from:
            mlperf_round = next((r for r in SUBMISSIONS if f"_{r}" in path), None)
            if mlperf_round is None:
                p.error(f"--extract_from {path}: name a clone of training_results_{'/'.join(SUBMISSIONS)}.")
            entries += extract(Path(path), mlperf_round)
        PUBLISHED.write_text(json.dumps(entries, indent=2) + "\n")
        print(f"Wrote {PUBLISHED} ({len(entries)} systems)")
        return {"published": entries}
    reports_dir = Path(args.reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    pod = planning.system_from_report(ensure_report("pod", ["--config=pod"], reports_dir))
    factor = planning.tpu_factor(pod)
    pod_prediction = planning.predict(pod)
    case = planning.CASE_STUDY_POD
    pod_row = {"name": case.system, "published_minutes": case.minutes,
               "predicted_minutes_uncompensated": pod_prediction.case_study.total_sec / 60,
               "error_uncompensated": _error(pod_prediction.case_study.total_sec / 60, case.minutes),
               "achieved_fraction_of_compiled": 1 / factor.value}
    checks = [check(e, ensure_report(e["name"].split(", ")[-1], compile_args(e), reports_dir), factor)
              for e in json.loads(PUBLISHED.read_text())]
    rows = [[c["name"], c["num_chips"], f"{c['global_batch']:,}", f"{c['published_minutes']:.2f}",
             _num(c["published_epochs"], "{:.0f}"), _num(c["rcp_epochs"], "{:.1f}"),
             f"{c['published_sec_per_epoch']:.2f}",
             *(f"{_num(c[k]['sec_per_epoch'])} ({_pct(c[k]['sec_per_epoch_error'])})"
               for k in ("uncompensated", "compensated")),
             *(f"{_num(c[k]['minutes_own_epochs'])} ({_pct(c[k]['minutes_own_epochs_error'])})"
               for k in ("uncompensated", "compensated")),
             f"{_num(c['compensated']['minutes_rcp_epochs'])} "
             f"({_pct(c['compensated']['minutes_rcp_epochs_error'])})"]
            for c in checks]
    print(f"{case.system}: published {case.minutes} min (90 epochs, the case study's clock); predicted "
          f"uncompensated {pod_row['predicted_minutes_uncompensated']:.2f} min "
          f"({_pct(pod_row['error_uncompensated'])}); TPU factor x{factor.value:.3f} ({factor.note}).\n")
    print(harness.markdown_table(
        ["published result", "chips", "batch", "minutes (score)", "epochs (runs)", "epochs (MLPerf RCP)",
         "s/epoch (published)", "s/epoch, uncompensated", "s/epoch, compensated",
         "minutes at the runs' epochs, uncompensated", "minutes at the runs' epochs, compensated",
         "minutes at RCP epochs, compensated"], rows))
    result = {**harness.environment(), "tpu_factor": factor.__dict__, "case_study_pod": pod_row,
              "checks": checks}
    harness.write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
