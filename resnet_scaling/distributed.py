"""Multi-process start-up: `jax.distributed.initialize()` when this process is one of several, else nothing.

A job is multi-process when (first match wins):
1. `--coordinator_address/--num_processes/--process_id`, or RESNET_SCALING_COORDINATOR /
   RESNET_SCALING_NUM_PROCESSES / RESNET_SCALING_PROCESS_ID (launch/local.py sets these), or
   JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID;
2. SLURM_NTASKS > 1, each process started by srun (`_slurm_settings`);
3. a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists several hosts; GKE sets it) or multislice job
   (MEGASCALE_COORDINATOR_ADDRESS): JAX finds its peers itself;
4. RESNET_SCALING_DISTRIBUTED=auto (launch/tpu_vm.sh sets it): JAX auto-detects any cluster it knows.
RESNET_SCALING_DISTRIBUTED=off forces a single process.

A job that does not form within `initialization_timeout_sec`, or later loses a process (kill -9, the
out-of-memory killer, a lost host) for RESNET_SCALING_PEER_TIMEOUT_SEC (default 60; 0: off), ends each
remaining process with one `error:` line naming the missing one and status 1 (80 s after a death by
default), not a hang or a C++ abort. Running the same command again resumes from the last complete checkpoint.
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
ENV_COORDINATOR = "RESNET_SCALING_COORDINATOR"
ENV_NUM_PROCESSES = "RESNET_SCALING_NUM_PROCESSES"
ENV_PROCESS_ID = "RESNET_SCALING_PROCESS_ID"
ENV_MODE = "RESNET_SCALING_DISTRIBUTED"  # "auto" or "off"
ENV_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"  # read by jax.distributed.initialize itself
# JAX is given this much longer than our own deadline, so that the watchdog below speaks first.
_JAX_TIMEOUT_MARGIN_SEC = 10
DEFAULT_PEER_TIMEOUT_SEC = 60
ENV_PEER_TIMEOUT = "RESNET_SCALING_PEER_TIMEOUT_SEC"
# Keys of the peer watchdog in the coordination service's key-value store.
_WATCH_PREFIX = "resnet_scaling/peer_watch/"
# Set by JAX's preemption sync manager when a process got SIGTERM (XLA's preemption_sync_manager.cc;
# read back with jax 0.10.2): the job is stopping.
JAX_PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
# Once the job is stopping, a peer silent this long is dead: live ones beat every STOPPING_POLL_SEC until
# they leave (`PeerWatchdog.stop`). Short enough to speak within SLURM's default KillWait (30 s), when srun
# --kill-on-bad-exit SIGTERMs the survivors of a dead task.
STOPPING_PEER_TIMEOUT_SEC = 10.0
STOPPING_POLL_SEC = 0.5


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How this process joins a multi-process job; None fields are left to JAX's cluster detection.

    Attributes:
      coordinator_address: "host:port" of process 0's coordinator service.
      process_id: this process's index in [0, num_processes).
      reason: what said the job is multi-process (for the log and error messages).
      peer_watchdog: the watchdog `maybe_initialize` started, if any.
    """

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    reason: str
    peer_watchdog: PeerWatchdog | None = dataclasses.field(default=None, compare=False, repr=False)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def _as_int(value: str | int | None, name: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}.") from None


