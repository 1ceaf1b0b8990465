"""A real one-node SLURM cluster for tests: slurmctld and slurmd on 127.0.0.1, authenticated by munge.

    with slurm_cluster() as slurm:                 # skips the calling test where SLURM is not installed
        subprocess.run(["srun", "-n2", ...], env=slurm.env)

Requires Debian's `slurm-wlm` and `munge` packages (`.ci/run` installs them where it runs as root with
apt) and root: the daemons run as root, each cluster in a folder of its own (its config, state, spool
and logs), on ports of its own, so that xdist's two workers can each run one (the daemons bind them
themselves; where one could not, another cluster answers or none does, and the next ports are tried).
Clients find the cluster through `SLURM_CONF` in `.env`. The config is the smallest a real cluster runs on:
`proctrack/linuxproc` (no cgroups in a container), `task/none`, `select/cons_tres`, one partition with this
machine's CPUs, and `KillWait=30` (SLURM's default: how long tasks have between SIGTERM and SIGKILL when a job
is cancelled).
munged is shared: started if no munged answers, and left running (it keeps no state of a test's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

KILL_WAIT_SEC = 30


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    folder: str
    node: str
    env: dict[str, str]  # os.environ with SLURM_CONF pointing at this cluster

    def log(self, daemon: str) -> str:
        """The text of `slurmctld.log` or `slurmd.log` (for a failing test's message)."""
        path = os.path.join(self.folder, f"{daemon}.log")
        return open(path).read() if os.path.exists(path) else ""

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(State, ExitCode) of a finished or running job, as `scontrol show job` reports them."""
        text = subprocess.run(["scontrol", "show", "job", job_id], env=self.env, capture_output=True,
                              text=True).stdout
        fields = dict(word.split("=", 1) for word in text.split() if "=" in word)
        return fields.get("JobState", "?"), fields.get("ExitCode", "?")


    def ended(self, job_id: str) -> bool:
        """Whether the job has finished (any end state)."""
        return self.job_state(job_id)[0] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")

    @staticmethod
    def task_pid(job_id: str, task: int) -> int | None:
        """The pid of the trainer that runs as task `task` of the job (from /proc: this machine is the
        cluster's only node), or None."""
        for entry in pathlib.Path("/proc").iterdir():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
                cmdline = (entry / "cmdline").read_bytes() if environ else b""
            except OSError:
                continue
            if (b"resnet_scaling.train" in cmdline and f"SLURM_JOB_ID={job_id}".encode() in environ
                    and f"SLURM_PROCID={task}".encode() in environ):
                return int(entry.name)
        return None


def unavailable_reason() -> str | None:
    """Why no cluster can start here, or None."""
    missing = [name for name in ("slurmctld", "slurmd", "srun", "munged") if shutil.which(name) is None
               and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return (f"SLURM is not installed ({', '.join(missing)} missing; "
                "apt-get install slurm-wlm munge, as .ci/run does)")
    if os.geteuid() != 0:
        return "a test SLURM cluster needs root (its daemons run as root)"
    if not os.path.exists("/etc/munge/munge.key"):
        return "munge has no key (/etc/munge/munge.key)"
    return None


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _start_munged() -> None:
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged")], check=True, capture_output=True)
    _wait_for(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0,
              10, "munged did not start")


def _wait_for(ready, timeout_sec: float, message: str) -> None:
    deadline = time.monotonic() + timeout_sec
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.2)


def _config(folder: str, node: str, cpus: int, port: int) -> str:
    return "\n".join([
        f"ClusterName=rs{port}", f"SlurmctldHost={node}(127.0.0.1)", f"SlurmctldPort={port}",
        f"SlurmdPort={port + 1}", "AuthType=auth/munge", "CredType=cred/munge", "SlurmUser=root",
        "SlurmdUser=root", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
        "MpiDefault=none", "ReturnToService=2", f"KillWait={KILL_WAIT_SEC}", "JobCompType=jobcomp/none",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "MinJobAge=600",
        # Job ids, and so JAX's coordinator ports (61440 + id % 4096), apart from the other worker's.
        f"FirstJobId={100 + 300 * ((port - 16817) // 10 % 13)}",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        ""])


def _ports_for_this_worker() -> Iterator[int]:
    """Candidate ports for slurmctld (slurmd's is the next): xdist's workers (gw0, gw1, ...) try ports of
    their own. A candidate is only a guess: the daemons bind it themselves, and `slurm_cluster` keeps a port
    only once the cluster that answers on it is the one it started."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    base = 16817 + 10 * int("".join(c for c in worker if c.isdigit()) or 0)
    yield from range(base, base + 2000, 100)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Starts a one-node cluster and yields it; stops its daemons and removes its folder at the end."""
    if reason := unavailable_reason():
        pytest.skip(reason)
    _start_munged()
    node = socket.gethostname().split(".")[0]
    failures = []
    for port in itertools.islice(_ports_for_this_worker(), 5):
        # A folder per try: slurmctld keeps the cluster's name in its state and refuses another one there.
        cluster, daemons = _start_cluster(node, port)
        try:
            if _answers_as(f"rs{port}", daemons, cluster.env):
                yield cluster
                return
            failures.append(f"port {port}:\n{cluster.log('slurmctld')[-1500:]}")
        finally:
            subprocess.run(["scancel", "--full", "--signal=KILL", f"--user={os.getuid()}"], env=cluster.env,
                           capture_output=True)
            _stop_daemons(daemons)
            shutil.rmtree(cluster.folder, ignore_errors=True)
    raise RuntimeError("the test SLURM cluster did not come up on any port tried:\n" + "\n".join(failures))


def _start_cluster(node: str, port: int) -> tuple[SlurmCluster, list[subprocess.Popen]]:
    """A new folder with the config for `port`, and the two daemons started on it."""
    folder = tempfile.mkdtemp(prefix="resnet_scaling-slurm-")
    for sub in ("state", "spool"):
        os.mkdir(os.path.join(folder, sub))
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write(_config(folder, node, os.cpu_count() or 1, port))
    env = {**os.environ, "SLURM_CONF": conf}
    for name in list(env):  # A test run inside a SLURM job must not hand that job's variables on.
        if name.startswith("SLURM_") and name != "SLURM_CONF":
            del env[name]
    return SlurmCluster(folder, node, env), _start_daemons(conf, node, env)


def _start_daemons(conf: str, node: str, env: dict[str, str]) -> list[subprocess.Popen]:
    daemons = [subprocess.Popen([_sbin("slurmctld"), "-D", "-i", "-f", conf], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    daemons.append(subprocess.Popen([_sbin("slurmd"), "-D", "-f", conf, "-N", node], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return daemons


def _answers_as(cluster_name: str, daemons: list[subprocess.Popen], env: dict[str, str]) -> bool:
    """Whether the daemons just started came up and are the cluster that answers on the config's ports: its
    node idle, `cluster_name` its name (a daemon that could not bind its port exits, or leaves the clients
    talking to whoever holds the port: another suite's cluster, a benchmark's)."""
    def state() -> str:
        if any(daemon.poll() is not None for daemon in daemons):
            return "exited"
        config = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True,
                                text=True).stdout
        if not re.search(rf"^ClusterName\s*=\s*{cluster_name}$", config, flags=re.M):
            return "other" if config else "starting"  # Nobody answers yet, or another cluster does.
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
        return "idle" if out.stdout.strip() == "idle" else "starting"

    deadline = time.monotonic() + 30
    while (now := state()) == "starting" and time.monotonic() < deadline:
        time.sleep(0.2)
    return now == "idle"


def _stop_daemons(daemons: list[subprocess.Popen]) -> None:
    for daemon in daemons:
        daemon.terminate()
    for daemon in daemons:
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
