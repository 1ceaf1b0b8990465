#!/usr/bin/env python3
"""Run one command as N cooperating processes on this machine: a multi-host job without the hosts.

    python launch/local.py --num_processes=2 --cpu_devices_per_process=2 -- \
        python -m resnet_scaling.train --config=configs/demo.py --workdir=/tmp/demo2

Each process gets RESNET_SCALING_COORDINATOR=127.0.0.1:PORT, RESNET_SCALING_NUM_PROCESSES and
RESNET_SCALING_PROCESS_ID, which `resnet_scaling.job.distributed.maybe_initialize` reads, and
JAX_COORDINATOR_BIND_ADDRESS=127.0.0.1:PORT, so that process 0's coordinator listens on the loopback
interface only (JAX's default is every interface). Without --port, the launcher binds a free port with
SO_REUSEPORT (without listening) and holds it until the job ends: no other program, and no outgoing
connection, can take it between the choice and process 0's start, and JAX's gRPC server, which sets
SO_REUSEPORT too, binds beside it. With --cpu_devices_per_process, processes run on the CPU with that many
devices each and gloo collectives, so the multi-process code paths run anywhere (tests/job/test_distributed.py
uses this). Output lines are prefixed with the process id.

If a process fails, the launcher names it (process id, OS pid, exit status or signal) and what that
usually means, stops the others and exits with the failure's status (128 + N for signal N). SIGTERM or
SIGINT to the launcher is forwarded to every process (SIGTERM asks the trainer to save a checkpoint and
stop); the launcher waits up to --stop_timeout_sec for them, kills what is left, and exits 128 + the
signal's number. A second signal kills at once. Standard library only.
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

HOST = "127.0.0.1"
FAILURE_STOP_TIMEOUT_SEC = 10  # After a failure the job is broken: the others get this long to exit.

# What a death by signal usually means, and what to do about it.
_SIGNAL_HINTS = {
    signal.SIGKILL: "usually the kernel's out-of-memory killer (see `dmesg`); fewer processes, fewer CPU "
                    "devices per process or a smaller batch need less memory",
    signal.SIGABRT: "JAX/XLA aborted it (look for 'Check failed' or 'Terminating process' in its output); "
                    "when another process died first JAX aborts the rest, so read the earliest failure",
    signal.SIGSEGV: "a crash in native code (XLA, gloo, a data library); its last output lines show where",
    signal.SIGTERM: "something outside the launcher stopped it",
    signal.SIGINT: "something outside the launcher interrupted it",
}


def reserve_port(host: str = HOST) -> socket.socket:
    """A socket bound to a free port on `host`, not listening; keep it open while the job runs.

    SO_REUSEPORT lets the coordinator (gRPC sets it as well) bind the same port while this socket holds it;
    a program that does not set it gets EADDRINUSE, and the kernel never hands the port to an outgoing
    connection. Without SO_REUSEPORT (not Linux or BSD), the socket is plain and must be closed before
    process 0 starts, which leaves the old bind-and-close race.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if hasattr(socket, "SO_REUSEPORT"):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, 0))
    return s


def process_env(process_id: int, num_processes: int, coordinator: str, cpu_devices_per_process: int,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of process `process_id`."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RESNET_SCALING_COORDINATOR": coordinator,
        "RESNET_SCALING_NUM_PROCESSES": str(num_processes),
        "RESNET_SCALING_PROCESS_ID": str(process_id),
        "JAX_COORDINATOR_BIND_ADDRESS": coordinator,  # read by jax.distributed.initialize
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


def exit_status(returncode: int) -> int:
    """The shell's convention: a process killed by signal N has status 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(process_id: int, pid: int, returncode: int) -> str:
    """One sentence: which process ended how, and what that usually means."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        hint = _SIGNAL_HINTS.get(-returncode, "something outside the launcher killed it")
        return f"process {process_id} (pid {pid}) was killed by {name} (signal {-returncode}): {hint}."
    return (f"process {process_id} (pid {pid}) exited with status {returncode}: its error is in the lines "
            f"prefixed [{process_id}] above.")


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, ""):
        sink.write(f"{prefix}{line}")
        sink.flush()


def _say(message: str) -> None:
    print(f"launch/local.py: {message}", file=sys.stderr, flush=True)


