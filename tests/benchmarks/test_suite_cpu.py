"""benchmarks/suite_cpu.py: each test's CPU, in its own process and in the processes it launched."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

# Two tests that report, through files, the CPU seconds their own clocks measured: one spins in the test
# process, one in a process it launches and waits for. The oracle is each spinner's `time.process_time()`,
# not the plugin's `getrusage`.
_SPINNING_TESTS = '''
import pathlib, subprocess, sys, time

SPIN = """
import sys, time
start = time.process_time()
while time.process_time() - start < 0.4:
    pass
print(time.process_time())
"""


def test_spins_here():
    start = time.process_time()
    while time.process_time() - start < 0.4:
        pass
    pathlib.Path(__file__).with_name("here.txt").write_text(str(time.process_time() - start))


def test_spins_in_a_child():
    out = subprocess.run([sys.executable, "-c", SPIN], capture_output=True, text=True, check=True).stdout
    pathlib.Path(__file__).with_name("child.txt").write_text(out)
'''


def test_it_attributes_cpu_to_the_test_and_to_the_processes_it_launched(tmp_path):
    (tmp_path / "test_spinning.py").write_text(_SPINNING_TESTS)
    out = tmp_path / "suite_cpu.json"
    # In an xdist worker (-n 1), as the suite runs: the plugin is loaded by name there too.
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "suite_cpu.py"), f"--json_out={out}",
                           "--", "-q", "-n", "1", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_spinning.py")],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    records = {r["test"].rsplit("::", 1)[1]: r for r in report["records"]}
    assert sorted(records) == ["test_spins_here", "test_spins_in_a_child"] and report["tests"] == 2
    here, child = (tmp_path / "here.txt").read_text(), (tmp_path / "child.txt").read_text()
    spun_here, spun_in_child = float(here), float(child)
    assert spun_here >= 0.4 and spun_in_child >= 0.4
    # The test's own spin is in its process's count, and nothing was launched; the child's whole process
    # (its interpreter's start-up too, so more than its spin) is in the launched count, not the test's own.
    assert spun_here <= records["test_spins_here"]["in_process_cpu_sec"] < spun_here + 0.3
    assert records["test_spins_here"]["launched_cpu_sec"] == 0
    assert spun_in_child <= records["test_spins_in_a_child"]["launched_cpu_sec"] < spun_in_child + 1.0
    assert records["test_spins_in_a_child"]["in_process_cpu_sec"] < 0.3
    assert report["tests_that_launch"] == 1
    (name, row), = report["files"].items()
    assert name.endswith("test_spinning.py") and row["tests"] == 2
    assert report["total_cpu_sec"] >= spun_here + spun_in_child
    assert "| test file | tests | in-process CPU s | launched CPU s | wall s |" in proc.stdout
