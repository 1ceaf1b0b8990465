"""A 2-task SLURM job preempted, or one of its tasks killed, at random moments: does every task exit as it
should, how soon, and is the checkpoint named the one the next launch resumes from?

Starts a real one-node SLURM cluster (tests/slurm_cluster.py: Debian's slurm-wlm and munge, as root),
then, per repeat and scenario, submits the demo (2 CPU tasks, gloo, a smaller dataset, an evaluation
every half epoch so that signals land in evaluations as well as in training) the way launch/README.md
does, and a random 0-30 s after the first training step is logged:

- `preempt`: `scancel --signal=TERM JOB` on `sbatch -n2 --wrap "srun --kill-on-bad-exit=1 python -m
  resnet_scaling.train --config=demo ..."`. Clean: the job ends COMPLETED with exit code 0:0, the output
  shows the preemption's checkpoint saved and no abort, error or traceback, and that step's checkpoint is
  complete on disk. Timed from the signal to the job's end.
- `preempt_saving`: the same with a checkpoint every 2 steps, so that the signal lands during a save.
- `kill_sbatch` (the same job) and `kill_srun` (plain `srun`, no --kill-on-bad-exit): `kill -9` of task 1.
  Clean: the survivor's output has exactly one `error:` line, naming process 1 and the newest checkpoint
  complete on disk, and no JAX abort; the survivor exits 1. Timed from the kill to the job's end.

    python benchmarks/slurm_faults.py --repeats=10 --json_out=benchmarks/results/slurm_faults.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # Beside this script.

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from resnet_scaling import checkpointing  # noqa: E402
from tests.slurm_cluster import slurm_cluster  # noqa: E402

OVERRIDES = ["--config.data.num_train_examples=2048", "--config.training.num_epochs=6",
             "--config.eval.every_epochs=0.5", "--config.checkpoint.every_epochs=1",
             "--config.training.log_every_steps=4"]
TASK_ENV = {"JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
_LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d:\d\d:\d\d\.\d+) .*?\] (.*)$")


def train_command(workdir: Path, cache_dir: Path, *extra: str) -> list[str]:
    # --verbosity=0: absl's prefix on the console, whose microsecond stamps time the phases (_LOG_TIME).
    return [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
            f"--config.data.cache_dir={cache_dir}", *OVERRIDES, "--verbosity=0", *extra]


def submit(cluster, output: Path, command: list[str], kill_on_bad_exit: bool = True) -> str:
    wrap = ("srun --kill-on-bad-exit=1 " if kill_on_bad_exit else "srun ") + shlex.join(command)
    result = subprocess.run(["sbatch", "--parsable", "-n2", "-o", str(output), "--wrap", wrap],
                            env={**cluster.env, **TASK_ENV}, capture_output=True, text=True, check=True,
                            cwd=REPO)
    return result.stdout.strip().split(";")[0]


def wait_for(predicate, timeout_sec: float, poll_sec: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_sec
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_sec)
    return False


def _log_lines(text: str) -> list[tuple[float, str]]:
    """(seconds since midnight UTC, message) of each absl log line."""
    lines = []
    for line in text.splitlines():
        if match := _LOG_TIME.match(line):
            h, m, s = match.group(1).split(":")
            lines.append((int(h) * 3600 + int(m) * 60 + float(s), match.group(2)))
    return lines


def phase_at(text: str, signal_sec: float) -> str:
    """The phase the signal landed in, from the first log line after it: an evaluation whose line says
    it started before the signal, else training (or its checkpoint saves)."""
    for when, message in _log_lines(text):
        if when < signal_sec:
            continue
        if match := re.match(r"eval at step \d+: .*\(([\d.]+)s\)", message):
            return "evaluation" if when - float(match.group(1)) <= signal_sec else "training"
        if message.startswith("step ") or message.startswith("Preempted"):
            return "training"
    return "end"


def trial(cluster, scenario: str, folder: Path, cache_dir: Path, index: int,
          rng: random.Random) -> dict[str, Any]:
    workdir, output = folder / f"{scenario}{index}", folder / f"{scenario}{index}.out"
    preempt = scenario.startswith("preempt")
    # preempt_saving: a checkpoint every 2 steps, written in the background, so that nearly every signal
    # lands while a save is in flight.
    extra = ["--config.checkpoint.every_steps=2"] if scenario == "preempt_saving" else []
    job = submit(cluster, output, train_command(workdir, cache_dir, *extra), scenario != "kill_srun")
    text = lambda: output.read_text() if output.exists() else ""  # noqa: E731
    if not wait_for(lambda: re.search(r"\] step \d+/", text()), 300):
        raise RuntimeError(f"job {job} logged no step:\n{text()[-3000:]}")
    time.sleep(rng.uniform(0, 30))
    now = datetime.datetime.now(datetime.UTC)
    signal_sec = now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6
    signalled = time.monotonic()
    if preempt:
        subprocess.run(["scancel", "--signal=TERM", job], env=cluster.env, check=True)
    elif (pid := cluster.task_pid(job, 1)) is not None:
        os.kill(pid, signal.SIGKILL)
    ended = wait_for(lambda: cluster.ended(job), 180)
    exit_sec = time.monotonic() - signalled
    state, exit_code = cluster.job_state(job)
    out = text()
    # A killed task's survivor logs no more steps: the phase is read for preemptions only.
    phase = phase_at(out, signal_sec) if preempt else "-"
    row = {"scenario": scenario, "job": job, "phase": phase, "state": state,
           "exit_code": exit_code, "exit_sec": round(exit_sec, 1) if ended else None,
           "finished_before_signal": "Done: step" in out}
    newest = max(checkpointing.complete_steps(str(workdir)), default=None)
    if preempt:
        stopped = re.search(r"Preempted \(SIGTERM\) at step (\d+): checkpoint saved", out)
        step = int(stopped.group(1)) if stopped else None
        problems = [line for line in out.splitlines()
                    if re.search(r"Terminating process|Aborted|Traceback|^error:|srun: error", line)]
        row.update(stopped_at_step=step, newest_complete=newest, problems=problems,
                   finished_before_signal=row["finished_before_signal"] and step is None,
                   clean=state == "COMPLETED" and exit_code == "0:0" and step == newest and not problems)
    else:
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        named = re.search(r"last complete checkpoint \(step (\d+)\)", errors[0]) if errors else None
        named_step = int(named.group(1)) if named else None
        truthful = (named_step == newest if newest is not None else
                    bool(errors) and errors[0].endswith("from the start: no checkpoint is complete."))
        row.update(newest_complete=newest, named_checkpoint=named_step, errors=errors,
                   clean=(len(errors) == 1 and errors[0].startswith("error: process 1 of 2 stopped")
                          and truthful and "Terminating process" not in out
                          and "task 0: Exited with exit code 1" in out))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", default="preempt,kill_sbatch,kill_srun")
    harness.add_flags(parser, repeats=10, json_out=None)  # A repeat is one job per scenario.
    args = parser.parse_args()
    rng = random.Random(args.seed)
    scenarios = args.scenarios.split(",")
    rows = []
    with slurm_cluster() as cluster, tempfile.TemporaryDirectory(prefix="slurm-faults-") as tmp:
        folder = Path(tmp)
        for index in range(args.repeats):
            for scenario in scenarios:
                rows.append(trial(cluster, scenario, folder, folder / "data", index, rng))
                print({k: v for k, v in rows[-1].items() if k not in ("errors", "problems")}, flush=True)
    print(harness.markdown_table(
        ["scenario", "job", "phase", "state", "exit code", "newest complete", "stopped at / named",
         "clean", "signal to end (s)"],
        [[r["scenario"], r["job"], r["phase"], r["state"], r["exit_code"], r["newest_complete"],
          r.get("stopped_at_step", r.get("named_checkpoint")), r["clean"], r["exit_sec"]] for r in rows]))
    summary = {}
    for scenario in scenarios:
        counted = [r for r in rows if r["scenario"] == scenario and not r["finished_before_signal"]]
        exits = [r["exit_sec"] for r in counted if r["exit_sec"] is not None]
        summary[scenario] = {"clean": sum(r["clean"] for r in counted), "counted": len(counted),
                             "median_exit_sec": statistics.median(exits) if exits else None,
                             "max_exit_sec": max(exits, default=None)}
        print(f"{scenario}: {summary[scenario]['clean']} of {len(counted)} clean; signal to the job's end: "
              f"median {summary[scenario]['median_exit_sec']} s, max {summary[scenario]['max_exit_sec']} s")
    if args.json_out:
        harness.write_json(args.json_out, {"trials": rows, "summary": summary,
                                           "environment": harness.environment()})


if __name__ == "__main__":
    main()
