"""Multi-process start-up: `jax.distributed.initialize()` when this process is one of several, else nothing.

A job is multi-process when any of these says so (first match wins):

1. explicit settings: `--coordinator_address/--num_processes/--process_id` flags, or the environment
   variables RESNET_SCALING_COORDINATOR / RESNET_SCALING_NUM_PROCESSES / RESNET_SCALING_PROCESS_ID
   (launch/local.py sets these), or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID;
2. SLURM with more than one task (SLURM_NTASKS > 1): JAX reads the rest from SLURM's variables;
3. a Cloud TPU pod slice: TPU_WORKER_HOSTNAMES lists several hosts (GKE sets it), or a multislice job
   (MEGASCALE_COORDINATOR_ADDRESS): JAX finds its peers itself;
4. RESNET_SCALING_DISTRIBUTED=auto (launch/tpu_vm.sh sets it): let JAX auto-detect any cluster it knows.

RESNET_SCALING_DISTRIBUTED=off forces a single process. A process that cannot reach the coordinator fails
after `initialization_timeout_sec` with a message that says what to check, instead of hanging.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Mapping

import jax

logger = logging.getLogger(__name__)

DEFAULT_INITIALIZATION_TIMEOUT_SEC = 300
ENV_COORDINATOR = "RESNET_SCALING_COORDINATOR"
ENV_NUM_PROCESSES = "RESNET_SCALING_NUM_PROCESSES"
ENV_PROCESS_ID = "RESNET_SCALING_PROCESS_ID"
ENV_MODE = "RESNET_SCALING_DISTRIBUTED"  # "auto" or "off"


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How this process joins a multi-process job; None fields are left to JAX's cluster detection.

    Attributes:
      coordinator_address: "host:port" of process 0's coordinator service.
      num_processes: processes in the job.
      process_id: this process's index in [0, num_processes).
      reason: what said the job is multi-process (for the log and error messages).
    """

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    reason: str


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
      coordinator_address, num_processes, process_id: explicit settings (flags); they win over the
        environment.
      env: the environment to read (default: os.environ).

    Raises:
      ValueError: explicit settings that are incomplete or inconsistent.
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
    if slurm_tasks > 1 and env.get("SLURM_JOB_ID"):
        return DistributedSettings(None, None, None, f"SLURM job with {slurm_tasks} tasks")
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        return DistributedSettings(None, None, None, f"Cloud TPU pod slice with {len(hosts)} workers")
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return DistributedSettings(None, None, None, "Cloud TPU multislice job")
    if mode == "auto":
        return DistributedSettings(None, None, None, f"{ENV_MODE}=auto")
    return None


def wait_for_coordinator(address: str, timeout_sec: float, poll_sec: float = 1.0) -> None:
    """Returns once a TCP connection to `address` ("host:port") succeeds; raises after `timeout_sec`.

    Why: when a non-zero process cannot reach the coordinator, XLA's client aborts the whole process
    (SIGABRT) with a message blaming "another task", which hides the cause. Checking the port first turns
    that into a Python error that names the address.

    Raises:
      RuntimeError: nothing accepted connections at `address` within `timeout_sec`.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "localhost"
    deadline = time.monotonic() + timeout_sec
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(poll_sec * 2, 5.0)):
                return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"Could not reach the coordinator at {address} within {timeout_sec:g} s ({error}). Check "
                "that process 0 is running and listening there (host, port, firewall), and that every "
                "process was given the same coordinator address.")
        time.sleep(poll_sec)


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None,
                     initialization_timeout_sec: int = DEFAULT_INITIALIZATION_TIMEOUT_SEC,
                     env: Mapping[str, str] | None = None) -> DistributedSettings | None:
    """Calls `jax.distributed.initialize()` if `detect` finds a multi-process job; call it before any JAX
    computation (the entry point's first step).

    Returns:
      The settings used, or None when the process runs alone (nothing was initialised).

    Raises:
      RuntimeError: the job's processes did not all connect within `initialization_timeout_sec`.
    """
    settings = detect(coordinator_address, num_processes, process_id, env)
    if settings is None:
        return None
    where = settings.coordinator_address or "the address JAX detects"
    logger.info("Multi-process job (%s): joining the coordinator at %s as process %s of %s.", settings.reason,
                where, "?" if settings.process_id is None else settings.process_id,
                "?" if settings.num_processes is None else settings.num_processes)
    start = time.monotonic()
    if settings.coordinator_address and settings.process_id not in (None, 0):
        wait_for_coordinator(settings.coordinator_address, initialization_timeout_sec)
    remaining_sec = max(1, int(initialization_timeout_sec - (time.monotonic() - start)))
    # If the other processes never connect, XLA aborts this process after the timeout with
    # DEADLINE_EXCEEDED; this line says what that means.
    logger.info("Waiting up to %d s for all processes to connect; an abort with DEADLINE_EXCEEDED after "
                "that means some process never reached %s.", remaining_sec, where)
    try:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator_address, num_processes=settings.num_processes,
            process_id=settings.process_id, initialization_timeout=remaining_sec)
    except Exception as e:  # noqa: BLE001 - XLA raises several types; all mean the job did not form.
        raise RuntimeError(
            f"Could not join the multi-process job ({settings.reason}) through the coordinator at {where} "
            f"within {initialization_timeout_sec} s: {e}\nCheck that process 0 is running and reachable at "
            "that host and port (firewall, hostname), that every process was started with the same "
            "coordinator and process count, and that process ids are distinct.") from e
    logger.info("Joined: process %d of %d, %d local of %d devices.", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    return settings
