"""The step model fitted to published MLPerf results, and each result predicted by a fit that left it out.

  python benchmarks/planner_checks.py                      # the fits and the check table (results/...json)
  python benchmarks/planner_checks.py --write_calibration  # also rewrite the planner's step_calibration.json
  python benchmarks/planner_checks.py --compile_all        # also compile the TPU systems above 1,024 chips
  python benchmarks/planner_checks.py --extract_from PATH/training_results_v0.6 ... PATH/..._v4.0
      # a clone of each round SUBMISSIONS names: v0.6, v0.7, v1.0, v1.1, v2.0, v3.0, v4.0

The published results (`published_results.json`, beside this file) are MLPerf submissions' own logs, read
by `parse_mlperf_result`: run_start to run_stop (MLPerf's clock: training and evaluation, no
initialisation), the epoch of the evaluation that reached the target, the global batch and BN span; Google's
TPU v3 and v4 and NVIDIA's V100, A100, H100 and H200 submissions. Each becomes an observation of the step
model (`resnet_scaling.planning.step_model`): a TPU system from this library's ResNet-50 step compiled with
the submission's topology, batch and BN span (`compile_args`: the pod config with those fields overridden;
reports in results/compile/, compiled when missing), a GPU system from the shipped reference program
scaled to its batch, with the FLOPs and collectives of this library's step compiled for its card's
generation (the shipped GPU configs' reports), as the planner plans GPU configs. Its seconds per epoch on
MLPerf's clock (training and its share of evaluation) are what the fit matches: per generation and base
(libtpu's estimate, or the roofline), least squares on the relative error; every point is also predicted
by the fit of the others (leave-one-out), which is the error the check table reports and the planner's
interval.

The case study's pod is in no fit (TPU v2 has no published MLPerf result): it is predicted with TPU v3's fit
and compared with its published 7.9 minutes.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import re
import statistics
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from resnet_scaling.config import IMAGENET_NUM_EVAL_EXAMPLES, IMAGENET_NUM_TRAIN_EXAMPLES, plan
from resnet_scaling.job import hardware
from resnet_scaling.planning import estimates as planning
from resnet_scaling.planning import shipped_reports, step_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

PUBLISHED = Path(__file__).resolve().parent / "published_results.json"
_LINE_V06 = re.compile(r":::MLL (?P<ts>[0-9.]+) (?P<key>\w+): (?P<json>.*)")
_MLLOG = ":::MLLOG "


def _entries(text: str) -> list[tuple[float, str, dict[str, Any]]]:
    """(seconds, key, {"value", "metadata"}) of each log line: v0.6's `:::MLL <time> <key>: <json>` or
    mllog's `:::MLLOG <json>` (v0.7 on), wherever the line has it: after a prefix too (mpirun's
    "[1,0]<stdout>:", absl's "I0518 21:33:07.307 mllog.py:168] ", or another process's output the line
    interleaves)."""
    entries = []
    for line in text.splitlines():
        if (at := line.find(_MLLOG)) >= 0:
            entry = json.loads(line[at + len(_MLLOG):])
            entries.append((entry["time_ms"] / 1000, entry["key"], entry))
        elif match := _LINE_V06.search(line):
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


def score(minutes: Sequence[float], statuses: Sequence[str | None]) -> tuple[float, float | None, str | None]:
    """A result's score from its runs' logged times: the olympic mean of 5 (`olympic_mean`), the plain
    mean of another number; MLPerf's own score where a run did not reach the target (its status not
    "success"), which counts such a run as infinitely slow (mlcommons/training_policies,
    training_rules.adoc): one is then the slowest, dropped, and two leave no valid score (None); and a
    note where either differs from the olympic mean of 5 runs that all reached the target.

    Returns:
      (score in minutes, MLPerf's score where a run failed else None, note or None).
    """
    failed = [i for i, s in enumerate(statuses) if s != "success"]
    notes = []
    if len(minutes) == 5:
        value = olympic_mean(minutes)
    else:
        value = statistics.fmean(minutes)
        notes.append(f"{len(minutes)} runs published: score_minutes is their plain mean, not MLPerf's "
                     "olympic mean of 5")
    rule = None
    if failed:
        done = sorted(m for i, m in enumerate(minutes) if i not in failed)
        if len(minutes) == 5 and len(failed) == 1:
            rule = statistics.fmean(done[1:])
        notes.append(
            f"run{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} did not reach the target "
            f"(status {', '.join(repr(statuses[i]) for i in failed)}); score_minutes counts the logged "
            "times like any other's, MLPerf counts such a run as infinitely slow: "
            + ("mlperf_rule_score_minutes" if rule is not None else "no valid 5-run score"))
    return value, rule, "; ".join(notes) or None


# The submissions read, by MLPerf round: "submitter/system" (the results and systems folders' names) ->
# (device kind, chips, topology) for Google's TPU slices, None for a GPU system (described by its
# systems/<system>.json, `gpu_fields`). A TPU slice is named by its cores ("v3-32": 32 cores, 16 chips;
# "v4-128": 64 chips: 2 a chip), its systems json gives nodes x accelerators per node = chips; v2 and v3
# slices are 2-D tori of chips, v4 slices 3-D. Where neither the systems json nor the logs give a slice's
# shape, its topology is None (and the entry says so).
SUBMISSIONS: dict[str, dict[str, tuple[str, int, str | None] | None]] = {
    "v0.6": {"Google/tpu-v3-32": ("TPU v3", 16, "v3:4x4"), "Google/tpu-v3-128": ("TPU v3", 64, "v3:8x8"),
             "Google/tpu-v3-256": ("TPU v3", 128, "v3:8x16"),
             "Google/tpu-v3-512": ("TPU v3", 256, "v3:16x16"),
             "Google/tpu-v3-1024": ("TPU v3", 512, "v3:16x32"),
             "Google/tpu-v3-2048": ("TPU v3", 1024, "v3:32x32"),
             "NVIDIA/dgx1_ngc19.05_mxnet": None, "NVIDIA/dgx2_ngc19.05_mxnet": None,
             "NVIDIA/dgx2h_n96_ngc19.05_mxnet": None},
    "v0.7": {"Google/tpu-v3-32-TF2.0": ("TPU v3", 16, "v3:4x4"),
             "Google/tpu-v3-8192-JAX": ("TPU v3", 4096, "v3:64x64"),
             "Google/tpu-v3-8192-TF": ("TPU v3", 4096, "v3:64x64"),  # The slice of the JAX entry above.
             # v4 slice shapes: the logs do not say; these are the Cloud TPU v4 page's shapes for the size.
             "Google/tpu-v4-16-TF": ("TPU v4", 8, "v4:2x2x2"),
             "Google/tpu-v4-512-TF": ("TPU v4", 256, "v4:4x8x8"),
             "NVIDIA/dgx1_ngc20.06_mxnet": None, "NVIDIA/dgx2h_ngc20.06_mxnet": None,
             "NVIDIA/dgx2h_n32_ngc20.06_mxnet": None},
    "v1.0": {"Google/tpu-v4-128-TF": ("TPU v4", 64, "v4:4x4x4"),
             "Google/tpu-v4-4096-TF": ("TPU v4", 2048, "v4:8x16x16"),
             "Google/tpu-v4-6912-TF": ("TPU v4", 3456, "v4:12x12x24")},
    "v1.1": {"NVIDIA/dgxa100_n540_ngc21.09_mxnet": None},
    "v2.0": {"Google/cloud-tpu-v4-6912-TF": ("TPU v4", 3456, "v4:12x12x24"),
             "Google/cloud-tpu-v4-8192-TF": ("TPU v4", 4096, "v4:16x16x16"),
             "NVIDIA/dgxa100_ngc22.04_mxnet": None, "NVIDIA/dgxa100_n8_ngc22.04_mxnet": None,
             "NVIDIA/dgxa100_n128_ngc22.04_mxnet": None, "NVIDIA/dgxa100_n527_ngc22.04_mxnet": None},
    "v3.0": {"NVIDIA/dgxh100_n96_ngc23.04_mxnet": None,
             "NVIDIA_CoreWeave/coreweave_hgxh100_n448_ngc23.04_mxnet": None},
    "v4.0": {"NVIDIA/eos_ngc24.04_mxnet": None, "NVIDIA/eos_n8_ngc24.04_mxnet": None,
             "NVIDIA/eos_n316_ngc24.04_mxnet": None, "NVIDIA/h200_ngc24.04_mxnet": None},
}
GPU_GENERATIONS = ("V100", "A100", "H100", "H200")  # As JAX's device_kind names them, oldest first.
_FRAMEWORKS = (("mxnet", "MXNet"), ("pytorch", "PyTorch"), ("paddle", "PaddlePaddle"), ("jax", "JAX"),
               ("tensorflow", "TensorFlow"), ("tf", "TensorFlow"))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def system_description(text: str) -> dict[str, Any]:
    """A systems/<name>.json's fields: its JSON object (v0.7 on), or v0.6's `key: {"value": ...}` lines
    (org, division, status, entry: a Python-literal dict with the nodes' as another), in v0.7's names.
    v0.6 names one interconnect, the hosts' network; its accelerator_interconnect is None."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    fields = {key.strip(): json.loads(body)["value"] for key, sep, body in
              (line.partition(": ") for line in text.splitlines()) if sep}
    entry = ast.literal_eval(fields["entry"])
    nodes = ast.literal_eval(entry["nodes"])
    return {"submitter": fields["org"], "division": fields["division"], "status": fields["status"],
            "number_of_nodes": nodes["num_nodes"], "accelerators_per_node": nodes["num_accelerators"],
            "accelerator_model_name": nodes["accelerator"], "accelerator_interconnect": None,
            "host_networking": entry["interconnect"], "framework": entry["framework"]}


def gpu_fields(system: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU system's entry fields from its systems json (`system_description`)."""
    accelerator = system["accelerator_model_name"]
    kind = next((g for g in GPU_GENERATIONS if g in accelerator), None)
    if kind is None:
        raise ValueError(f"{accelerator!r}: not a GPU of {GPU_GENERATIONS}")
    nodes, per_node = int(system["number_of_nodes"]), int(system["accelerators_per_node"])
    release = system["framework"]
    framework = next((name for key, name in _FRAMEWORKS if key in release.lower()), release)
    return {"device_kind": kind, "accelerator": accelerator, "num_chips": nodes * per_node,
            "num_nodes": nodes, "gpus_per_node": per_node, "topology": None,
            "interconnect": system.get("accelerator_interconnect") or None,
            "host_networking": system.get("host_networking") or None, "framework": framework,
            "framework_release": release, "submitter": system["submitter"]}


def extract(repo: Path, mlperf_round: str) -> list[dict[str, Any]]:
    """The published_results.json entries from a clone of mlcommons/training_results_<round>: each
    submission's result_*.txt logs (closed division, as its systems json says), its runs' times, epochs,
    batch and BN span, and its score (`score`; a scaling.json's RCP factor beside it).

    Raises:
      ValueError: a submission not in the closed division, a TPU slice whose systems json counts other
        chips, a GPU system whose logs name another number of nodes, or runs of different batches.
    """
    commit = _git(repo, "rev-parse", "HEAD").strip()
    entries = []
    for key, tpu in SUBMISSIONS[mlperf_round].items():
        submitter, system_name = key.split("/")
        folder = f"{submitter}/results/{system_name}/resnet"
        listing = _git(repo, "ls-tree", "--name-only", "HEAD", f"{folder}/").split()
        files = sorted((int(m[1]), name) for name in listing
                       if (m := re.fullmatch(rf"{re.escape(folder)}/result_(\d+)\.txt", name)))
        if not files:
            raise ValueError(f"{key}: no {folder}/result_*.txt")
        runs = [parse_mlperf_result(_git(repo, "show", f"HEAD:{name}")) for _, name in files]
        system = system_description(_git(repo, "show", f"HEAD:{submitter}/systems/{system_name}.json"))
        if system["division"] != "closed":
            raise ValueError(f"{key}: division {system['division']!r}, not closed")
        if len({r["global_batch"] for r in runs}) != 1:
            raise ValueError(f"{key}: runs of different batches")
        entry: dict[str, Any] = {"name": f"MLPerf {mlperf_round}, {submitter}, {system_name}",
                                 "clock": "mlperf"}
        if tpu is None:
            entry |= gpu_fields(system)
            stated = re.match(r"(\d+)x", runs[0]["platform"] or "")
            if stated and int(stated[1]) != entry["num_nodes"]:
                raise ValueError(f"{key}: the logs' platform {runs[0]['platform']!r}, the systems json "
                                 f"{entry['num_nodes']} nodes")
        else:
            kind, chips, topology = tpu
            if int(system["number_of_nodes"]) * int(system["accelerators_per_node"]) != chips:
                raise ValueError(f"{key}: the systems json counts other than {chips} chips")
            entry |= {"device_kind": kind, "num_chips": chips, "topology": topology}
            if topology is None:
                entry["topology_note"] = (f"not stated: the systems json and the logs name the slice "
                                          f"({system_name}, {chips} chips) but not its shape")
        minutes = [r["run_sec"] / 60 for r in runs]
        statuses = [r["status"] for r in runs]
        value, rule, note = score(minutes, statuses)
        entry |= {"global_batch": runs[0]["global_batch"], "bn_span": runs[0]["bn_span"],
                  "epochs": [r["epochs"] for r in runs], "minutes": [round(m, 3) for m in minutes],
                  "score_minutes": round(value, 3)}
        notes = [note] if note else []
        if any(s != "success" for s in statuses):
            entry["run_status"] = statuses
        if rule is not None:
            entry["mlperf_rule_score_minutes"] = round(rule, 3)
        if f"{folder}/scaling.json" in listing:
            entry["scaling_factor"] = json.loads(_git(repo, "show", f"HEAD:{folder}/scaling.json"))[
                "scaling_factor"]
            notes.append("MLPerf multiplies its score by scaling_factor (the result's scaling.json: its "
                         "epochs normalised to the reference convergence points')")
        if notes:
            entry["score_note"] = "; ".join(notes)
        first, last = files[0][0], files[-1][0]
        entry["source"] = (f"mlcommons/training_results_{mlperf_round} at {commit[:12]}: "
                           f"{folder}/result_[{first}-{last}].txt")
        entries.append(entry)
    return entries


def published_order(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """TPU entries first, in the order given (by round), then GPU entries by generation, GPUs and round."""
    def key(e: Mapping[str, Any]) -> tuple[int, int, int]:
        if e["device_kind"] not in GPU_GENERATIONS:
            return (0, 0, 0)
        return (1, GPU_GENERATIONS.index(e["device_kind"]), e["num_chips"])
    return sorted(entries, key=key)


def extract_all(paths: Sequence[str], parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Rewrites published_results.json from clones of the results repositories."""
    entries = []
    for path in paths:
        mlperf_round = next((r for r in SUBMISSIONS if f"_{r}" in path), None)
        if mlperf_round is None:
            parser.error(f"--extract_from {path}: name a clone of training_results_{'/'.join(SUBMISSIONS)}.")
        entries += extract(Path(path), mlperf_round)
    entries = published_order(entries)
    PUBLISHED.write_text(json.dumps(entries, indent=2) + "\n")
    print(f"Wrote {PUBLISHED} ({len(entries)} systems)")
    return entries


def compile_args(entry: Mapping[str, Any]) -> list[str]:
    """`python -m resnet_scaling.compile` flags for a published system: the pod config (ResNet-50,
    bfloat16, LARS) with the submission's topology (all its devices), batch and BN span."""
    batch = entry["global_batch"]
    return ["--config=pod", f"--config.system.topology={entry['topology']}",
            f"--config.system.device_kind={entry['device_kind']}", "--config.mesh.num_devices=-1",
            f"--config.training.global_batch_size={batch}", f"--config.eval.global_batch_size={batch}",
            f"--config.model.bn_group_size={bn_group_size(entry)}",
            f"--config.system.name={report_name(entry)}"]


def bn_group_size(entry: Mapping[str, Any]) -> int:
    """The BN group the compile uses: the submission's span, or 0 (per device) where the span is smaller
    than a device's batch (TPU v4 runs a chip as one device; its submissions normalised per TensorCore),
    which changes the statistics' reductions, not the step's FLOPs or HBM traffic to speak of."""
    devices = entry["num_chips"] * hardware.devices_per_chip(entry["device_kind"])
    return entry["bn_span"] if entry["bn_span"] >= entry["global_batch"] // devices else 0


def ensure_report(name: str, args: Sequence[str], reports_dir: Path) -> dict[str, Any]:
    """The compile report `reports_dir/NAME.json`, compiled first if it is not there."""
    path = reports_dir / f"{name}.json"
    if not path.is_file():
        print(f"Compiling {name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "resnet_scaling.compile", *args, f"--json_out={path}"],
                       check=True, stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


REPORTS_DIR = Path(__file__).resolve().parent / "results" / "compile"
# Larger TPU systems (4,096 to 8,192 devices) take many minutes each to compile on a 2-core CPU: compiled only
# with --compile_all; until then their rows say so.
MAX_CHIPS_COMPILED = 1024


def missing_reports(reports_dir: Path = REPORTS_DIR,
                    published: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """The published TPU systems without a compile report in `reports_dir` (not in any fit)."""
    published = json.loads(PUBLISHED.read_text()) if published is None else published
    return [e["name"] for e in published
            if "TPU" in e["device_kind"] and not (reports_dir / f"{report_name(e)}.json").is_file()]
MLPERF_EVAL_EVERY_EPOCHS = 4  # MLPerf's ResNet rules: an evaluation pass every 4 epochs.


def report_name(entry: Mapping[str, Any]) -> str:
    """The compile report's file name for a published TPU system: its topology, batch and BN span, which
    is all `compile_args` takes from it ("v3-4x4_b4096_bn128"; two submissions on one system share it)."""
    return f"{entry['topology'].replace(':', '-')}_b{entry['global_batch']}_bn{bn_group_size(entry)}"


def published_sec_per_epoch(entry: Mapping[str, Any]) -> float:
    """Seconds per epoch on MLPerf's clock: the median over the runs of their time over their epochs."""
    return statistics.median(m * 60 / e for m, e in zip(entry["minutes"], entry["epochs"], strict=True))


def _scaled_reference(entry: Mapping[str, Any], reports_dir: Path,
                      published: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The compile report a TPU system too large to compile here is scaled from: its generation's largest
    compiled published system's, or None where none is compiled."""
    compiled = [e for e in published if e["device_kind"] == entry["device_kind"]
                and (reports_dir / f"{report_name(e)}.json").is_file()]
    if not compiled:
        return None
    largest = max(compiled, key=lambda e: e["num_chips"])
    return json.loads((reports_dir / f"{report_name(largest)}.json").read_text())


def observations(reports_dir: Path = REPORTS_DIR, compile_up_to_chips: int = 0,
                 published: Sequence[Mapping[str, Any]] | None = None) -> list[step_model.Observation]:
    """Every published result as the step model sees it: a TPU system from its compile report (libtpu's
    estimate where it gives one, and, where the report has HBM bytes, its roofline too), a GPU system from
    the shipped reference program scaled to its batch with the FLOPs and collectives of this library's step
    compiled for its card's generation (`step_model.with_compiled_gpu_step`, as `planning.system_from_plan`
    plans a shipped GPU config).

    A TPU system whose report is missing is compiled if it has at most `compile_up_to_chips` chips; else
    its generation's largest compiled program is scaled to its batch on its own torus, and the observation
    is checked but not fitted on (`fitted=False`).
    """
    published = json.loads(PUBLISHED.read_text()) if published is None else published
    reference = json.loads(shipped_reports.report_path(planning.REFERENCE_CONFIG).read_text())
    out = []
    for entry in published:
        y = published_sec_per_epoch(entry)
        epoch_length = plan.EpochLength(IMAGENET_NUM_TRAIN_EXAMPLES, entry["global_batch"])
        train_steps = epoch_length.exact_steps_per_epoch
        fitted = True
        eval_steps = math.ceil(IMAGENET_NUM_EVAL_EXAMPLES / entry["global_batch"]) / MLPERF_EVAL_EVERY_EPOCHS
        if "TPU" in entry["device_kind"]:
            path = reports_dir / f"{report_name(entry)}.json"
            if path.is_file() or entry["num_chips"] <= compile_up_to_chips:
                report = ensure_report(report_name(entry), compile_args(entry), reports_dir)
                train, evaluation = step_model.programs_from_report(report)
                eval_steps = report["eval_steps_per_pass"] / MLPERF_EVAL_EVERY_EPOCHS
            else:
                source = _scaled_reference(entry, reports_dir, published)
                if source is None:
                    continue
                torus = step_model._torus_of(entry["topology"] or "") or None
                train, evaluation = step_model.scaled_programs(
                    entry["device_kind"], entry["num_chips"], 0, entry["global_batch"] / entry["num_chips"],
                    source, torus)
                fitted = False
        else:
            gpus, per_node = entry["num_chips"], entry.get("gpus_per_node") or planning.GPUS_PER_NODE
            kind = entry.get("accelerator") or entry["device_kind"]  # "A100-SXM4-80GB": its HBM.
            train, evaluation = step_model.scaled_programs(kind, gpus, min(gpus, per_node),
                                                        entry["global_batch"] / gpus, reference)
            own = shipped_reports.gpu_report_of_generation(kind)
            if own is not None:  # As the planner plans a shipped GPU config.
                train, evaluation = step_model.with_compiled_gpu_step(train, evaluation, own,
                                                                      entry["global_batch"] / gpus)
        variants = [(train, evaluation)]
        if train.compiled_sec and train.bytes_per_chip:  # The same system's roofline, for its own fit.
            variants.append((dataclasses.replace(train, compiled_sec=None),
                             evaluation and dataclasses.replace(evaluation, compiled_sec=None)))
        for t, e in variants:
            out.append(step_model.Observation(entry["name"], t, e, train_steps, eval_steps, y,
                                              entry["num_chips"], fitted))
    return out


def _family(key: tuple[str, str]) -> str:
    return "TPU" if key[0].startswith("TPU") else "GPU"


def _borrow_source(key: tuple[str, str], keys: Collection[tuple[str, str]]) -> tuple[str, str] | None:
    """The generation `key` borrows from along `step_model.BORROWS` among `keys`, as `step_model.borrowed`
    walks it."""
    source, seen = step_model.BORROWS.get(key), {key}
    while source is not None and source not in keys and source not in seen:
        seen.add(source)
        source = step_model.BORROWS.get(source)
    return source if source in keys else None


def fit_all(observations: Sequence[step_model.Observation],
            extra_borrow_checks: Sequence[dict[str, Any]] = ()) -> list[step_model.Calibration]:
    """One fit per (generation, base) over the fitted observations, each with `b` (for its fits of `a`
    alone: fewer than 3 points, or leave-one-out down to 2) and its borrowed fit from the generation it
    would borrow (`step_model.BORROWS`; else its family's fit with most points); then every fit's
    `borrow_interval`: the worst miss of `borrow_checks` in its family."""
    groups: dict[tuple[str, str], list[step_model.Observation]] = {}
    for o in observations:
        if o.fitted:
            groups.setdefault(o.key, []).append(o)
    fits: dict[tuple[str, str], step_model.Calibration] = {}

    def fit_of(key: tuple[str, str], visiting: frozenset = frozenset()) -> step_model.Calibration:
        if key not in fits:
            source_key = _borrow_source(key, groups)
            if source_key is None and len(groups[key]) < 4:  # Its leave-one-out fits `a` alone: a `b`.
                family = [k for k in groups if _family(k) == _family(key) and k != key
                          and (k[1] == key[1] or _family(key) == "GPU")]
                source_key = max(family, key=lambda k: len(groups[k]), default=None)
            source = None if source_key in (None, *visiting) else fit_of(source_key, visiting | {key})
            fits[key] = step_model.fit(groups[key], b_fallback=source.b_sec if source else 0.0,
                                       borrowed_fit=source)
        return fits[key]

    for key in groups:
        fit_of(key)
    checks = [*borrow_checks(observations, fits), *extra_borrow_checks]
    out = []
    for key, f in sorted(fits.items()):
        family = [c for c in checks if _family((c["generation"], c["base"])) == _family(key)]
        if family:
            worst = max(family, key=lambda c: max(abs(e) for e in c["errors"]))
            errors = [e for c in family for e in c["errors"]]
            basis = (f"whole-generation borrowing missed by {min(errors):+.0%} to {max(errors):+.0%} "
                     f"(worst: {worst['generation']} from {worst['borrowed_from']})")
            f = dataclasses.replace(f, borrow_interval=max(abs(e) for e in errors), borrow_basis=basis)
        out.append(f)
    return out


def borrow_checks(observations: Sequence[step_model.Observation],
                  fits: Mapping[tuple[str, str], step_model.Calibration]) -> list[dict[str, Any]]:
    """Each fitted generation left out whole and predicted with the fit it would borrow, as a generation
    without a published point is planned: its points' errors."""
    checks = []
    for key in sorted(fits):
        source = _borrow_source(key, fits)
        if source is None:
            continue
        points = [o for o in observations if o.fitted and o.key == key]
        src = fits[source]
        checks.append({"generation": key[0], "base": key[1], "borrowed_from": f"{source[0]} ({source[1]})",
                       "points": [o.name for o in points],
                       "errors": [o.predict(src.a, src.b_sec) / o.published_sec_per_epoch - 1
                                  for o in points]})
    return checks


LOO_BAR = 0.15  # The bar for leave-one-out errors of systems from 16 to 1,024 chips.


def _why_outside(o: step_model.Observation, fit: step_model.Calibration, error: float, fit_chips: int) -> str:
    """Why a point misses by more than its bar or its interval, for the table's row."""
    if not o.fitted:
        return (f"outside its interval: the {o.key[0]} fit (its points up to {fit_chips:,} chips) does not "
                f"extrapolate to {o.num_chips:,}, scaled from a compiled program" if abs(error) > fit.interval
                else "")
    if abs(error) <= LOO_BAR or not 16 <= o.num_chips <= 1024:
        return ""
    n = len(fit.points)
    if n - 1 < 3:
        return (f"{o.key[0]} has {n} published point{'s' * (n != 1)}: without this one, {n - 1} fit `a` "
                "alone (with the borrowed `b`)")
    return f"the fit of the other {n - 1} {o.key[0]} points misses it"


def check_rows(observations: Sequence[step_model.Observation], fits: Sequence[step_model.Calibration],
               published: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each published result beside its prediction by a fit that left it out (or was never fitted on it)
    and by the fit with it."""
    by_key = {(f.generation, f.base): f for f in fits}
    entries = {e["name"]: e for e in published}
    chips = {o.name: o.num_chips for o in observations}
    rows = []
    for o in observations:
        fit = by_key.get(o.key) or step_model.borrowed(o.key, by_key)
        if fit is None:
            continue
        entry = entries[o.name]
        epochs = statistics.median(entry["epochs"])
        predicted = o.predict(fit.a, fit.b_sec)
        in_fit = o.fitted and o.name in fit.points
        loo = dict(zip(fit.points, fit.loo_errors, strict=False)).get(o.name) if in_fit else (
            predicted / o.published_sec_per_epoch - 1)
        loo_sec = None if loo is None else o.published_sec_per_epoch * (1 + loo)
        rows.append({
            "name": o.name, "generation": o.key[0], "base": o.key[1], "num_chips": o.num_chips,
            "global_batch": entry["global_batch"], "published_minutes": entry["score_minutes"],
            "epochs": epochs, "published_sec_per_epoch": o.published_sec_per_epoch,
            "fitted_sec_per_epoch": predicted if in_fit else None,
            "fitted_error": predicted / o.published_sec_per_epoch - 1 if in_fit else None,
            "loo_sec_per_epoch": loo_sec, "loo_error": loo,
            "loo_minutes": None if loo_sec is None else loo_sec * epochs / 60,
            "raw_error": o.predict(1.0, 0.0) / o.published_sec_per_epoch - 1,
            "interval": fit.interval, "in_fit": in_fit, "fit_points": len(fit.points),
            "within_interval": loo is not None and abs(loo) <= fit.interval + 1e-12,
            "why": "" if loo is None else _why_outside(o, fit, loo, max(chips[p] for p in fit.points)),
            "source": entry["source"]})
    return rows


def case_study_check(fits: Mapping[tuple[str, str], step_model.Calibration]) -> dict[str, Any]:
    """The case study's pod (TPU v2, no published MLPerf point: not in any fit) predicted on its clock."""
    report = json.loads(shipped_reports.report_path("pod").read_text())
    prediction = planning.predict(planning.system_from_report(report), fits)
    case = planning.CASE_STUDY_POD
    minutes, step = prediction.case_study_sec / 60, prediction.step_sec.value
    return {"name": case.system, "published_minutes": case.minutes, "predicted_minutes": minutes,
            "error": minutes / case.minutes - 1,
            "interval": (prediction.step_low_sec / step - 1, prediction.step_high_sec / step - 1),
            "basis": prediction.step_sec.note}


def case_study_borrow_check(fits: Sequence[step_model.Calibration]) -> dict[str, Any]:
    """The case study's pod as a whole-generation borrow: TPU v2 (no MLPerf point) with the fit it borrows."""
    by_key = {(f.generation, f.base): f for f in fits}
    case = case_study_check(by_key)
    source = _borrow_source(("TPU v2", step_model.COMPILED), by_key)
    return {"generation": "TPU v2", "base": step_model.COMPILED,
            "borrowed_from": f"{source[0]} ({source[1]})" if source else "none", "points": [case["name"]],
            "errors": [case["error"]]}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def main(argv: list[str]) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reports_dir", default=str(REPORTS_DIR), help="Compile reports: read, or written when "
                   "missing.")
    p.add_argument("--extract_from", nargs="*", default=[],
                   help="Clones of mlcommons/training_results_vX (the round read from the path): "
                        f"rewrite {PUBLISHED.name} from their logs and stop.")
    p.add_argument("--compile_all", action="store_true",
                   help=f"Also compile the TPU systems above {MAX_CHIPS_COMPILED:,} chips (many minutes "
                        "each).")
    p.add_argument("--write_calibration", action="store_true",
                   help=f"Write the fits into the package ({step_model.CALIBRATION_PATH.name}), which the "
                        "planner uses.")
    harness.add_flags(p, repeats=1, json_out="benchmarks/results/planner_checks.json")
    args = p.parse_args(argv)
    if args.extract_from:
        return {"published": extract_all(args.extract_from, p)}
    published = json.loads(PUBLISHED.read_text())
    reports_dir = Path(args.reports_dir)
    obs = observations(reports_dir, 10**9 if args.compile_all else MAX_CHIPS_COMPILED, published)
    missing = [n for n in missing_reports(reports_dir, published) if not any(o.name == n for o in obs)]
    fits = fit_all(obs, [case_study_borrow_check(fit_all(obs))])
    if args.write_calibration:
        step_model.CALIBRATION_PATH.write_text(step_model.calibrations_json(
            fits, f"benchmarks/planner_checks.py --write_calibration over {PUBLISHED.name} "
                  f"({len(published)} published results)"))
        print(f"Wrote {step_model.CALIBRATION_PATH}")
    by_key = {(f.generation, f.base): f for f in fits}
    rows = check_rows(obs, fits, published)
    case = case_study_check(by_key)
    checks = [*borrow_checks(obs, by_key), case_study_borrow_check(fits)]
    print(harness.markdown_table(
        ["generation, base", "a", "b (ms)", "points", "interval"],
        [[f"{f.generation}, {f.base}", f"{f.a:.3f}", f"{f.b_sec * 1e3:.2f}", len(f.points),
          f"±{f.interval:.0%} (" + ("largest leave-one-out error" if len(f.points) >= 3 else
                                    "its borrowed fit's largest miss") + ")"] for f in fits]))
    print()
    print(harness.markdown_table(
        ["generation left out", "borrowing", "its points' errors"],
        [[f"{c['generation']} ({c['base']})", c["borrowed_from"],
          ", ".join(_pct(e) for e in c["errors"])] for c in checks]))
    print()
    print(harness.markdown_table(
        ["published result", "chips", "base", "minutes published", "minutes predicted", "error",
         "interval", "in the fit", "note"],
        [[r["name"], f"{r['num_chips']:,}", r["base"], f"{r['published_minutes']:.3f}",
          "-" if r["loo_minutes"] is None else f"{r['loo_minutes']:.3f}", _pct(r["loo_error"]),
          f"±{r['interval']:.0%}" + ("" if r["within_interval"] else " (outside)"),
          "yes (error: left out)" if r["in_fit"] else "no", r["why"]] for r in rows]))
    print(f"\n{case['name']} (TPU v2: in no fit): published {case['published_minutes']} min (90 epochs, "
          f"the case study's clock); predicted {case['predicted_minutes']:.2f} min ({_pct(case['error'])}); "
          f"{case['basis']}.")
    if missing:
        print(f"Not checked (no compiled program of their generation to scale): {', '.join(missing)}.")
    result = {**harness.environment(), "fits": [dataclasses.asdict(f) for f in fits], "checks": rows,
              "borrow_checks": checks, "case_study_pod": case, "not_checked": missing}
    harness.write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
