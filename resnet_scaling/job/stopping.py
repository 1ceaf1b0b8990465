"""Stopping at any moment: a Ctrl-C or a SIGTERM ends every phase of a command within seconds, in one line.

A command installs `StopSignals` before its slow imports; the code that runs a phase names it, and says
whether a stop there keeps work (`phase`):

- a phase with nothing to keep (the imports, the input's set-up, a restore, compiling, an evaluation
  command) ends the process at once: one line naming the phase and what is safe, the `on_stop` cleanups
  (the workdir's lock), exit status `STOPPED_EXIT_STATUS`;
- a phase that keeps work (the training loop, a save, the export) runs on to where it can stop: the loop
  saves at the next step and ends, an evaluation in the loop is abandoned (`requested`).

A second Ctrl-C ends the process at once, status `FORCED_EXIT_STATUS`. SIGINT and SIGTERM act alike.

Python runs a signal handler on the main thread only, between bytecodes: a main thread inside XLA's compiler
(minutes, in C++) would not get there until the compile ends. So a command's handler is also woken through
`signal.set_wakeup_fd` on a thread of its own, which acts at once. A stop in code that only imports the
library (a notebook) never ends the process: `install(exit_process=False)` only records the request.

Signals belong to the process, so the handler itself is where the installed `StopSignals` lives
(`current()` reads it from `signal.getsignal`): library code finds it without a global of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

# An orderly stop (nothing lost; the last line says where it stopped) exits as a finished run does, for
# SIGINT and SIGTERM alike: a multi-process job's schedulers (srun --kill-on-bad-exit) must not kill the
# other processes while they save the same checkpoint.
STOPPED_EXIT_STATUS = 0
# A second Ctrl-C: what a shell reports for a process ended by SIGINT (128 + 2).
FORCED_EXIT_STATUS = 130
# A Ctrl-C this soon after the first is the same key press, delivered twice (seen with one SIGINT sent to
# a process that had loaded TensorFlow), not a second one.
SECOND_CTRL_C_AFTER_SEC = 0.5
# The most the cleanups (and logging's flush) may take once a stop ends the process.
EXIT_DEADLINE_SEC = 5.0
NOTHING_WRITTEN = "nothing was written; rerun the same command to start (or resume)"
FORCED_SAFE = "the newest complete checkpoint, if any, resumes with the same command"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclasses.dataclass(frozen=True)
class Phase:
    """What the process is doing ("compiling the train step") and what a stop there does.

    Attributes:
      doing: the words after "while" in the stop's line.
      then: for a phase that keeps work, what happens after a stop ("saving a checkpoint at the next step");
        None: the process ends at once.
    """

    doing: str
    then: str | None = None


class StopSignals:
    """SIGINT and SIGTERM for the whole process (see the module docstring); `install` it, don't construct."""

    def __init__(self, *, exit_process: bool, doing: str, safe: str) -> None:
        self._exit_process = exit_process
        self._phases = [Phase(doing)]
        self._safe = safe
        self._cleanups: list[Callable[[], None]] = []
        self._requested = threading.Event()
        self._lock = threading.RLock()
        self._previous_handlers: dict[int, Any] = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup_fd = -1
        self._console_fd = 2
        self.signal_name: str | None = None
        self._first_signal_time = 0.0
        # Multi-process jobs: JAX's preemption notice (which picks one step for every process) listens to
        # SIGTERM only; a Ctrl-C in a phase that keeps work is passed on to it as one.
        self.forward_sigint_as_sigterm = False

    @classmethod
    def install(cls, *, exit_process: bool = True, doing: str = "starting", safe: str = NOTHING_WRITTEN,
                take_sigterm: bool = True) -> StopSignals:
        """Takes SIGINT and SIGTERM for this process (from the main thread).

        Args:
          exit_process: a command's: a stop in a phase that keeps nothing ends the process. False (library
            code): a stop is only recorded, for the loop to act on.
          doing: the phase it starts in.
          safe: what is safe if it stops now (the end of the stop's line).
          take_sigterm: False leaves SIGTERM to its handler (a joined job's: JAX's preemption notice).
        """
        stop = cls(exit_process=exit_process, doing=doing, safe=safe)
        for signum in _SIGNALS if take_sigterm else (signal.SIGINT,):
            stop._previous_handlers[signum] = signal.signal(signum, stop._handle)
        if exit_process:
            # The console as the command started: native code may point fd 2 elsewhere for a while (the
            # TensorFlow import's filter, job/tf_import.py), and a stop then must still be seen.
            stop._console_fd = os.dup(2)
            reader, writer = socket.socketpair()
            writer.setblocking(False)
            stop._wakeup = (reader, writer)
            stop._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            threading.Thread(target=stop._watch, name="stop-signals", daemon=True).start()
        return stop

    @staticmethod
    def current() -> StopSignals | None:
        """The `StopSignals` installed in this process, or None."""
        owner = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        return owner if isinstance(owner, StopSignals) else None

    def uninstall(self) -> None:
        """SIGINT and SIGTERM act as before `install` (main thread)."""
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    @property
    def requested(self) -> bool:
        """Whether a stop came in (the loop saves and stops; an evaluation in the loop is abandoned)."""
        return self._requested.is_set()

    def set_safe(self, safe: str) -> None:
        """What is safe if the process stops now ("its checkpoint of step 40 is intact; rerun ...")."""
        self._safe = safe

    @contextlib.contextmanager
    def phase(self, doing: str, *, then: str | None = None) -> Iterator[StopSignals]:
        """The block is phase `doing`; `then`: it keeps work, and a stop runs on to what `then` says."""
        with self._lock:
            self._phases.append(Phase(doing, then))
            stop_now = then is None and self.requested  # A stop that came as the last phase ended.
        # With --verbosity=1: where a stop would land. Logged once the phase is entered, so that a stop sent
        # on seeing the line lands in it.
        logger.debug("Phase: %s.", doing)
        if stop_now:
            self._stop_now(f"Stopped ({self.signal_name}) while {doing}: {self._safe}.", STOPPED_EXIT_STATUS)
        try:
            yield self
        finally:
            with self._lock:
                self._phases.pop()

    @contextlib.contextmanager
    def on_stop(self, cleanup: Callable[[], None]) -> Iterator[None]:
        """Runs `cleanup` (quick, from any thread) if a stop ends the process inside the block."""
        with self._lock:
            self._cleanups.append(cleanup)
        try:
            yield
        finally:
            with self._lock:
                self._cleanups.remove(cleanup)

    def _handle(self, signum: int, frame: Any) -> None:
        """Python's handler (main thread, when it next runs bytecode). A command's watcher thread has
        already acted, unless another library took the wakeup fd since."""
        if self._wakeup is not None:
            ours = self._wakeup[1].fileno()
            previous = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
            if previous == ours:
                return
        self._received(signum)

    def _watch(self) -> None:
        """The watcher thread: each byte on the wakeup fd is a signal's number."""
        reader = self._wakeup[0]
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return  # Uninstalled.
            if not data:
                return
            for signum in data:
                if signum in _SIGNALS:
                    self._received(signum)

    def _received(self, signum: int) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            first = not self._requested.is_set()
            if not first and (signum != signal.SIGINT
                              or time.monotonic() - self._first_signal_time < SECOND_CTRL_C_AFTER_SEC):
                return  # A repeated SIGTERM (srun, a scheduler), or one delivered twice: the stop goes on.
            if first:
                self.signal_name = name
                self._first_signal_time = time.monotonic()
                self._requested.set()
            phase = self._phases[-1]
        if not first:
            self._force_stop(phase)
        elif phase.then is None and self._exit_process:
            self._stop_now(f"Stopped ({name}) while {phase.doing}: {self._safe}.", STOPPED_EXIT_STATUS)
        elif phase.then is not None:
            self._say(f"{name} while {phase.doing}: {phase.then} (Ctrl-C again stops at once).")
            if self.forward_sigint_as_sigterm and signum == signal.SIGINT:
                os.kill(os.getpid(), signal.SIGTERM)

    def _say(self, message: str) -> None:
        """A stop's line. A command's goes straight to the console it started with, as the console shows a
        line ("21:04:05 ..."), and to the log files: no logging lock, console handler or redirected fd 2
        stands between the line and the user. Library code's: logged."""
        if not self._exit_process:
            logger.info("%s", message)
            return
        os.write(self._console_fd, f"{time.strftime('%H:%M:%S')} {message}\n".encode())
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, None, None)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):  # WORKDIR/logs/, as every other line.
                handler.handle(record)

    def _force_stop(self, phase: Phase) -> None:
        message = f"Stopped at once (a second Ctrl-C) while {phase.doing}: {FORCED_SAFE}."
        if self._exit_process:
            self._stop_now(message, FORCED_EXIT_STATUS)
        # Library code (main thread): what Python does by default.
        self.uninstall()
        raise KeyboardInterrupt(message)

    def _stop_now(self, message: str, status: int) -> None:
        """Says `message`, runs the cleanups and ends the process, within `EXIT_DEADLINE_SEC` whatever a
        cleanup or another thread holds."""
        deadline = threading.Timer(EXIT_DEADLINE_SEC, os._exit, args=(status,))
        deadline.daemon = True
        deadline.start()
        self._say(message)
        # The main thread runs on meanwhile: whatever it prints now (an error of a phase cut short) would
        # bury the line above. The log file keeps it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):  # A stream without a file (captured): nothing to silence.
                pass
        with self._lock:
            cleanups = list(reversed(self._cleanups))
        for cleanup in cleanups:
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - the stop goes on; the next run sees what is left.
                logger.debug("A cleanup failed on the way out.", exc_info=True)
        logging.shutdown()  # The log file's last lines.
        os._exit(status)




@contextlib.contextmanager
def phase(doing: str, *, then: str | None = None) -> Iterator[StopSignals | None]:
    """`StopSignals.phase` on the installed `StopSignals`, if any (library code runs without one)."""
    stop = StopSignals.current()
    if stop is None:
        yield None
        return
    with stop.phase(doing, then=then):
        yield stop


@contextlib.contextmanager
def on_stop(cleanup: Callable[[], None]) -> Iterator[None]:
    """`StopSignals.on_stop` on the installed `StopSignals`, if any."""
    stop = StopSignals.current()
    if stop is None:
        yield
        return
    with stop.on_stop(cleanup):
        yield


def set_safe(safe: str) -> None:
    """`StopSignals.set_safe` on the installed `StopSignals`, if any."""
    if (stop := StopSignals.current()) is not None:
        stop.set_safe(safe)