def _stop(procs: list[subprocess.Popen], signum: int, timeout_sec: float, received: list[int]) -> None:
    """Sends `signum` to every running process, waits up to `timeout_sec` (less if another signal reaches
    the launcher), then kills what is left."""
    signals_before = len(received)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signum)  # each process leads its own session
    deadline = time.monotonic() + timeout_sec
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or len(received) > signals_before:
            left = [i for i, p in enumerate(procs) if p.poll() is None]
            _say(f"killing process(es) {', '.join(map(str, left))}, still running.")
            for i in left:
                try:
                    os.killpg(procs[i].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.1)
    for p in procs:
        p.wait()


def run(command: list[str], num_processes: int, *, cpu_devices_per_process: int = 0, port: int = 0,
        timeout_sec: float = 0, stop_timeout_sec: float = 30, cwd: str | None = None) -> int:
    """Starts `command` `num_processes` times, streams their output, and returns the job's exit status.

    Args:
      command: the program and its arguments.
      num_processes: processes to start (ids 0..N-1; 0 hosts the coordinator).
      cpu_devices_per_process: > 0 runs on the CPU with that many devices per process.
      port: the coordinator's port (0: a free one, held by the launcher while the job runs).
      timeout_sec: stop every process after this long (0: no limit); returns 124 then.
      stop_timeout_sec: after forwarding SIGTERM/SIGINT, how long to wait before killing.
      cwd: working directory of the processes.

    Returns:
      0, the first failing process's status (128 + N for signal N), 124 on timeout, or 128 + N when the
      launcher received signal N.
    """
    reserved = None
    if not port:
        reserved = reserve_port()
        port = reserved.getsockname()[1]
        if not hasattr(socket, "SO_REUSEPORT"):
            reserved.close()
    coordinator = f"{HOST}:{port}"
    received: list[int] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, lambda s, _: received.append(s))
    procs, pumps = [], []
    status, stop_signal, stop_timeout = 0, signal.SIGTERM, FAILURE_STOP_TIMEOUT_SEC
    try:
        for i in range(num_processes):
            proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=process_env(i, num_processes, coordinator,
                                                               cpu_devices_per_process),
                                    start_new_session=True)
            pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{i}] ", sys.stdout), daemon=True)
            pump.start()
            procs.append(proc)
            pumps.append(pump)
        deadline = time.monotonic() + timeout_sec if timeout_sec > 0 else None
        while True:
            if received:
                stop_signal, stop_timeout = received[0], stop_timeout_sec
                status = 128 + stop_signal
                running = sum(p.poll() is None for p in procs)
                _say(f"got {signal.Signals(stop_signal).name}; forwarded it to the {running} running "
                     f"process(es); waiting up to {stop_timeout_sec:g} s for them to stop (another signal "
                     "kills them at once).")
                break
            codes = [p.poll() for p in procs]  # poll every process: any() would stop at the first
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                for i in failed:
                    _say(describe_exit(i, procs[i].pid, codes[i]))
                status = exit_status(codes[failed[0]])
                if any(code is None for code in codes):
                    _say("stopping the other processes; fix the cause above and start the job again.")
                break
            if all(code is not None for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                _say(f"timed out after {timeout_sec:g} s; stopping all processes.")
                status = 124
                break
            time.sleep(0.2)
    finally:
        _stop(procs, stop_signal, stop_timeout, received)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        if reserved is not None:
            reserved.close()
        for pump in pumps:
            pump.join(timeout=5)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--cpu_devices_per_process", type=int, default=0,
                        help="Run on the CPU with this many devices per process (0: the machine's backend).")
    parser.add_argument("--port", type=int, default=0,
                        help="Coordinator port (default: a free one, held while the job runs).")
    parser.add_argument("--timeout_sec", type=float, default=0, help="Stop everything after this long.")
    parser.add_argument("--stop_timeout_sec", type=float, default=30,
                        help="After forwarding SIGTERM/SIGINT, wait this long before killing the processes.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run.")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    return run(command, args.num_processes, cpu_devices_per_process=args.cpu_devices_per_process,
               port=args.port, timeout_sec=args.timeout_sec, stop_timeout_sec=args.stop_timeout_sec)


if __name__ == "__main__":
    sys.exit(main())
