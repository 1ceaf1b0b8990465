"""The edges of the commands a first day meets: `--help`, `--print_config`, a config made for a pod started
on this machine, a workdir that is a file, and libtpu's start-up noise in a script that imports the package.
Each runs as a user runs it: `python -m ...` in a fresh process, with the machine's own devices; the flags
parser's other messages are checked in-process, on the parser the commands give absl."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling.config import command_line
from resnet_scaling.job import workdir as workdir_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def _user_env() -> dict[str, str]:
    # No fake devices and no platform chosen: what a user's shell has.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return {**env, "PYTHONPATH": str(REPO)}


def _run(args: list[str], cwd: pathlib.Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_user_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_help_exits_zero_without_warnings(command, tmp_path):
    proc = _run(["-m", f"resnet_scaling.{command}", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--workdir" in proc.stdout
    if command == "train":  # A default the flag states in words, as the job's code keeps it.
        from resnet_scaling.job import distributed

        assert (f"connected by then (default: {distributed.DEFAULT_INITIALIZATION_TIMEOUT_SEC})"
                in " ".join(proc.stdout.split())), proc.stdout
    # runpy warns when the package has already imported the module `-m` is about to run.
    assert "RuntimeWarning" not in proc.stderr and "sys.modules" not in proc.stderr, proc.stderr
    # The files it cites exist: in the package (job/memory.py) or the checkout (configs/*.py).
    cited = set(re.findall(r"[\w/*.-]+\.py\b", proc.stdout))
    assert cited and all(any((root / name).exists() or list(root.glob(name)) for root in (REPO,
                         REPO / "resnet_scaling")) for name in cited if not name.startswith("/")), cited


# Runs a command as `python -m` does, then says which of the heavy libraries it imported.
_IMPORTS_OF_A_COMMAND = """
import runpy, sys
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
    print("exit:", 0 if e.code is None else e.code if isinstance(e.code, int) else 1)
