"""`python -m resnet_scaling.compile` where it cannot compile: without libtpu (the `tpu` extra), without a
topology, with a topology libtpu does not know; and the planner, which compiles TPU configs too. Each ends
in one `error:` line, with no traceback, no absl usage text and none of libtpu's start-up errors. Fresh
processes, with a user's environment; none compiles
(tests/planning/test_compile.py runs the command that does)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _compile(args: list[str], cwd: pathlib.Path, pythonpath: tuple[str, ...] = (),
             command: str = "compile") -> subprocess.CompletedProcess:
    # No fake devices, no platform chosen, no libtpu path given: what a user's shell has.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "TPU_LIBRARY_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(REPO)])
    return subprocess.run([sys.executable, "-m", f"resnet_scaling.{command}", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _without_libtpu(tmp_path: pathlib.Path) -> str:
    """A folder whose `libtpu` module raises ImportError, as in a venv without the extra: first on the path,
    it hides the installed one from us and from JAX (which imports `libtpu` to find it)."""
    hidden = tmp_path / "without_libtpu"
    hidden.mkdir()
    (hidden / "libtpu.py").write_text("raise ImportError('no libtpu: a venv without the tpu extra')\n")
    return str(hidden)


def _only_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]  # No traceback, usage text or libtpu lines around it.
    return lines[0]


def test_without_libtpu_it_is_one_error_line_naming_the_tpu_extra(tmp_path):
    """Before: a 28-line chained traceback."""
    line = _only_line(_compile(["--config=tpu_v2_8"], tmp_path, pythonpath=(_without_libtpu(tmp_path),)))
    assert line.startswith("error: ahead-of-time compilation for a TPU topology needs libtpu"), line
    assert "pip install 'resnet_scaling[tpu]'" in line and "pip install -e '.[tpu]'" in line, line


def test_the_planner_given_a_tpu_config_without_libtpu_ends_in_the_same_error_line(tmp_path):
    """The planner compiles a TPU config that has no shipped report (a config of one's own) as the compile
    command does; it ended in a traceback too. A shipped config needs no libtpu: its report ships."""
    (tmp_path / "my_v2_8.py").write_text(
        "from resnet_scaling.config import load_config\n\n\ndef get_config():\n"
        "    config = load_config('tpu_v2_8')\n    config.training.global_batch_size = 2048\n"
        "    return config\n")
    no_libtpu = (_without_libtpu(tmp_path),)
    proc = _compile([str(tmp_path / "my_v2_8.py")], tmp_path, pythonpath=no_libtpu, command="planner")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: {tmp_path / 'my_v2_8.py'}: ahead-of-time compilation for a TPU topology needs libtpu"), \
        proc.stderr[-3000:]
    shipped = _compile(["tpu_v2_8"], tmp_path, pythonpath=no_libtpu, command="planner")
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    # Its shipped report's program: libtpu's estimate of it, which only a compiled step has.
    note = next(line for line in shipped.stdout.splitlines() if line.startswith("- Cloud TPU v2-8"))
    assert "libtpu's estimate" in note, shipped.stdout[-3000:]


@pytest.mark.parametrize("args, message", [
    (["--config=demo"], "error: nothing to compile for: set config.system.topology (a TPU topology, or "
                        "pass --topology=v2:16x16) or config.system.device_kind (a GPU)."),
    (["--config=tpu_v2_8", "v2:2x2"], "error: unexpected arguments: v2:2x2; the command takes flags only"),
])
def test_a_usage_mistake_is_one_error_line_without_absls_usage_text(tmp_path, args, message):
    assert _only_line(_compile(args, tmp_path)).startswith(message)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the tpu or test extra)")
@pytest.mark.skipif(any(name.startswith("accel") or name == "vfio" for name in os.listdir("/dev")),
                    reason="this machine has a TPU: libtpu finds its metadata and prints nothing anyway")
def test_libtpu_starts_without_its_error_lines_and_a_topology_it_cannot_describe_is_one_line(tmp_path):
    """libtpu starts (as for every compile) and refuses the topology. Off a TPU VM it used to print five
    lines first ("could not determine TPU accelerator type", "E0000 ... INVALID_ARGUMENT: unexpected
    worker hostname", "=== Source Location Trace"); the refusal was a traceback."""
    line = _only_line(_compile(["--config=tpu_v2_8", "--topology=v2:3x3"], tmp_path))
    assert line.startswith("error: TPU topology 'v2:3x3' ((2, 2, 1) chips per host, 1 slice(s)): libtpu "
                           "cannot describe it: INVALID_ARGUMENT: "), line
