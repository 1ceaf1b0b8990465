"""The run's working directory: checked in a second before any slow set-up, and locked while a run uses it.

The lock, WORKDIR/run.lock, is JSON naming its holder (host, pid and the pid's start time, command, start)
with a heartbeat refreshed every `HEARTBEAT_SEC`; a second run refuses at once, naming the first. A crashed
run's lock is taken over: on the same host when its pid is gone or reused (a restarted container's pid 1:
another start time), from any host when its heartbeat is older than `STALE_AFTER_SEC`. An empty or
unreadable lock (a crash between create and write) is set aside as run.lock.damaged-* once older than
`DAMAGED_GRACE_SEC`. epath has no exclusive create on object stores, so two `gs://` runs started within the
same second could both believe they hold it; reading the lock back after writing narrows that window.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from etils import epath

from resnet_scaling.job import tf_import
from resnet_scaling.job.errors import MissingExtraError, RunError

logger = logging.getLogger(__name__)

LOCK_FILENAME = "run.lock"
# The parameters a finished run's workdir holds (checkpointing/): its final ones, its best evaluation's.
WEIGHTS = ("export", "best")
HEARTBEAT_SEC = 30.0
STALE_AFTER_SEC = 120.0
# A lock file younger than this that cannot be read may be another run's, between its create and its write.
DAMAGED_GRACE_SEC = 2.0


class WorkdirError(RunError):
    """The workdir cannot be used: not writable, or in use by another run."""


def as_path(workdir: str | os.PathLike[str]) -> epath.Path:
    """`workdir` as an epath Path: absolute where local, untouched where remote (`gs://...`).

    Raises:
      MissingExtraError: for a `gs://` path when the client orbax needs there is not installed.
    """
    text = os.fspath(workdir)
    if text.startswith("gs://"):
        require_gcs_client()
    if ("://" in text and "tensorflow" not in sys.modules
            and importlib.util.find_spec("tensorflow") is not None):
        # epath reaches object stores through TensorFlow's gfile where installed: import it our way, once.
        tf_import.import_tensorflow_for_host()
    return epath.Path(text if "://" in text else os.path.abspath(text))


def require_gcs_client() -> None:
    """Raises `MissingExtraError` unless `google-cloud-storage` is importable: orbax needs it for every
    `gs://` checkpoint but does not declare it, and without it fails deep inside a save."""
    try:
        found = importlib.util.find_spec("google.cloud.storage") is not None
    except ModuleNotFoundError:  # No `google.cloud` package at all.
        found = False
    if not found:
        raise MissingExtraError("gs:// paths need google-cloud-storage, which orbax uses there: "
                                "pip install 'resnet_scaling[gcs]' (the [tpu] extra includes it).")


def check_writable(workdir: str | os.PathLike[str]) -> epath.Path:
    """Creates `workdir` if needed and proves it writable with a probe file; returns its path.

    Raises:
      WorkdirError: naming the workdir and the cause (read-only file system, permission, not a directory).
    """
    path = as_path(workdir)
    probe = path / f".write_probe-{socket.gethostname()}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        # mkdir reports a file in the workdir's place as EEXIST; what is wrong is that it is no directory.
        cause = (f"{os.strerror(errno.ENOTDIR)} (ENOTDIR): a file has that name"
                 if isinstance(e, FileExistsError) else describe_os_error(e))
        raise WorkdirError(f"Cannot write to the workdir {path}: {cause}. "
                           "Pass a --workdir this user can write to.") from None
    return path


def remove_refused_launch(workdir: str, log_file: str | None) -> None:
    """Takes back what a refused first launch made of a new workdir: this process's log file, then whichever
    of logs/, the compilation cache and the workdir are left empty (only empty ones: nothing a run wrote is
    lost). Local workdirs only."""
    if "://" in workdir or not os.path.isdir(workdir):
        return
    cache = os.path.join(workdir, "compilation_cache")
    left = set(os.listdir(workdir)) - {"logs", "compilation_cache"}
    if left or (os.path.isdir(cache) and os.listdir(cache)):
        return  # The launch got further than its set-up: what it wrote, its log included, stays.
    if log_file:
        with contextlib.suppress(OSError):
            os.remove(log_file)
    for folder in (os.path.join(workdir, "logs"), os.path.join(workdir, "compilation_cache"), workdir):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Writes `text` so that a reader never sees half of it: a temporary file renamed over the target on a
    local disk; one object write on an object store (objects appear whole)."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "://" in os.fspath(path):
        path.write_text(text)
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def set_aside(path: str | os.PathLike[str], problem: str, consequence: str) -> str | None:
    """Moves a damaged workdir file out of the way (NAME.damaged-<time>-<pid>, kept for a post-mortem) with
    a one-line warning saying what was wrong and what the run does instead; returns the new name, or None
    where another process moved it first."""
    path = epath.Path(path)
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}-{os.getpid()}")
    try:
        path.rename(aside)
    except OSError:
        return None
    logger.warning("%s %s: set aside as %s; %s", path, problem, aside.name, consequence)
    return aside.name


def read_json(path: str | os.PathLike[str], consequence: str) -> Any | None:
    """The JSON a workdir file holds, or None where it is missing or damaged (cut short by a crash or a full
    disk, garbage): a damaged file is set aside (`set_aside`) with a warning ending in `consequence`."""
    path = epath.Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        set_aside(path, f"cannot be read ({describe_os_error(e)})", consequence)
        return None
    try:
        return json.loads(text)
    except ValueError:
        set_aside(path, "is empty or not valid JSON" if text.strip() else "is empty", consequence)
        return None


# The failures that say the storage itself cannot take more (not a missing file or a bad path).
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then its causes (`__cause__`, else `__context__`), each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_storage_full(error: BaseException) -> bool:
    """Whether `error` or one along its chain of causes says the storage is full, over quota or read-only."""
    return any(isinstance(e, OSError) and e.errno in STORAGE_FULL_ERRNOS for e in exception_chain(error))


def describe_os_error(error: BaseException) -> str:
    """The root cause of an I/O failure in a few words ("No space left on device", ...), found along the
    exception's chain of causes (orbax and TensorStore wrap the OSError several levels deep)."""
    for current in exception_chain(error):
        if isinstance(current, OSError) and current.errno:
            name = errno.errorcode.get(current.errno, current.errno)
            return f"{current.strerror or os.strerror(current.errno)} ({name})"
        text = str(current)
        for code in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EFBIG):
            if os.strerror(code).lower() in text.lower():
                return os.strerror(code)
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return first_line[:300]


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Someone else's process: alive.
    return True


