"""The multi-process job: joining it, watching its peers, leaving it; one `error:` line when it fails.

`detect` finds the job: flags or RESNET_SCALING_* / JAX_* variables (launch/local.py), SLURM tasks started by
srun, a Cloud TPU pod slice or multislice job, or RESNET_SCALING_DISTRIBUTED=auto; =off forces one process.
A job that does not form within `initialization_timeout_sec`, or later loses a process other than 0 (kill -9,
the out-of-memory killer, a lost host) for RESNET_SCALING_PEER_TIMEOUT_SEC (default 60; 0: off), ends each
remaining process with one `error:` line naming the missing one and status 1, within the bounds of
`PeerTiming`, instead of a hang or JAX's C++ abort. When process 0 dies, JAX aborts the others within about
0.2 s, before any Python code can speak. Imports nothing of the library; measurements: launch/README.md.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import ipaddress
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)

DEFAULT_INITIALIZATION_TIMEOUT_SEC = 300
DEFAULT_PEER_TIMEOUT_SEC = 60
ENV_COORDINATOR = "RESNET_SCALING_COORDINATOR"
ENV_NUM_PROCESSES = "RESNET_SCALING_NUM_PROCESSES"
ENV_PROCESS_ID = "RESNET_SCALING_PROCESS_ID"
ENV_MODE = "RESNET_SCALING_DISTRIBUTED"  # "auto" or "off"
ENV_PEER_TIMEOUT = "RESNET_SCALING_PEER_TIMEOUT_SEC"
ENV_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"  # Read by jax.distributed.initialize itself.
_WATCH_PREFIX = "resnet_scaling/peer_watch/"  # The peer watch's keys in the coordination service.
# Written by XLA's preemption sync manager (preemption_sync_manager.cc) into the coordination service when
# any process got SIGTERM. An internal name, kept because no public API tells a thread other than the
# trainer's that the job is stopping (`reached_preemption_sync_point` is the trainer's own, and calling it
# elsewhere would move its sync point). Should a jaxlib rename it, the watch keeps the full peer timeout.
JAX_PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


@dataclasses.dataclass(frozen=True)
class PeerTiming:
    """Every duration of the peer watch, from the peer timeout T (`for_timeout`); values for T = 60 s."""

    timeout_sec: float  # T: a peer silent this long is lost.
    poll_sec: float  # T/10 within 0.5-5 s (5): how often each process beats and reads the others' beats.
    # T + 4 polls (80): the latest a survivor exits after a death. The death comes up to a poll after the
    # last beat and is seen up to a poll late; process 0 serves 2 more polls, for 3+ processes to read it.
    exit_bound_sec: float
    # min(T, 10) (10) and 0.5 s, once the job is stopping (a preemption notice, a failure here).
    stopping_timeout_sec: float
    stopping_poll_sec: float
    # A poll + the stopping timeout + 2 stopping polls (16): within SLURM's default KillWait of 30 s.
    stopping_exit_bound_sec: float
    # 2 x (exit bound + margin) (180). JAX counts a peer dead that long after its last heartbeat and beats
    # every half of it, so it may abort half of it after a death: after our line.
    jax_heartbeat_timeout_sec: int
    jax_margin_sec: int  # 10: JAX's own deadlines (joining, heartbeats) come this much after ours.

    @classmethod
    def for_timeout(cls, timeout_sec: float) -> PeerTiming:
        """The table for a peer timeout of `timeout_sec` (0: no watch; only the margin is used)."""
        poll = min(5.0, max(0.5, timeout_sec / 10))
        stopping_timeout, stopping_poll, margin = min(timeout_sec, 10.0), 0.5, 10
        bound = timeout_sec + 4 * poll
        return cls(timeout_sec, poll, bound, stopping_timeout, stopping_poll,
                   poll + stopping_timeout + 2 * stopping_poll, 2 * (math.ceil(bound) + margin), margin)


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How this process joins a multi-process job (None: left to JAX's cluster detection); `reason` says
    what made it multi-process, `peer_watchdog` is the watch `maybe_initialize` started."""

    coordinator_address: str | None  # "host:port" of process 0's coordinator service.
    num_processes: int | None
    process_id: int | None
    reason: str
    peer_watchdog: PeerWatchdog | None = dataclasses.field(default=None, compare=False, repr=False)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def _as_int(value: str | int | None, name: str) -> int | None:
    try:
        return value if value is None or isinstance(value, int) else int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}.") from None


