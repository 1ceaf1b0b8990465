"""How long `python -m resnet_scaling.train` takes to end after a Ctrl-C or a SIGTERM, phase by phase.

Each run launches the demo on a small generated dataset with `--verbosity=1` (the log names each phase as
it starts), waits for a phase's line, freezes the process (SIGSTOP), sends the signal, lets it go on
(SIGCONT) and polls the process until it has ended: the seconds from the signal to the exit, and the
phase named by its one line. Prints a table of medians and writes JSON.

    python benchmarks/stop_latency.py --runs=3 --json_out=benchmarks/results/stop_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SMALL_DEMO = ("--config.data.num_train_examples=1280", "--config.data.num_eval_examples=400",
              "--config.eval.global_batch_size=200", "--config.training.num_epochs=2",
              "--config.eval.every_epochs=1", "--config.training.tensorboard=false", "--verbosity=1")
# (phase as its line names it, the signal): a stop before the first step ends the process at once.
CASES = (("setting up the devices, the input and the model", signal.SIGINT),
         ("compiling the train step", signal.SIGTERM),
         ("compiling the train step", signal.SIGINT),
         ("evaluating after step 10", signal.SIGINT))


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def stop_once(phase: str, sig: int, workdir: pathlib.Path, cache_dir: pathlib.Path) -> dict:
    """One launch stopped in `phase`: seconds from the signal to the exit, its exit status and stop line."""
    log_path = workdir.with_suffix(".log")
    command = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
               f"--config.data.cache_dir={cache_dir}", *SMALL_DEMO]
    with open(log_path, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while f"Phase: {phase}." not in log_path.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"ended before {phase!r}:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        proc.send_signal(signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        sent = time.monotonic()
        proc.wait(timeout=300)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text(errors="replace")
    line = re.search(r"(Stopped \(\w+\) while [^:]+|Preempted \(\w+\) at step \d+)", text)
    return {"phase": phase, "signal": signal.Signals(sig).name, "exit_sec": elapsed,
            "returncode": proc.returncode, "line": line.group(1) if line else None,
            "traceback": "Traceback" in text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json_out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = pathlib.Path(tmp) / "cache"
        for run in range(args.runs):
            for i, (phase, sig) in enumerate(CASES):
                results.append(stop_once(phase, sig, pathlib.Path(tmp) / f"run{run}_{i}", cache))
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} cores; {args.runs} runs per row\n")
    print("| phase | signal | median s to exit | max s | exit status | its line | traceback |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for phase, sig in CASES:
        mine = [r for r in results if r["phase"] == phase and r["signal"] == signal.Signals(sig).name]
        times = [r["exit_sec"] for r in mine]
        row = {"phase": phase, "signal": mine[0]["signal"], "median_exit_sec": statistics.median(times),
               "max_exit_sec": max(times), "returncodes": sorted({r["returncode"] for r in mine}),
               "lines": sorted({r["line"] or "none" for r in mine}),
               "tracebacks": sum(r["traceback"] for r in mine)}
        rows.append(row)
        print(f"| {phase} | {row['signal']} | {row['median_exit_sec']:.2f} | {row['max_exit_sec']:.2f} | "
              f"{row['returncodes']} | {'; '.join(row['lines'])} | {row['tracebacks']} |")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"cpu": _cpu_model(), "runs": results, "rows": rows}, indent=2))
        print(f"\nWrote {args.json_out}")


if __name__ == "__main__":
    main()