def process_start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's field 22); None where there
    is no /proc or no such process. A pid and its start time name one process across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split()[19])  # Fields after "pid (comm)", from field 3.
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


class WorkdirLock:
    """Holds WORKDIR/run.lock for a run (module docstring); use `with WorkdirLock(workdir):` on process 0."""

    def __init__(self, workdir: str | os.PathLike[str], heartbeat_sec: float = HEARTBEAT_SEC,
                 stale_after_sec: float = STALE_AFTER_SEC) -> None:
        self.path = as_path(workdir) / LOCK_FILENAME
        self._heartbeat_sec = heartbeat_sec
        self._stale_after_sec = stale_after_sec
        self._token = uuid.uuid4().hex
        self._record: dict[str, Any] = {
            "host": socket.gethostname(), "pid": os.getpid(), "pid_start": process_start_time(os.getpid()),
            "boot_id": _boot_id(), "started": time.time(), "command": " ".join(sys.argv),
            "token": self._token}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> dict[str, Any] | None:
        """The lock's current record, or None when there is no readable lock."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def is_stale(self, record: dict[str, Any]) -> bool:
        """Whether the run that wrote `record` is gone."""
        if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
            if record.get("boot_id") and _boot_id() and record["boot_id"] != _boot_id():
                return True  # The machine rebooted since: no process of that run survives.
            if not process_alive(record["pid"]):
                return True
            recorded, now = record.get("pid_start"), process_start_time(record["pid"])
            if isinstance(recorded, int) and now is not None:
                return recorded != now  # The pid was reused by another process.
            return False
        try:
            heartbeat = float(record.get("heartbeat", 0.0))
        except (TypeError, ValueError):
            heartbeat = 0.0
        return time.time() - heartbeat > self._stale_after_sec

    def _set_aside_damaged(self) -> None:
        """A lock file that exists but holds no record: wait out a racing run's write, then move it aside."""
        deadline = time.monotonic() + DAMAGED_GRACE_SEC
        while time.monotonic() < deadline:
            try:  # os.stat where local: epath's mtime is whole seconds.
                local = "://" not in os.fspath(self.path)
                age = time.time() - (os.stat(self.path).st_mtime if local else self.path.stat().mtime)
            except OSError:
                return  # Gone meanwhile.
            if age >= DAMAGED_GRACE_SEC or self.holder() is not None:
                break
            time.sleep(0.1)
        if self.holder() is not None or not self.path.exists():
            return
        # None: another run moved or replaced it first; the exclusive create decides.
        set_aside(self.path, "was empty or unreadable (what a crash while writing it leaves)",
                  "taking the workdir.")

    def acquire(self) -> None:
        """Takes the lock, or raises `WorkdirError` naming the run that holds it."""
        record = self.holder()
        if record is None and self.path.exists():
            self._set_aside_damaged()
            record = self.holder()
        if record is not None and record.get("token") != self._token:
            if not self.is_stale(record):
                age = time.time() - float(record.get("started", time.time()))
                raise WorkdirError(
                    f"The workdir {self.path.parent} is in use by another run: pid {record.get('pid')} on "
                    f"{record.get('host')}, started {age:.0f}s ago ({record.get('command', '?')}). Wait for "
                    f"it to end or stop it, or use another --workdir; if that run is gone, delete "
                    f"{self.path}.")
            logger.warning("Taking over the lock of a run that is gone (pid %s on %s).", record.get("pid"),
                           record.get("host"))
            self.path.unlink(missing_ok=True)
        self._write(exclusive=record is None or record.get("token") != self._token)
        if (self.holder() or {}).get("token") != self._token:  # Another run wrote in between.
            raise WorkdirError(f"The workdir {self.path.parent} was locked by another run as this one "
                               f"started; see {self.path}.")
        self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
        self._thread.start()

    def _write(self, exclusive: bool = False) -> None:
        text = json.dumps({**self._record, "heartbeat": time.time()})
        if exclusive and "://" not in os.fspath(self.path):
            try:  # Local disks have an atomic exclusive create: the first of two racing runs wins.
                fd = os.open(os.fspath(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise WorkdirError(f"The workdir {self.path.parent} was locked by another run as this one "
                                   f"started; see {self.path}.") from None
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return
        write_text_atomically(self.path, text)  # A reader (another run starting) never sees half of it.

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_sec):
            try:
                self._write()
            except OSError as e:  # A missed heartbeat is not worth stopping a run for.
                logger.warning("Could not refresh %s: %s", self.path, describe_os_error(e))

    def release(self) -> None:
        """Stops the heartbeat and removes the lock if this run still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if (self.holder() or {}).get("token") == self._token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()