def detect(coordinator_address: str | None = None, num_processes: int | None = None,
           process_id: int | None = None, env: Mapping[str, str] | None = None
           ) -> DistributedSettings | None:
    """Decides whether this process is one of several and how it finds the others (None: it is alone).
    Explicit settings (flags) win over the environment.

    Raises:
      ValueError: explicit settings incomplete or inconsistent, a non-integer count or id, or a SLURM task
        that srun did not start.
    """
    env = os.environ if env is None else env
    mode = env.get(ENV_MODE, "").lower()
    if mode == "off":
        return None
    coordinator = coordinator_address or _first(env, ENV_COORDINATOR, "JAX_COORDINATOR_ADDRESS")
    num = num_processes if num_processes is not None else _as_int(
        _first(env, ENV_NUM_PROCESSES, "JAX_NUM_PROCESSES"), ENV_NUM_PROCESSES)
    index = process_id if process_id is not None else _as_int(
        _first(env, ENV_PROCESS_ID, "JAX_PROCESS_ID"), ENV_PROCESS_ID)
    if coordinator or num is not None or index is not None:
        if num == 1 and index in (None, 0):
            return None  # An explicit single-process job.
        missing = [name for name, value in (("coordinator address", coordinator),
                                            ("number of processes", num), ("process id", index))
                   if value is None]
        if missing:
            raise ValueError(
                f"Multi-process settings are incomplete: missing the {', '.join(missing)}. Pass all of "
                f"--coordinator_address, --num_processes and --process_id (or {ENV_COORDINATOR}, "
                f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}), or none of them.")
        if num < 1 or not 0 <= index < num:
            raise ValueError(f"Process id {index} is not in [0, {num}): check --process_id and "
                             "--num_processes.")
        return DistributedSettings(coordinator, num, index, "explicit coordinator settings")
    slurm_tasks = _as_int(env.get("SLURM_NTASKS"), "SLURM_NTASKS") or 1
    if slurm_tasks > 1 and env.get("SLURM_JOB_ID") and not env.get("OMPI_COMM_WORLD_SIZE"):
        return _slurm_settings(env, slurm_tasks)
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        return DistributedSettings(None, None, None, f"Cloud TPU pod slice with {len(hosts)} workers")
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return DistributedSettings(None, None, None, "Cloud TPU multislice job")
    return DistributedSettings(None, None, None, f"{ENV_MODE}=auto") if mode == "auto" else None


def _slurm_settings(env: Mapping[str, str], num_tasks: int) -> DistributedSettings:
    """The job by JAX's own SLURM rule, made explicit so the log shows it and process 0 can check its port:
    the step's first node, port 61440 + job id % 4096 or JAX_COORDINATOR_PORT. JAX still detects SLURM for
    the rest (each task's GPU is its SLURM_LOCALID).

    Raises:
      ValueError: srun did not start this process (the batch script, an salloc shell): no peers would come.
    """
    job = env["SLURM_JOB_ID"]
    if not env.get("SLURM_STEP_NODELIST") or env.get("SLURM_PROCID") is None:
        raise ValueError(
            f"this process runs in SLURM job {job}, an allocation of {num_tasks} tasks, but srun did not "
            "start it (no job step): start one process per task with `srun python -m resnet_scaling.train "
            f"...`, or set {ENV_MODE}=off to run this process alone.")
    port = env.get("JAX_COORDINATOR_PORT") or str(61440 + _as_int(job, "SLURM_JOB_ID") % 4096)
    first_node = re.match(r"([^,\[]*)(?:\[([^,\-\]]*))?", env["SLURM_STEP_NODELIST"])
    host = first_node.group(1) + (first_node.group(2) or "")
    return DistributedSettings(f"{host}:{port}", num_tasks, _as_int(env["SLURM_PROCID"], "SLURM_PROCID"),
                               f"SLURM job {job} with {num_tasks} tasks")


