"""Where the test suite's CPU goes: each test's own CPU seconds and those of the processes it launched.

  python benchmarks/suite_cpu.py [--top=40] [--json_out=benchmarks/results/suite_cpu.json] [-- PYTEST_ARGS]

Runs `python -m pytest -p suite_cpu PYTEST_ARGS` (default: `-q -n 2 -p no:cacheprovider` on the repository's
tests, the README's test command) with this folder on PYTHONPATH, so that pytest and each xdist worker load
this module as a plugin. Around each test the plugin reads `getrusage`: the worker's own CPU seconds (the
test's in-process work) and its children's (the processes the test launched and waited for, with theirs). A
process never waited for (one the test leaves running, or a daemon) is not counted. With 2 cores busy the
suite's time is its CPU seconds over 2: the tables say which tests and files those are.

Prints the totals, a table by test file and the most expensive tests; writes JSON with every test's record.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import pytest

# Where the plugin writes (one file per worker), set by `main` for the pytest it runs.
RECORDS_DIR_ENV = "RESNET_SCALING_SUITE_CPU_DIR"


def _cpu_sec(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Records the test's CPU (set-up, call and tear-down) in this process and in its waited-for children."""
    folder = os.environ.get(RECORDS_DIR_ENV)
    own, launched, wall = _cpu_sec(resource.RUSAGE_SELF), _cpu_sec(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    if folder:
        record = {"test": item.nodeid, "in_process_cpu_sec": _cpu_sec(resource.RUSAGE_SELF) - own,
                  "launched_cpu_sec": _cpu_sec(resource.RUSAGE_CHILDREN) - launched,
                  "wall_sec": time.monotonic() - wall}
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"{worker}.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\n")


def summarize(records: list[dict], top: int) -> dict:
    """Totals, per-file sums (most CPU first) and the `top` tests by CPU."""
    files: dict[str, dict[str, float]] = {}
    for record in records:
        row = files.setdefault(record["test"].split("::", 1)[0], {"tests": 0, "in_process_cpu_sec": 0.0,
                                                                  "launched_cpu_sec": 0.0, "wall_sec": 0.0})
        row["tests"] += 1
        for key in ("in_process_cpu_sec", "launched_cpu_sec", "wall_sec"):
            row[key] += record[key]

    def cpu(row):
        return row["in_process_cpu_sec"] + row["launched_cpu_sec"]

    return {
        "tests": len(records),
        "in_process_cpu_sec": sum(r["in_process_cpu_sec"] for r in records),
        "launched_cpu_sec": sum(r["launched_cpu_sec"] for r in records),
        "tests_that_launch": sum(r["launched_cpu_sec"] > 0 for r in records),
        "files": dict(sorted(files.items(), key=lambda item: -cpu(item[1]))),
        "top_tests": sorted(records, key=lambda r: -cpu(r))[:top],
    }


def main(argv: list[str]) -> int:
    import harness  # Beside this script; imported here, not in the plugin that pytest's workers load.

    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=40, help="Tests and files listed.")
    parser.add_argument("--json_out", default=os.path.join(here, "results", "suite_cpu.json"),
                        help="Where the JSON goes.")
    args, pytest_args = parser.parse_known_args(argv)
    repo_tests = os.path.join(os.path.dirname(here), "tests")
    pytest_args = ([a for a in pytest_args if a != "--"]
                   or ["-q", "-n", "2", "-p", "no:cacheprovider", repo_tests])
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, RECORDS_DIR_ENV: folder,
               "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
        before, start = _cpu_sec(resource.RUSAGE_CHILDREN), time.monotonic()
        status = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", *pytest_args],
                                env=env).returncode
        wall_sec, total_cpu_sec = time.monotonic() - start, _cpu_sec(resource.RUSAGE_CHILDREN) - before
        records = [json.loads(line) for name in sorted(os.listdir(folder))
                   for line in pathlib.Path(folder, name).read_text().splitlines()]
    summary = summarize(records, args.top)
    print(f"\n{summary['tests']} tests in {wall_sec:.0f} s: {total_cpu_sec:.0f} CPU s in all (pytest, its "
          f"workers and every process they waited for); in the tests' own processes "
          f"{summary['in_process_cpu_sec']:.0f}, in the processes {summary['tests_that_launch']} of them "
          f"launched {summary['launched_cpu_sec']:.0f}.\n")
    print(harness.markdown_table(
        ["test file", "tests", "in-process CPU s", "launched CPU s", "wall s"],
        [[name, row["tests"], f"{row['in_process_cpu_sec']:.0f}", f"{row['launched_cpu_sec']:.0f}",
          f"{row['wall_sec']:.0f}"] for name, row in list(summary["files"].items())[:args.top]]))
    print()
    print(harness.markdown_table(
        ["test", "in-process CPU s", "launched CPU s", "wall s"],
        [[r["test"].removeprefix("tests/"), f"{r['in_process_cpu_sec']:.1f}", f"{r['launched_cpu_sec']:.1f}",
          f"{r['wall_sec']:.1f}"] for r in summary["top_tests"]]))
    harness.write_json(args.json_out, {
        **harness.environment(pytest_args=pytest_args, pytest_exit_status=status), "wall_sec": wall_sec,
        "total_cpu_sec": total_cpu_sec, **summary, "records": records})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
