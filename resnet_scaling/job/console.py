"""What a command shows on the console: our progress lines, other libraries' warnings, and a bounded exit
after an error line.

The library logs through `logging.getLogger("resnet_scaling.<module>")`; command-line entry points call
`configure_command_line_logging()` after absl has parsed the flags. Research code that calls
`train_and_evaluate` without configuring logging still sees progress (`show_progress()`).

Another library's traceback (orbax logs several per failed save, dozens of lines each) shows on the console
as its one message line, the whole record going to WORKDIR/logs/, so that the library's own `error:` line
is not buried and nothing is lost; so do the tracebacks of a failed save's writes that outlived it (see
`_log_unraisable`). A failed command ends within `EXIT_GRACE_SEC` of its `error:` line
(`exit_after_error`), whatever threads another library left waiting. Reading the command line is
config/command_line.py's; the headline that ends a run, metrics/summary.py's.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

LIBRARY_LOGGER = "resnet_scaling"
# The name of the handler `show_progress` gives our logger.
PROGRESS_HANDLER = "resnet_scaling.progress"
# How long a failed command waits for other threads (an orbax save in flight) after its error line.
EXIT_GRACE_SEC = 10.0


def configure_command_line_logging(workdir: str | None = None) -> str | None:
    """Our progress at INFO, other libraries at WARNING (orbax writes a dozen INFO lines per checkpoint),
    unless absl's `--verbosity` asks for more (0: every library's INFO lines, 1: their debug lines too).

    With a local `workdir`, every record also goes whole to WORKDIR/logs/<host>-<pid>.log, and the console
    shows other libraries' tracebacks as one line pointing there. Returns the log file's path, or None.
    """
    from absl import flags
    from absl import logging as absl_logging

    if flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(flags.FLAGS.verbosity)
        logging.getLogger(LIBRARY_LOGGER).setLevel(min(logging.INFO, logging.root.level))
    else:
        absl_logging.set_verbosity(absl_logging.WARNING)  # The root logger: every other library.
        logging.getLogger(LIBRARY_LOGGER).setLevel(logging.INFO)
    log_file = _open_log_file(workdir)
    if not flags.FLAGS["verbosity"].present:  # --verbosity: absl's own prefixes, for debugging.
        console_handler = absl_logging.get_absl_handler().python_handler
        console_handler.setFormatter(ConsoleFormatter(log_file))
        if log_file is not None:
            console_handler.addFilter(_not_file_only)
            sys.unraisablehook = functools.partial(_log_unraisable, sys.unraisablehook)
    return log_file


# The exception of a callback that reaches an asyncio event loop its owner has closed.
_CLOSED_LOOP_MESSAGE = "Event loop is closed"
# A record with this attribute set goes to the log file, not the console.
_FILE_ONLY = "resnet_scaling_file_only"


def _not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, _FILE_ONLY, False)


def _log_unraisable(previous_hook: Callable[[Any], None], unraisable: Any) -> None:
    """`sys.unraisablehook` for a command with a log file: a callback that found its event loop closed goes
    to the log file whole, not to the console; any other exception Python cannot raise goes to
    `previous_hook` (the one before: Python's prints it).

    When a checkpoint's write fails (a full disk), orbax closes that save's event loop while TensorStore's
    other writes of the save are still running; each of those, finishing, calls back into the closed loop,
    and Python prints the RuntimeError it raises: dozens of tracebacks above the run's `error:` line.
    """
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == _CLOSED_LOOP_MESSAGE):
        previous_hook(unraisable)
        return
    where = "" if unraisable.object is None else f" in: {unraisable.object!r}"
    logging.getLogger("asyncio").warning(
        "Exception ignored%s (a callback after its event loop was closed: a write that outlived a failed "
        "save)", where, exc_info=(unraisable.exc_type, error, unraisable.exc_traceback),
        extra={_FILE_ONLY: True})


def _open_log_file(workdir: str | None) -> str | None:
    if not workdir or "://" in workdir:
        return None  # An object store has no appendable files; --verbosity shows everything instead.
    path = os.path.join(os.path.abspath(workdir), "logs", f"{socket.gethostname()}-{os.getpid()}.log")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None  # The workdir check reports an unwritable workdir in its own words.
    from absl import logging as absl_logging

    handler.setFormatter(absl_logging.PythonFormatter())
    logging.root.addHandler(handler)
    return path


class ConsoleFormatter(logging.Formatter):
    """What the console shows of a record: the time of day and the message ("21:04:05 step 25/563 ..."),
    "warning:" or "error:" before a warning or an error (with the library's name when it is not ours).
    absl's prefix (level, date, thread id, file and line) stays in WORKDIR/logs/. Another library's
    traceback prints as its one message line pointing at `log_file` (None: whole)."""

    def __init__(self, log_file: str | None = None) -> None:
        super().__init__()
        self._log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        ours = record.name.split(".")[0] == LIBRARY_LOGGER
        text = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
        if record.levelno >= logging.WARNING:
            text += "error" if record.levelno >= logging.ERROR else "warning"
            text += ": " if ours else f" ({record.name.split('.')[0]}): "
        text += record.getMessage()
        if record.exc_info:
            if ours or self._log_file is None:
                text += "\n" + self.formatException(record.exc_info)
            else:
                text += f" [traceback: {self._log_file}]"
        return text


def exit_after_error(message: str, code: int = 1) -> None:
    """Prints `message` (one `error:` line), then ends the process within `EXIT_GRACE_SEC`: other threads
    get that long to finish (a save in flight), and one that waits on a save that already failed (orbax's
    signalling threads) cannot hold the process open."""
    print(message, file=sys.stderr, flush=True)
    deadline = time.monotonic() + EXIT_GRACE_SEC
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            try:
                thread.join(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - orbax's threads raise TimeoutError from join(timeout).
                pass
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


def show_progress() -> None:
    """Makes our INFO lines visible, with the time of day, to code that set nothing up (a notebook, a
    script): our logger goes to INFO unless its level was set (`logging.getLogger("resnet_scaling")
    .setLevel(logging.WARNING)` silences it), and gets a handler of its own unless logging was configured.

    A bare `logging.basicConfig()` on the root logger counts as nothing set up: absl calls it at its first
    log line when the root has no handler (orbax logs one at import), and its lines carry no time
    ("INFO:resnet_scaling.training.trainer:step ..."). Ours then keeps our lines from it, not to print them
    twice; a handler configured later (on our logger, or any other on the root) takes them back at the next
    run."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    ours = [h for h in logger.handlers if h.get_name() == PROGRESS_HANDLER]
    configured = len(ours) < len(logger.handlers) or not all(map(_is_bare_default, logging.root.handlers))
    if configured:
        for handler in ours:
            logger.removeHandler(handler)
        if ours:
            logger.propagate = True
        return
    if not ours:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(PROGRESS_HANDLER)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        logger.addHandler(handler)
    logger.propagate = False


def _is_bare_default(handler: logging.Handler) -> bool:
    """Whether `handler` is what `logging.basicConfig()` makes with no arguments (what absl calls)."""
    formatter = handler.formatter
    return (type(handler) is logging.StreamHandler and formatter is not None
            and formatter._fmt == logging.BASIC_FORMAT)


def format_duration(seconds: float) -> str:
    """A compact human duration: 42s, 3m07s, 2h05m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