def _is_srun_step(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID") and env.get("SLURM_STEP_NODELIST"))


def _split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def coordinator_bind_address(coordinator_address: str | None, env: Mapping[str, str]) -> str | None:
    """Where process 0's coordinator listens: JAX_COORDINATOR_BIND_ADDRESS when set, a loopback coordinator
    address itself (out of reach of other machines), else None (JAX's default, every interface)."""
    if env.get(ENV_BIND_ADDRESS):
        return env[ENV_BIND_ADDRESS]
    host = _split_address(coordinator_address)[0] if coordinator_address else ""
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return coordinator_address if loopback else None


def check_coordinator_port(coordinator_address: str, bind_address: str | None, *,
                           slurm: bool = False) -> None:
    """Raises RuntimeError, naming the address and what to do, if something already listens at the
    coordinator address or holds the port process 0 binds: gRPC would crash, or share the port with another
    job. A non-listening SO_REUSEPORT socket (launch/local.py holding the port it chose) does not count."""
    host, port = _split_address(coordinator_address)
    choose = ("set JAX_COORDINATOR_PORT to a free port for every task of the job (JAX's default under SLURM "
              "is 61440 + job id % 4096)" if slurm else "choose another port for --coordinator_address "
              "(launch/local.py picks a free one when --port is not given)")
    advice = (f"Another program, or another job's coordinator, is using that port: {choose}, or stop that "
              "program.")
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        pass  # Nothing accepts connections there: the expected case.
    else:
        raise RuntimeError(f"Something already accepts connections at the coordinator address "
                           f"{coordinator_address}, before this process (process 0) started its coordinator. "
                           + advice)
    bind_host, bind_port = _split_address(bind_address) if bind_address else ("::", port)
    try:
        infos = socket.getaddrinfo(bind_host or "::", bind_port, type=socket.SOCK_STREAM)
    except OSError:
        return  # JAX will report an address it cannot resolve.
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # The options gRPC sets on its listening socket, so that the probe conflicts where gRPC would.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise RuntimeError(f"The coordinator's port {bind_port} is already in use on this host "
                                       f"(binding {bind_address or f'[::]:{bind_port}'}: {e.strerror}). "
                                       + advice) from None
                return  # Another problem (no IPv6, say): JAX will report it.


def wait_for_coordinator(address: str, timeout_sec: float, poll_sec: float = 1.0) -> None:
    """Returns once a TCP connection to `address` ("host:port") succeeds; a process other than 0 checks
    this before joining, where XLA's client would abort it blaming "another task".

    Raises:
      RuntimeError: nothing accepted connections at `address` within `timeout_sec`.
    """
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout_sec
    while True:
        try:
            socket.create_connection((host or "localhost", port), timeout=min(poll_sec * 2, 5.0)).close()
            return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"Could not reach the coordinator at {address} within {timeout_sec:g} s ({error}). Check "
                "that process 0 is running and listening there (host, port, firewall), and that every "
                "process was given the same coordinator address.")
        time.sleep(poll_sec)