print("imported:", sorted(name for name in ("jax", "tensorflow", "orbax", "flax") if name in sys.modules))
"""


@pytest.mark.parametrize("command, args, status", [
    ("train", ["--help"], 0),
    ("train", ["--config=demo", "--print_config"], 0),
    ("train", ["--config=demo", "/tmp/run"], 1),  # A word where a flag belongs.
    ("train", ["--config=pods", "--workdir=/tmp/run"], 1),  # No such config.
    ("train", ["--config=demo", "--config.training.global_batchsize=8", "--workdir=/tmp/run"], 1),
    ("train", ["--config=demo"], 1),  # No --workdir.
    ("evaluate", ["--help"], 0),
    ("evaluate", ["--workdir=/tmp/run", "--weights=bset"], 1),
    ("compile", ["--topology=v2:2x2"], 1),  # No --config.
    ("prepare", ["--help"], 0),
    ("planner", ["--price=pod"], 1),
    ("planner", [], 0),  # The table of every shipped system, from the shipped reports.
])
def test_help_usage_mistakes_and_the_planners_table_need_no_jax(command, args, status, tmp_path):
    """`--help`, `--print_config` and a mistake on the command line need none of JAX's seconds of imports
    (nor TensorFlow's, orbax's, Flax's): each command reads its line first. Nor does the planner's table:
    its model is plain Python over shipped figures (JAX loads only to compile a config)."""
    proc = _run(["-c", _IMPORTS_OF_A_COMMAND, f"resnet_scaling.{command}", *args], tmp_path)
    assert f"exit: {status}" in proc.stdout.splitlines(), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "imported: []" in proc.stdout.splitlines(), proc.stdout[-2000:]


def test_print_config_prints_the_overridden_config_and_exits_without_a_workdir(tmp_path):
    proc = _run(["-m", "resnet_scaling.train", "--config=demo", "--print_config",
                 "--config.training.global_batch_size=64"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Step " not in proc.stdout + proc.stderr and list(tmp_path.iterdir()) == []  # Nothing trained.
    # A config file as a user writes one (tests/config/test_config_text.py checks the format), not YAML: with
    # config.py's comment and the base's value, and loading back as the config it printed.
    assert ("    config.training.global_batch_size = 64  # Images per step summed over all devices and "
            "hosts. (default: 1024)\n") in proc.stdout, proc.stdout
    assert "!!python" not in proc.stdout
    printed = tmp_path / "printed.py"
    printed.write_text(proc.stdout)
    expected = config_lib.load_config("demo")
    expected.training.global_batch_size = 64
    assert config_lib.load_config(str(printed)).to_dict() == expected.to_dict()


def test_a_config_file_that_fails_to_load_a_file_is_one_error_line_naming_it(tmp_path):
    # The train command's reading of --config (compile's, the same reader, is checked below).
    command, args = "train", ["--print_config"]
    (tmp_path / "reads_a_file.py").write_text(
        "def get_config():\n    return open('labels_that_are_not_here.txt').read()\n")
    proc = _run(["-m", f"resnet_scaling.{command}", f"--config={tmp_path / 'reads_a_file.py'}", *args],
                tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: cannot load the config file given by --config (no such file: labels_that_are_not_here.txt)")


def test_compile_reads_its_config_flag_as_train_does(tmp_path):
    # The one reader of --config (train's no-such-file and mistyped-name cases are below): a mistyped field.
    message = "error: --config.system.topologyy: no such config field; did you mean topology?"
    proc = _run(["-m", "resnet_scaling.compile", "--config=pod", "--config.system.topologyy=v2:2x2"],
                tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr[-3000:]


def test_a_pod_config_here_is_one_error_line_whose_advice_leads_past_the_config(tmp_path):
    """The design card's command on a machine without the pod: one `error:` line naming the command that
    checks a pod config here and the overrides that train it on these devices; the workdir it would have
    made is not left behind. The overrides, taken from the line, meet no second refusal of the config:
    the next thing the run needs is the dataset (ImageNet, not prepared here)."""
    workdir = tmp_path / "pod_run"
    proc = _run(["-m", "resnet_scaling.train", "--config=pod", f"--workdir={workdir}"], tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("error: config.mesh.num_devices: this config is written for 512 devices")
    assert "python -m resnet_scaling.compile --config=pod (the [tpu] extra)" in errors[0]  # As typed.
    assert not workdir.exists(), sorted(p.name for p in workdir.rglob("*"))
    advice = errors[0].split("To train it on these devices, add ", 1)[1].rstrip(".").split()
    assert "--config.mesh.num_devices=-1" in advice and all(a.startswith("--config.") for a in advice)
    data_dir = tmp_path / "no_datasets_here"
    proc = _run(["-m", "resnet_scaling.train", "--config=pod", f"--workdir={workdir}", *advice,
                 f"--config.data.data_dir={data_dir}"], tmp_path)
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("error: TFDS dataset 'imagenet2012' is not prepared"), errors[0]
    # It says how to prepare it (README: the ImageNet step), the command on the lines after.
    advice = proc.stderr[proc.stderr.index(errors[0]):]
    assert "resnet_scaling.prepare --dataset=imagenet2012" in advice and "--manual_dir" in advice, advice
    # Ours first: no warning from TFDS before it about the dataset's folder, which does not exist.
    assert not any("warning" in line for line in lines[:lines.index(errors[0])]), proc.stderr[-3000:]


@pytest.mark.parametrize("args, message", [
    (["--config.training.global_batch_size=6x4"],
     "error: --config.training.global_batch_size=6x4: expects a whole number, got '6x4'."),
    (["--config.system.chips_per_host_bounds=6x4"],  # A tuple field takes a bare string as ('6x4',).
     "error: config.system.chips_per_host_bounds: needs three positive whole numbers (x, y, z), "
     "e.g. (2, 2, 1), got ('6x4',)."),
])
def test_a_malformed_command_line_is_one_error_line_saying_what_to_type(tmp_path, args, message):
    """absl printed `FATAL Flags parsing error: ...` and a hint for a value that does not parse; a value the
    config then refuses is one line too. The parser's other messages: the next test, in-process."""
    proc = _run(["-m", "resnet_scaling.train", "--config=demo", *args, f"--workdir={tmp_path / 'run'}"],
                tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr  # One line.
    assert proc.stderr.startswith(message), proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--config.model.bn_epsilon=1e-5x"],
     "error: --config.model.bn_epsilon=1e-5x: expects a number, got '1e-5x'."),
    (["--config.checkpoint.enabled=maybe"],
     "error: --config.checkpoint.enabled=maybe: expects true or false, got 'maybe'."),
    (["--config.trainng.num_epochs=3"],
     "error: --config.trainng.num_epochs: no such config section trainng; did you mean training?"),
    (["--config=pods"], "error: --config=pods: no such config file; did you mean pod? Give a path"),
])
# ml_collections' config_flags loads the file with importlib's deprecated load_module (the commands do too;
# Python shows DeprecationWarnings only to __main__'s code, so a user never sees it).
@pytest.mark.filterwarnings("ignore:the load_module\\(\\) method is deprecated:DeprecationWarning")
def test_the_config_flags_parser_says_what_to_type_in_one_line(args, message):
    """The commands' parser (`command_line.parse_config_flags`, what `app.run` is given) on flags defined as
    the train command defines them: the exit's message, which Python prints as the process's one stderr
    line (the test above runs the command)."""
    argv = ["train", *(args if args[0].startswith("--config=") else ["--config=demo", *args]),
            "--workdir=/tmp/run"]
    flag_values = flags.FlagValues()
    # The overrides are read from sys.argv unless given: this argv, as the command's would be.
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True,
                                    sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
    with pytest.raises(SystemExit) as exited:
        command_line.parse_config_flags(argv, flag_values)
    assert isinstance(exited.value.code, str) and "\n" not in exited.value.code, exited.value.code
    assert exited.value.code.startswith(message), exited.value.code