def detect(coordinator_address: str | None = None, num_processes: int | None = None,
           process_id: int | None = None, env: Mapping[str, str] | None = None
           ) -> DistributedSettings | None:
    """Decides whether this process is one of several and how it finds the others (None: it is alone).

    Args:
      coordinator_address, num_processes, process_id: explicit settings (flags); win over the environment.

    Raises:
      ValueError: explicit settings that are incomplete or inconsistent, a non-integer count or id, or a
        SLURM task that srun did not start.
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
    if mode == "auto":
        return DistributedSettings(None, None, None, f"{ENV_MODE}=auto")
    return None


def _slurm_settings(env: Mapping[str, str], num_tasks: int) -> DistributedSettings:
    """The job as SLURM's variables describe it, with JAX's own coordinator rule made explicit so the log
    shows it and process 0 can check its port: the step's first node, port 61440 + job id % 4096 or
    JAX_COORDINATOR_PORT (jax/_src/clusters/slurm_cluster.py). JAX still detects SLURM for the rest (each
    task's GPU is its SLURM_LOCALID).

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


def _split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def coordinator_bind_address(coordinator_address: str | None, env: Mapping[str, str]) -> str | None:
    """Where process 0's coordinator listens; None leaves it to JAX (every interface, `[::]:PORT`).

    Measured with jax 0.10.2. A loopback coordinator address (launch/local.py: 127.0.0.1) binds to itself
    only, out of reach of other machines. JAX_COORDINATOR_BIND_ADDRESS, when set, wins."""
    if env.get(ENV_BIND_ADDRESS):
        return env[ENV_BIND_ADDRESS]
    if coordinator_address and _is_loopback(_split_address(coordinator_address)[0]):
        return coordinator_address
    return None


def check_coordinator_port(coordinator_address: str, bind_address: str | None, *,
                           slurm: bool = False) -> None:
    """Raises if something already listens at the coordinator address or holds the port process 0 binds.

    gRPC does not report a port in use: the process dies with SIGSEGV (jax 0.10.2), or, if the holder set
    SO_REUSEPORT too (another JAX job of this user), two jobs meet at one service. A non-listening
    SO_REUSEPORT socket (launch/local.py holding the port it chose) does not count.

    Raises:
      RuntimeError: naming the address and what to do.
    """
    host, port = _split_address(coordinator_address)
    choose = ("set JAX_COORDINATOR_PORT to a free port for every task of the job (JAX's default under SLURM "
              "is 61440 + job id % 4096)" if slurm else "choose another port for --coordinator_address "
              "(launch/local.py picks a free one when --port is not given)")
    advice = (f"Another program, or another job's coordinator, is using that port: {choose}, or stop that "
              "program.")
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
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


def did_not_form_message(settings: DistributedSettings, timeout_sec: float) -> str:
    """What to tell the user when the job's processes did not all connect within `timeout_sec`."""
    where = settings.coordinator_address or "the address JAX detected"
    num, index = settings.num_processes, settings.process_id
    job = f"the {num}-process job" if num else "the job"
    if index == 0 and num:
        if num == 2:
            missing, them, their = "process 1", "it", "its"
        else:
            missing, them, their = (f"at least one of processes 1..{num - 1} (JAX does not say which)",
                                    "each of them", "their")
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


def _exit_with_error(message: str, linger_sec: float = 0.0) -> None:
    """Writes `error: message` and ends the process `linger_sec` later, from any thread: the main thread
    may be blocked in C++ (joining, a collective, JAX's shutdown barrier), where nothing else would stop it
    before JAX's abort."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    if linger_sec:
        time.sleep(linger_sec)
    os._exit(1)


class _JoinWatchdog:
    """Ends the process with one `error:` line if the job has not formed by a deadline.

    At its own, longer timeout JAX's C++ client aborts every waiting process, uncatchably (SIGABRT, a C++
    stack trace, "DEADLINE_EXCEEDED ... RegisterTask"): this thread speaks first."""

    def __init__(self, timeout_sec: float, message: str) -> None:
        self._message = message
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(timeout_sec,), name="join-watchdog",
                                        daemon=True)
        self._thread.start()

    def _watch(self, timeout_sec: float) -> None:
        if self._finished.wait(timeout_sec):
            return
        with self._lock:
            if self._finished.is_set():
                return
            _exit_with_error(self._message)

    def cancel(self) -> None:
        with self._lock:
            self._finished.set()


def wait_for_coordinator(address: str, timeout_sec: float, poll_sec: float = 1.0) -> None:
    """Returns once a TCP connection to `address` ("host:port") succeeds.

    Else XLA's client aborts a non-zero process (SIGABRT) blaming "another task", hiding the cause.

    Raises:
      RuntimeError: nothing accepted connections at `address` within `timeout_sec`.
    """
    host, port = _split_address(address)
    host = host or "localhost"
    deadline = time.monotonic() + timeout_sec
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(poll_sec * 2, 5.0)):
                return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"Could not reach the coordinator at {address} within {timeout_sec:g} s ({error}). Check "
                "that process 0 is running and listening there (host, port, firewall), and that every "
                "process was given the same coordinator address.")
        time.sleep(poll_sec)


def _is_srun_step(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID") and env.get("SLURM_STEP_NODELIST"))


def stop_srun_step_peers(env: Mapping[str, str]) -> None:
    """Process 0 of an srun step that cannot start the job: ends the step's other tasks now (SIGTERM).

    Plain srun leaves them waiting out the initialisation timeout (SLURM 22.05: process 1 waited 300 s after
    process 0's error). This process ignores the signal: it exits with its own error line."""
    if not _is_srun_step(env) or shutil.which("scancel") is None:
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step = f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    try:
        subprocess.run(["scancel", "--signal=TERM", step], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        logger.debug("Could not cancel step %s: %s", step, e)


def resolve_peer_timeout_sec(value: float | None = None, env: Mapping[str, str] | None = None) -> float:
    """How long a silent peer is given before the job counts it as lost: `value` when given, else
    RESNET_SCALING_PEER_TIMEOUT_SEC, else 60 s. 0 turns the peer watchdog off.

    Raises:
      ValueError: a negative or non-numeric value.
    """
    env = os.environ if env is None else env
    if value is None:
        text = env.get(ENV_PEER_TIMEOUT, "")
        try:
            value = float(text) if text else DEFAULT_PEER_TIMEOUT_SEC
        except ValueError:
            raise ValueError(f"{ENV_PEER_TIMEOUT} must be a number of seconds, got {text!r}.") from None
    if value < 0:
        raise ValueError(f"The peer timeout must be >= 0 seconds (0 turns the watch off), got {value:g}.")
    return float(value)


def peer_poll_sec(timeout_sec: float) -> float:
    """How often the peer watchdog beats and looks at the others: a tenth of the timeout, 0.5 to 5 s."""
    return min(5.0, max(0.5, timeout_sec / 10))


def stopping_exit_bound_sec(timeout_sec: float) -> float:
    """The longest a survivor takes to name a peer that died once the job is stopping (a preemption
    notice, or a failure in this process): the peer's last beat, seen up to a normal poll before its
    death, plus the stopping timeout and two quick polls."""
    timeout = min(timeout_sec, STOPPING_PEER_TIMEOUT_SEC)
    return peer_poll_sec(timeout_sec) + timeout + 2 * STOPPING_POLL_SEC


def peer_exit_bound_sec(timeout_sec: float) -> float:
    """The longest a process takes to exit after a peer died, with a peer timeout of `timeout_sec`.

    Death up to a poll after the last beat, silence seen up to a poll late, then (3+ processes) process 0
    keeps the service up two more polls so that the others read the verdict, not JAX's abort."""
    return timeout_sec + 4 * peer_poll_sec(timeout_sec)


def jax_heartbeat_timeout_sec(timeout_sec: float) -> int:
    """JAX's heartbeat timeout for a peer timeout, so that the watchdog's line comes before JAX's abort.

    JAX beats every half timeout and counts from the last beat, so it can abort half a timeout after a death
    (jax 0.10.2, 8 s timeout, 6 random kills: aborts 4.5 to 8.8 s later): half must exceed the watchdog's
    bound."""
    return 2 * (math.ceil(peer_exit_bound_sec(timeout_sec)) + _JAX_TIMEOUT_MARGIN_SEC)


def _coordination_client() -> Any:
    """JAX's client of the coordination service, None when this process is alone or has shut it down.
    JAX has no public accessor for it; orbax's, which its own barriers use, is the maintained one."""
    if not ocp.multihost.is_jax_distributed_client_initialized():
        return None
    return ocp.multihost.get_jax_distributed_client()


def report_progress(step: int, checkpoint_step: int | None = None) -> None:
    """Records where training is, for a peer watchdog's error; does nothing in a single-process run.

    Args:
      step: the last step this process has done (dispatched is enough: "about").
      checkpoint_step: the newest checkpoint saved on every process, when it changed; None keeps the old one.
    """
    client = _coordination_client()
    if client is None:
        return
    index = jax.process_index()
    try:
        client.key_value_set(f"{_WATCH_PREFIX}step/{index}", str(int(step)), allow_overwrite=True)
        if checkpoint_step is not None:
            client.key_value_set(f"{_WATCH_PREFIX}checkpoint/{index}", str(int(checkpoint_step)),
                                 allow_overwrite=True)
    except Exception as e:  # noqa: BLE001 - progress is a courtesy; the watchdog reports the failure.
        logger.debug("Could not record the progress at step %d: %s", step, e)


def _names(indices: list[int]) -> str:
    return (f"process {indices[0]}" if len(indices) == 1 else
            "processes " + ", ".join(str(i) for i in indices[:-1]) + f" and {indices[-1]}")


def peer_lost_message(lost: list[int], num_processes: int, process_id: int, timeout_sec: float,
                      step: int | None = None, checkpoint_step: int | None = None,
                      none_complete: bool = False, stopping: bool = False) -> str:
    """The one line (without "error: ") that names the lost process(es) and says how to go on.

    Args:
      lost: the processes not heard from for `timeout_sec`.
      step: about where training was (the highest step any process reported), if known.
      checkpoint_step: the newest checkpoint complete on every process, if known.
      none_complete: known that no checkpoint is complete (the next launch starts from scratch).
      stopping: the job was stopping (a preemption notice, or a failure here), when silence counts sooner.
    """
    who = _names(sorted(lost))
    at_step = f" (lost at about step {step})" if step is not None else ""
    resume = (f"the last complete checkpoint (step {checkpoint_step})" if checkpoint_step is not None
              else "the start: no checkpoint is complete" if none_complete
              else "the last complete checkpoint, if there is one")
    why = "while the job was stopping" if stopping else ENV_PEER_TIMEOUT
    return (f"{who} of {num_processes} stopped responding{at_step}: no sign of life for {timeout_sec:g} s "
            f"({why}). It was killed (the out-of-memory killer sends SIGKILL), crashed, or lost "
            f"its host; its own output or the launcher's says which. This process (process {process_id}) "
            f"stops too, as the job cannot go on without it: run the same command to resume from {resume}.")


def coordinator_lost_message(num_processes: int, process_id: int, timeout_sec: float, error: Exception,
                             address: str | None = None) -> str:
    """The one line (without "error: ") for a coordination service that stopped answering."""
    where = f" at {address}" if address else ""
    return (f"process 0 of {num_processes}, which hosts the coordinator{where}, stopped answering for "
            f"{timeout_sec:g} s ({ENV_PEER_TIMEOUT}; last error: {str(error).splitlines()[0][:200]}). Read "
            f"process 0's output for why. This process (process {process_id}) stops too: run the same "
            "command to resume from the last complete checkpoint, if there is one.")


def _has_key(client: Any, key: str) -> bool:
    try:
        client.key_value_try_get(key)
    except Exception:  # noqa: BLE001 - NOT_FOUND (no notice), or the service unreachable.
        return False
    return True


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class PeerWatchdog:
    """Notices a process of the job that died, and ends this one with one `error:` line that names it.

    Else the others hang in their next collective (gloo, NCCL and ICI need every process), or fail and hang
    in JAX's shutdown barrier, until JAX's heartbeat timeout (100 s by default) aborts them uncatchably
    (SIGABRT, a C++ stack trace blaming "another task"; jax 0.10.2). JAX's `missed_heartbeat_callback`
    is unusable from Python (jaxlib 0.10.2: std::bad_cast converting its status, then terminate).

    A daemon thread beats a counter in the coordination service's key-value store every `peer_poll_sec` and
    reads everyone's, even while the main thread waits in C++ (which releases the GIL): a slow step, compile
    or checkpoint does not silence it. A counter unmoved for `timeout_sec` means lost. If process 0 dies, JAX
    ends the others within 0.2 s (SIGABRT, "Failed to send RPC to coordination service. Either the leader
    task was preempted/died..."), before this watchdog can speak.
    """

    def __init__(self, process_id: int, num_processes: int, timeout_sec: float, *,
                 client: Callable[[], Any] = _coordination_client,
                 clock: Callable[[], float] = time.monotonic, coordinator_address: str | None = None,
                 complete_checkpoints: Callable[[], list[int]] | None = None) -> None:
        self.process_id = process_id
        self.num_processes = num_processes
        self.timeout_sec = timeout_sec
        self.poll_sec = peer_poll_sec(timeout_sec)
        self.finished = False  # True once the client is shut down: the process is exiting normally.
        self._client = client
        self._clock = clock
        self._coordinator_address = coordinator_address
        self._complete_checkpoints = complete_checkpoints
        self._beats = 0
        now = clock()
        self._last_contact = now
        # Each peer's last counter value and when it changed; a peer not yet beating counts from now.
        self._seen: dict[int, tuple[str | None, float]] = {
            i: (None, now) for i in range(num_processes) if i != process_id}
        self._thread: threading.Thread | None = None
        self._entries: dict[str, str] = {}  # The watch keys as last read from the service.
        self._exiting = threading.Event()
        # Set once the job is stopping (a preemption notice, or `hurry`): STOPPING_* silence limit and poll.
        self._stopping = threading.Event()
        self._wake = threading.Event()  # Cuts the wait between rounds short.
        self._round = threading.Lock()  # Held during a round of calls to the coordination client.

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
                return None
            if now - self._last_contact > self.timeout_sec:
                return coordinator_lost_message(self.num_processes, self.process_id, self.timeout_sec, e,
                                                self._coordinator_address)
            return None
        self._last_contact = now
        if not self._stopping.is_set() and _has_key(client, JAX_PREEMPTION_NOTICE_KEY):
            self._stopping.set()
        lost = self._lost_by_notice(entries.get(f"{_WATCH_PREFIX}lost"))
        if not lost:
            for peer, (value, changed) in self._seen.items():
                current = entries.get(f"{_WATCH_PREFIX}beat/{peer}")
                if current != value:
                    self._seen[peer] = (current, now)
                elif f"{_WATCH_PREFIX}left/{peer}" in entries:
                    continue  # It stopped its watch on its way out (`stop`): not lost.
                elif now - changed > self.silence_limit_sec():
                    lost.append(peer)
            if lost:
                try:  # Every other process names the same process(es), whatever their clocks saw.
                    client.key_value_set(f"{_WATCH_PREFIX}lost", ",".join(map(str, lost)),
                                         allow_overwrite=True)
                except Exception as e:  # noqa: BLE001 - they will find it themselves.
                    logger.debug("Could not record the lost process(es): %s", e)
        self._entries = entries
        if not lost:
            return None
        return self._lost_message(lost)

    def _lost_message(self, lost: list[int]) -> str:
        """The error line for `lost`, with the newest reported step and the newest complete checkpoint, read
        from disk now where the run said how (the reported one lags a save completed since)."""
        newest = {}
        for kind in ("step", "checkpoint"):
            prefix = f"{_WATCH_PREFIX}{kind}/"
            values = [_int_or_none(v) for k, v in self._entries.items() if k.startswith(prefix)]
            newest[kind] = max((v for v in values if v is not None), default=None)
        checkpoint, known = newest["checkpoint"], False
        if self._complete_checkpoints is not None:
            try:
                checkpoint, known = max(self._complete_checkpoints(), default=None), True
            except Exception as e:  # noqa: BLE001 - an unreadable workdir: say less, still speak.
                logger.debug("Could not list the complete checkpoints: %s", e)
        return peer_lost_message(lost, self.num_processes, self.process_id, self.silence_limit_sec(),
                                 newest["step"], checkpoint, none_complete=known and checkpoint is None,
                                 stopping=self._stopping.is_set())

    def silence_limit_sec(self) -> float:
        """How long a peer may be silent before it counts as lost: the timeout, shorter once stopping."""
        if self._stopping.is_set():
            return min(self.timeout_sec, STOPPING_PEER_TIMEOUT_SEC)
        return self.timeout_sec

    def hurry(self, wait_sec: float | None = None) -> None:
        """This process failed (a collective's error, say): count silence as a stopping job does, and wait
        up to `wait_sec` (default: the stopping bound) for the watch to name a lost peer, which ends the
        process with its line. Returns when no peer is lost, for the caller's own error."""
        self._stopping.set()
        self._wake.set()
        if self._thread is None or self.finished:
            return
        self._thread.join(stopping_exit_bound_sec(self.timeout_sec) if wait_sec is None else wait_sec)

    def _lost_by_notice(self, notice: str | None) -> list[int]:
        indices = [_int_or_none(part) for part in (notice or "").split(",")]
        return [i for i in indices if i is not None and i != self.process_id]

    def start(self) -> PeerWatchdog:
        """Starts the watching thread (a daemon: it never holds the process open)."""
        self._thread = threading.Thread(target=self._run, name="peer-watchdog", daemon=True)
        self._thread.start()
        # Registered after jax's own exit hooks, so it runs before them (atexit is last in, first out): a
        # watch call still in flight when jax shuts its coordination client down aborts the process in C++.
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """On the way out (a normal exit, `leave`, a failure): after the round in flight, records that this
        process left, then makes no more client calls (jax is about to shut it down). The thread still ends
        the process, naming the stalest peer, if jax's shutdown barrier holds it past the bound."""
        self._exiting.set()
        self._wake.set()
        with self._round:
            client = self._client()
            if client is not None:  # The others' watch must not take this process's silence for death.
                try:
                    client.key_value_set(f"{_WATCH_PREFIX}left/{self.process_id}", "1", allow_overwrite=True)
                except Exception as e:  # noqa: BLE001 - the service may be going; nothing to do.
                    logger.debug("Could not record leaving: %s", e)

    def _run(self) -> None:
        while not self.finished:
            with self._round:
                message = None if self._exiting.is_set() else self.check()
            if self._exiting.is_set():
                self._end_if_exit_hangs()
                return
            if message is not None:
                # Process 0 lets the others read the notice before the service goes with it.
                _exit_with_error(message, linger_sec=2 * self.poll_sec
                                if self.process_id == 0 and self.num_processes > 2 else 0.0)
            self._wake.wait(STOPPING_POLL_SEC if self._stopping.is_set() else self.poll_sec)
            self._wake.clear()

    def _end_if_exit_hangs(self) -> None:
        if not self._seen:
            return
        stalest = min(self._seen, key=lambda peer: self._seen[peer][1])
        # Counted from the stalest peer's last sign of life, not the exit's start: a process that noticed a
        # dead peer late (a slowly failing collective) must still speak before JAX's heartbeat abort.
        last_sign_of_life = self._seen[stalest][1]
        time.sleep(max(0.0, last_sign_of_life + peer_exit_bound_sec(self.timeout_sec) - self._clock()))
        _exit_with_error(self._lost_message([stalest]))


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None,
                     initialization_timeout_sec: int = DEFAULT_INITIALIZATION_TIMEOUT_SEC,
                     env: Mapping[str, str] | None = None,
                     peer_timeout_sec: float | None = None,
                     complete_checkpoints: Callable[[], list[int]] | None = None
                     ) -> DistributedSettings | None:
    """Calls `jax.distributed.initialize()` if `detect` finds a multi-process job; call it before any JAX
    computation (the entry point's first step).

    Fails as the module docstring says; `peer_timeout_sec` is resolved by `resolve_peer_timeout_sec` (0: no
    watchdog, JAX's own 100 s heartbeat abort). `complete_checkpoints` lists the run's complete checkpoint
    steps, oldest first: the watchdog's line names the newest, read when it speaks.

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
    peer_timeout = resolve_peer_timeout_sec(peer_timeout_sec, env)
    heartbeat = {"heartbeat_timeout_seconds": jax_heartbeat_timeout_sec(peer_timeout)} if peer_timeout else {}
    where = settings.coordinator_address or "the address JAX detects"
    logger.info("Multi-process job (%s): joining the coordinator at %s as process %s of %s.", settings.reason,
                where, "?" if settings.process_id is None else settings.process_id,
                "?" if settings.num_processes is None else settings.num_processes)
    start = time.monotonic()
    bind_address = coordinator_bind_address(settings.coordinator_address, env)
    if settings.coordinator_address and settings.process_id not in (None, 0):
        wait_for_coordinator(settings.coordinator_address, initialization_timeout_sec)
    elif settings.coordinator_address:
        try:
            check_coordinator_port(settings.coordinator_address, bind_address, slurm=_is_srun_step(env))
        except RuntimeError:
            stop_srun_step_peers(env)
            raise
    remaining_sec = max(1.0, initialization_timeout_sec - (time.monotonic() - start))
    logger.info("Waiting up to %.0f s for all processes to connect.", remaining_sec)
    watchdog = _JoinWatchdog(remaining_sec, did_not_form_message(settings, initialization_timeout_sec))
    try:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator_address, num_processes=settings.num_processes,
            process_id=settings.process_id, coordinator_bind_address=bind_address,
            initialization_timeout=int(remaining_sec) + _JAX_TIMEOUT_MARGIN_SEC, **heartbeat)
    except Exception as e:  # noqa: BLE001 - XLA raises several types; all mean the job did not form.
        raise RuntimeError(
            f"Could not join the multi-process job ({settings.reason}) through the coordinator at {where} "
            f"within {initialization_timeout_sec} s: {e}\nCheck that process 0 is running and reachable at "
            "that host and port (firewall, hostname), that every process was started with the same "
            "coordinator and process count, and that process ids are distinct.") from e
    finally:
        watchdog.cancel()
    logger.info("Joined: process %d of %d, %d local of %d devices.", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    if peer_timeout:
        watchdog = PeerWatchdog(jax.process_index(), jax.process_count(), peer_timeout,
                                coordinator_address=settings.coordinator_address,
                                complete_checkpoints=complete_checkpoints).start()
        settings = dataclasses.replace(settings, peer_watchdog=watchdog)
        logger.info("A process silent for %g s counts as lost: the others then stop within %g s (%s).",
                    peer_timeout, peer_exit_bound_sec(peer_timeout), ENV_PEER_TIMEOUT)
    return settings


def blame_a_lost_peer(settings: DistributedSettings | None) -> None:
    """Before a failing process writes its own error: if a peer died (gloo fails a collective at once on a
    reset connection), ends this process with the watchdog's line within `stopping_exit_bound_sec`; else
    returns, marked as leaving. Without it a survivor printed the collective's traceback, then 77 s after
    the kill a watchdog line naming an outdated checkpoint (plain srun, SLURM 22.05)."""
    if settings is None or settings.peer_watchdog is None:
        return
    settings.peer_watchdog.hurry()
    settings.peer_watchdog.stop()


def leave(settings: DistributedSettings | None) -> None:
    """Leaves the job before an immediate exit (`os._exit`, which runs no atexit hook): stops the peer
    watchdog's calls, then JAX's shutdown, whose barrier waits until every process has reached it.

    When process 0 (the service's host) exited at once after a preemption's checkpoint, JAX aborted a peer
    still closing its input pipeline (SIGABRT; 3 of 8 preempted 2-task SLURM jobs ended FAILED). A peer
    dying meanwhile still ends this process within the watchdog's bound."""
    if settings is None:
        return
    if settings.peer_watchdog is not None:
        settings.peer_watchdog.stop()
    jax.distributed.shutdown()