def stop_srun_step_peers(env: Mapping[str, str]) -> None:
    """Process 0 of an srun step that cannot start the job ends the step's other tasks now (SIGTERM), which
    would otherwise wait out the initialisation timeout; it ignores the signal and exits with its own line."""
    if not _is_srun_step(env) or shutil.which("scancel") is None:
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step = f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    try:
        subprocess.run(["scancel", "--signal=TERM", step], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        logger.debug("Could not cancel step %s: %s", step, e)


def resolve_peer_timeout_sec(value: float | None = None, env: Mapping[str, str] | None = None) -> float:
    """The peer timeout: `value`, else RESNET_SCALING_PEER_TIMEOUT_SEC, else 60 s; 0 turns the watch off.

    Raises:
      ValueError: a negative or non-numeric value.
    """
    text = (os.environ if env is None else env).get(ENV_PEER_TIMEOUT, "")
    if value is None:
        try:
            value = float(text) if text else DEFAULT_PEER_TIMEOUT_SEC
        except ValueError:
            raise ValueError(f"{ENV_PEER_TIMEOUT} must be a number of seconds, got {text!r}.") from None
    if value < 0:
        raise ValueError(f"The peer timeout must be >= 0 seconds (0 turns the watch off), got {value:g}.")
    return float(value)


def did_not_form_message(settings: DistributedSettings, timeout_sec: float) -> str:
    """What to tell the user when the job's processes did not all connect within `timeout_sec`."""
    where = settings.coordinator_address or "the address JAX detected"
    num, index = settings.num_processes, settings.process_id
    job = f"the {num}-process job" if num else "the job"
    if index == 0 and num:
        missing, them, their = (("process 1", "it", "its") if num == 2 else
                                (f"at least one of processes 1..{num - 1} (JAX does not say which)",
                                 "each of them", "their"))
        return (f"{missing} never connected to the coordinator at {where} within {timeout_sec:g} s (this is "
                f"process 0 of {job}, which hosts the coordinator). Start {them} with the same coordinator "
                f"address and process count, or read {their} output for why it did not start or could not "
                "reach this host (host name, port, firewall); then start the job again. A longer "
                "--initialization_timeout_sec helps when processes start far apart.")
    who = f"process {index}" if index is not None else "this process"
    seen = (f"{who} reached the coordinator at {where}" if settings.coordinator_address else
            f"{who} waited at the coordinator ({where})")
    return (f"{job[0].upper()}{job[1:]} did not form within {timeout_sec:g} s: {seen}, but some other "
            "process never connected (JAX does not say which). Check that every process was started, with "
            "the same coordinator address and process count and distinct process ids, and read their output "
            "(a process that crashed or never started is the usual cause); then start the job again.")


def peer_lost_message(lost: list[int], num_processes: int, process_id: int, timeout_sec: float,
                      checkpoint_step: int | None = None, none_complete: bool = False,
                      stopping: bool = False) -> str:
    """The one line (without "error: ") naming the processes silent for `timeout_sec` and how to go on:
    from `checkpoint_step`, the newest complete on disk, if known, or from the start if `none_complete`.
    `stopping`: the job was stopping (a preemption notice, or a failure here), when silence counts sooner."""
    lost = sorted(lost)
    who = (f"process {lost[0]}" if len(lost) == 1 else
           "processes " + ", ".join(map(str, lost[:-1])) + f" and {lost[-1]}")
    resume = (f"the last complete checkpoint (step {checkpoint_step})" if checkpoint_step is not None
              else "the start: no checkpoint is complete" if none_complete
              else "the last complete checkpoint, if there is one")
    why = "while the job was stopping" if stopping else ENV_PEER_TIMEOUT
    return (f"{who} of {num_processes} stopped responding: no sign of life for {timeout_sec:g} s ({why}). "
            "It was killed (the out-of-memory killer sends SIGKILL), crashed, or lost its host; its own "
            f"output or the launcher's says which. This process (process {process_id}) stops too, as the "
            f"job cannot go on without it: run the same command to resume from {resume}.")


def coordinator_lost_message(num_processes: int, process_id: int, timeout_sec: float, error: Exception,
                             address: str | None = None) -> str:
    """The one line (without "error: ") for a coordination service that stopped answering."""
    where = f" at {address}" if address else ""
    return (f"process 0 of {num_processes}, which hosts the coordinator{where}, stopped answering for "
            f"{timeout_sec:g} s ({ENV_PEER_TIMEOUT}; last error: {str(error).splitlines()[0][:200]}). Read "
            f"process 0's output for why. This process (process {process_id}) stops too: run the same "
            "command to resume from the last complete checkpoint, if there is one.")


def _exit_with_error(message: str, linger_sec: float = 0.0) -> None:
    """Writes `error: message` and ends the process `linger_sec` later. From a watching thread: the main
    thread may be blocked in C++ (joining, a collective), where nothing else stops it before JAX's abort."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    time.sleep(linger_sec)
    os._exit(1)


def _coordination_client() -> Any:
    """JAX's client of the coordination service, None when this process is alone or has shut it down.
    JAX has no public accessor for it; orbax's, which its own barriers use, is the maintained one."""
    if not ocp.multihost.is_jax_distributed_client_initialized():
        return None
    return ocp.multihost.get_jax_distributed_client()


class PeerWatchdog:
    """Notices a process of the job that died, and ends this one with one `error:` line that names it,
    where the others would hang in their next collective until JAX's heartbeat abort (SIGABRT, a C++ trace).

    A daemon thread beats a counter in the coordination service's key-value store every poll and reads
    everyone's, also while the main thread waits in C++: a slow step, compile or save is no silence. A
    counter unmoved for the timeout (`PeerTiming`) means lost. Process 0 hosts the service: when it dies,
    JAX aborts the others before this watch can speak.
    """

    def __init__(self, process_id: int, num_processes: int, timeout_sec: float, *,
                 client: Callable[[], Any] = _coordination_client,
                 clock: Callable[[], float] = time.monotonic, coordinator_address: str | None = None,
                 complete_checkpoints: Callable[[], list[int]] | None = None) -> None:
        self.process_id, self.num_processes = process_id, num_processes
        self.timing = PeerTiming.for_timeout(timeout_sec)
        self.finished = False  # True once the client is shut down: the process is exiting normally.
        self._client, self._clock = client, clock
        self._coordinator_address = coordinator_address
        self._complete_checkpoints = complete_checkpoints
        self._beats = 0
        self._last_contact = clock()
        # Each peer's last counter value and when it changed; a peer not yet beating counts from now.
        self._seen: dict[int, tuple[str | None, float]] = {
            i: (None, self._last_contact) for i in range(num_processes) if i != process_id}
        self._thread: threading.Thread | None = None
        self._exiting = threading.Event()  # Set by `stop`: no more calls to the client.
        self._stopping = threading.Event()  # A preemption notice, or `hurry`: the stopping timeout applies.
        self._wake = threading.Event()  # Cuts the wait between rounds short.
        self._round = threading.Lock()  # Held during a round of calls to the client.

    def silence_limit_sec(self) -> float:
        """How long a peer may be silent before it counts as lost: shorter once the job is stopping."""
        return self.timing.stopping_timeout_sec if self._stopping.is_set() else self.timing.timeout_sec

    def check(self) -> str | None:
        """One round: beat, look at the others. Returns the error line (without "error: ") when the job has
        lost a process, else None."""
        client = self._client()
        if client is None:
            self.finished = True
            return None
        now = self._clock()
        try:
            client.key_value_set(f"{_WATCH_PREFIX}beat/{self.process_id}", str(self._beats),
                                 allow_overwrite=True)
            self._beats += 1
            entries = dict(client.key_value_dir_get(_WATCH_PREFIX))
        except Exception as e:  # noqa: BLE001 - any failure to reach the service counts as silence.
            if self._client() is None:  # Shut down while we asked: a normal exit.
                self.finished = True
            elif now - self._last_contact > self.timing.timeout_sec:
                return coordinator_lost_message(self.num_processes, self.process_id, self.timing.timeout_sec,
                                                e, self._coordinator_address)
            return None
        self._last_contact = now
        if not self._stopping.is_set():
            try:
                client.key_value_try_get(JAX_PREEMPTION_NOTICE_KEY)
                self._stopping.set()
            except Exception:  # noqa: BLE001 - NOT_FOUND: no notice (or the service just went).
                pass
        notice = (entries.get(f"{_WATCH_PREFIX}lost") or "").split(",")
        lost = [int(i) for i in notice if i.isdigit() and int(i) != self.process_id]
        if lost:  # Another process's verdict: every process names the same, whatever their clocks saw.
            return self._lost_message(lost)
        for peer, (value, changed) in self._seen.items():
            current = entries.get(f"{_WATCH_PREFIX}beat/{peer}")
            if current != value:
                self._seen[peer] = (current, now)
            elif f"{_WATCH_PREFIX}left/{peer}" not in entries and now - changed > self.silence_limit_sec():
                lost.append(peer)  # Silent, and it did not say it left (`stop`).
        if not lost:
            return None
        try:
            client.key_value_set(f"{_WATCH_PREFIX}lost", ",".join(map(str, lost)), allow_overwrite=True)
        except Exception as e:  # noqa: BLE001 - the others will find it themselves.
            logger.debug("Could not record the lost process(es): %s", e)
        return self._lost_message(lost)

    def _lost_message(self, lost: list[int]) -> str:
        """The error line for `lost`, naming the newest complete checkpoint on disk, read now."""
        checkpoint, known = None, False
        if self._complete_checkpoints is not None:
            try:
                checkpoint, known = max(self._complete_checkpoints(), default=None), True
            except Exception as e:  # noqa: BLE001 - an unreadable workdir: say less, still speak.
                logger.debug("Could not list the complete checkpoints: %s", e)
        return peer_lost_message(lost, self.num_processes, self.process_id, self.silence_limit_sec(),
                                 checkpoint, none_complete=known and checkpoint is None,
                                 stopping=self._stopping.is_set())

    def hurry(self, wait_sec: float | None = None) -> None:
        """This process failed (a collective's error, say): count silence as a stopping job does, and wait
        up to `wait_sec` (default: the stopping exit bound) for the watch to name a lost peer, which ends the
        process with its line before the caller writes its own. Returns when no peer is lost."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None and not self.finished:
            self._thread.join(self.timing.stopping_exit_bound_sec if wait_sec is None else wait_sec)

    def start(self) -> PeerWatchdog:
        """Starts the watching thread (a daemon: it never holds the process open)."""
        self._thread = threading.Thread(target=self._run, name="peer-watchdog", daemon=True)
        self._thread.start()
        # Registered after jax's own exit hooks, so it runs before them (atexit is last in, first out): a
        # call in flight when jax shuts its coordination client down aborts the process in C++.
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """On the way out (an exit, `leave`, a failure): after the round in flight, records that this
        process left, so the others do not take its silence for a death, then makes no more client calls."""
        self._exiting.set()
        self._wake.set()
        with self._round:
            if (client := self._client()) is not None:
                try:
                    client.key_value_set(f"{_WATCH_PREFIX}left/{self.process_id}", "1", allow_overwrite=True)
                except Exception as e:  # noqa: BLE001 - the service may be going; nothing to do.
                    logger.debug("Could not record leaving: %s", e)

    def _run(self) -> None:
        while not self.finished:
            with self._round:
                if self._exiting.is_set():
                    return
                message = self.check()
            if message is not None:  # Process 0 lets the others read the verdict before its service goes.
                linger = self.process_id == 0 and self.num_processes > 2
                _exit_with_error(message, linger_sec=2 * self.timing.poll_sec if linger else 0.0)
            stopping = self._stopping.is_set()
            self._wake.wait(self.timing.stopping_poll_sec if stopping else self.timing.poll_sec)
            self._wake.clear()


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None,
                     initialization_timeout_sec: int | None = None,
                     env: Mapping[str, str] | None = None, peer_timeout_sec: float | None = None,
                     complete_checkpoints: Callable[[], list[int]] | None = None
                     ) -> DistributedSettings | None:
    """Joins the job with `jax.distributed.initialize()` if `detect` finds one (call it before any JAX
    computation), then starts the peer watch: `peer_timeout_sec` as `resolve_peer_timeout_sec` reads it (0:
    none, JAX's own 100 s heartbeat abort); its line names the newest of `complete_checkpoints()`.
    `initialization_timeout_sec` None: `DEFAULT_INITIALIZATION_TIMEOUT_SEC`.

    Returns:
      The settings used, with the watchdog started, or None when the process runs alone.

    Raises:
      ValueError: incomplete or inconsistent settings, or a negative peer timeout.
      RuntimeError: the coordinator cannot be reached or started, or JAX raised while joining.
    """
    settings = detect(coordinator_address, num_processes, process_id, env)
    if settings is None:
        return None
    env = os.environ if env is None else env
    if initialization_timeout_sec is None:
        initialization_timeout_sec = DEFAULT_INITIALIZATION_TIMEOUT_SEC
    peer_timeout = resolve_peer_timeout_sec(peer_timeout_sec, env)
    timing = PeerTiming.for_timeout(peer_timeout)
    heartbeat = {"heartbeat_timeout_seconds": timing.jax_heartbeat_timeout_sec} if peer_timeout else {}
    address, index, count = settings.coordinator_address, settings.process_id, settings.num_processes
    where = address or "the address JAX detects"
    logger.info("Multi-process job (%s): joining the coordinator at %s as process %s of %s.", settings.reason,
                where, "?" if index is None else index, "?" if count is None else count)
    start = time.monotonic()
    bind_address = coordinator_bind_address(address, env)
    if address and index not in (None, 0):
        wait_for_coordinator(address, initialization_timeout_sec)
    elif address:
        try:
            check_coordinator_port(address, bind_address, slurm=_is_srun_step(env))
        except RuntimeError:
            stop_srun_step_peers(env)
            raise
    remaining_sec = max(1.0, initialization_timeout_sec - (time.monotonic() - start))
    logger.info("Waiting up to %.0f s for all processes to connect.", remaining_sec)
    # At its own deadline, a margin later, JAX's client aborts every waiting process (SIGABRT, a C++ trace).
    join_watch = threading.Timer(remaining_sec, _exit_with_error,
                                 args=(did_not_form_message(settings, initialization_timeout_sec),))
    join_watch.daemon = True
    join_watch.start()
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index,
                                   coordinator_bind_address=bind_address,
                                   initialization_timeout=int(remaining_sec) + timing.jax_margin_sec,
                                   **heartbeat)
    except Exception as e:  # noqa: BLE001 - XLA raises several types; all mean the job did not form.
        raise RuntimeError(
            f"Could not join the multi-process job ({settings.reason}) through the coordinator at {where} "
            f"within {initialization_timeout_sec} s: {e}\nCheck that process 0 is running and reachable at "
            "that host and port (firewall, hostname), that every process was started with the same "
            "coordinator and process count, and that process ids are distinct.") from e
    finally:
        join_watch.cancel()
    logger.info("Joined: process %d of %d, %d local of %d devices.", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    if not peer_timeout:
        return settings
    watchdog = PeerWatchdog(jax.process_index(), jax.process_count(), peer_timeout,
                            coordinator_address=address, complete_checkpoints=complete_checkpoints).start()
    logger.info("A process silent for %g s counts as lost: the others then stop within %g s (%s).",
                peer_timeout, timing.exit_bound_sec, ENV_PEER_TIMEOUT)
    return dataclasses.replace(settings, peer_watchdog=watchdog)


def blame_a_lost_peer(settings: DistributedSettings | None) -> None:
    """Call before a failing process writes its own error: if a peer died (gloo fails a collective at once
    on a reset connection), ends this process with the watchdog's line within the stopping exit bound;
    else returns, marked as leaving."""
    if settings is not None and settings.peer_watchdog is not None:
        settings.peer_watchdog.hurry()
        settings.peer_watchdog.stop()


def leave(settings: DistributedSettings | None) -> None:
    """Leaves the job before an immediate exit (`os._exit`, which runs no atexit hook): stops the peer
    watch's calls, then JAX's shutdown, whose barrier holds until every process reaches it, so that process
    0's coordination service outlives the others' last calls."""
    if settings is None:
        return
    if settings.peer_watchdog is not None:
        settings.peer_watchdog.stop()
    jax.distributed.shutdown()
