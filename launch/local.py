#!/usr/bin/env python3
"""Run one command as N cooperating processes on this machine: a multi-host job without the hosts.

    python launch/local.py --num_processes=2 --cpu_devices_per_process=2 -- \
        python -m resnet_scaling.train --config=configs/demo.py --workdir=/tmp/demo2

Each process gets RESNET_SCALING_COORDINATOR=127.0.0.1:PORT (a free port), RESNET_SCALING_NUM_PROCESSES
and RESNET_SCALING_PROCESS_ID, which `resnet_scaling.distributed.maybe_initialize` reads. With
--cpu_devices_per_process, processes run on the CPU with that many devices each and gloo collectives,
so the multi-process code paths run anywhere (tests/test_distributed.py uses this). Output lines are
prefixed with the process id. If one process fails, the others are stopped; the exit status is the
first failure's. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(process_id: int, num_processes: int, coordinator: str, cpu_devices_per_process: int,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of process `process_id`."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RESNET_SCALING_COORDINATOR": coordinator,
        "RESNET_SCALING_NUM_PROCESSES": str(num_processes),
        "RESNET_SCALING_PROCESS_ID": str(process_id),
        "PYTHONUNBUFFERED": "1",
    })
    if cpu_devices_per_process > 0:
        # JAX reads its config options from upper-case environment variables of the same name.
        env.update({"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(cpu_devices_per_process),
                    "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"})
        # A forced host device count would override JAX_NUM_CPU_DEVICES.
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, ""):
        sink.write(f"{prefix}{line}")
        sink.flush()


def run(command: list[str], num_processes: int, *, cpu_devices_per_process: int = 0, port: int = 0,
        timeout_sec: float = 0, cwd: str | None = None) -> int:
    """Starts `command` `num_processes` times, streams their output, and returns the job's exit status.

    Args:
      command: the program and its arguments.
      num_processes: processes to start (ids 0..N-1; 0 hosts the coordinator).
      cpu_devices_per_process: > 0 runs on the CPU with that many devices per process.
      port: the coordinator's port (0: a free one).
      timeout_sec: stop every process after this long (0: no limit); returns 124 then.
      cwd: working directory of the processes.
    """
    coordinator = f"127.0.0.1:{port or free_port()}"
    procs, pumps = [], []
    for i in range(num_processes):
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=process_env(i, num_processes, coordinator, cpu_devices_per_process),
                                start_new_session=True)
        pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{i}] ", sys.stdout), daemon=True)
        pump.start()
        procs.append(proc)
        pumps.append(pump)
    deadline = time.monotonic() + timeout_sec if timeout_sec > 0 else None
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]  # poll every process: any() would stop at the first
            if all(code is not None for code in codes):
                break
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"launch/local.py: timed out after {timeout_sec:g} s; stopping all processes.",
                      file=sys.stderr)
                status = 124
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)  # each process leads its own session
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pump in pumps:
            pump.join(timeout=5)
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--cpu_devices_per_process", type=int, default=0,
                        help="Run on the CPU with this many devices per process (0: the machine's backend).")
    parser.add_argument("--port", type=int, default=0, help="Coordinator port (default: a free one).")
    parser.add_argument("--timeout_sec", type=float, default=0, help="Stop everything after this long.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run.")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    return run(command, args.num_processes, cpu_devices_per_process=args.cpu_devices_per_process,
               port=args.port, timeout_sec=args.timeout_sec)


if __name__ == "__main__":
    sys.exit(main())