@pytest.mark.parametrize("command, args, message", [
    ("train", ["--config=demo", "/tmp/run"],
     "error: unexpected arguments: /tmp/run; the command takes flags only"),
    ("evaluate", [], "error: --workdir is required (--help describes it)."),
    ("evaluate", ["--workdir=/tmp/run", "--override=data.data_dir"], "error: --override takes FIELD=VALUE"),
    ("evaluate", ["--workdir=/tmp/run", "--weights=bset"],
     "error: --weights=bset: expects one of export, best, got 'bset'; did you mean best?"),
    ("compile", [], "error: --config is required (or --shipped): the config to compile."),
    ("planner", ["--price=pod"], 'error: --price=pod: expected "SYSTEM=USD_PER_CHIP_HOUR:SOURCE"'),
])
def test_each_command_ends_a_usage_mistake_in_one_error_line(tmp_path, command, args, message):
    """absl's `UsageError` and required flags printed the whole usage text or a `FATAL` line and a hint."""
    proc = _run(["-m", f"resnet_scaling.{command}", *args], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr  # One line.
    assert proc.stderr.startswith(message), proc.stderr


def test_a_refused_launch_keeps_a_workdir_that_existed_and_anything_written(tmp_path):
    """Only empty folders a refused first launch made go: an existing workdir and other files stay."""
    existing = tmp_path / "existing"
    (existing / "logs").mkdir(parents=True)
    (existing / "logs" / "other-process.log").write_text("another process's lines")
    log_file = existing / "logs" / "this-process.log"
    log_file.write_text("this launch's lines")
    workdir_lib.remove_refused_launch(str(existing), str(log_file))
    assert sorted(p.name for p in existing.rglob("*")) == ["logs", "other-process.log"]


def test_a_workdir_that_is_a_file_is_named_not_a_directory(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    with pytest.raises(workdir_lib.WorkdirError, match=r"a_file: Not a directory \(ENOTDIR\): a file has"):
        workdir_lib.check_writable(str(path))


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the tpu or test extra)")
@pytest.mark.skipif(any(name.startswith("accel") or name == "vfio" for name in os.listdir("/dev")),
                    reason="this machine has a TPU")
def test_a_script_importing_the_package_prints_no_libtpu_errors_on_a_machine_without_a_tpu(tmp_path):
    probe = "import jax; print(jax.devices()[0].platform)"
    without_package = _run(["-c", probe], tmp_path)
    with_package = _run(["-c", "import resnet_scaling; " + probe], tmp_path)
    # The control: JAX alone probes for a TPU through libtpu and prints its errors before using the CPU.
    assert without_package.stdout.strip() == "cpu" and "INVALID_ARGUMENT" in without_package.stderr
    assert with_package.returncode == 0 and with_package.stdout.strip() == "cpu", with_package.stderr
    assert "TPU" not in with_package.stderr and "INVALID_ARGUMENT" not in with_package.stderr, \
        with_package.stderr
