"""Writers: JSON lines for machines, TensorBoard event files, and a compact duration for console lines."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

logger = logging.getLogger(__name__)


class JsonLinesWriter:
    """Appends one JSON object per write to `path` (for machines; one line per step logged).

    `resume_step=k` drops earlier records of steps after k (a resumed run redoes them): one record a step.
    On object stores (`gs://`) each write rewrites the (small) object.
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None) -> None:
        self._path = epath.Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        lines = (self._path.read_bytes().decode("utf-8", errors="replace").splitlines()
                 if self._path.exists() else [])
        readable = [line for line in lines if _step_of(line) != float("inf")]
        if len(readable) < len(lines):  # Cut by a crash, or damaged: the records around them stay.
            logger.warning("%s: dropped %d unreadable line(s) of %d.", self._path, len(lines) - len(readable),
                           len(lines))
        lines = readable
        if resume_step is not None:
            lines = [line for line in lines if _step_of(line) <= resume_step]
        self._lines = [line + "\n" for line in lines]
        self._local = "://" not in os.fspath(path)
        if self._local:  # Appending keeps each write O(record) on a local disk.
            self._path.write_text("".join(self._lines))
            self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        record = {"step": int(step), "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        line = json.dumps(record) + "\n"
        if self._local:
            self._file.write(line)
            self._file.flush()
        else:
            self._lines.append(line)
            self._path.write_text("".join(self._lines))

    def close(self) -> None:
        if self._local:
            self._file.close()


def _step_of(line: str) -> float:
    """The step of a record; inf for a line that is not one (cut by a crash, damaged)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return float("inf")


class TensorBoardWriter:
    """Scalars and the run's config as a TensorBoard event file, without TensorFlow.

    Each summary is TensorBoard's own (`scalar_pb`, `text_pb`: tensor summaries, as `tf.summary` writes),
    framed by its `RecordWriter`, in a file named as `tf.summary`'s are. Not clu's `SummaryWriter` (clu
    0.0.12, the flax examples'): it writes through `tf.summary`, and importing TensorFlow costs seconds at
    every launch of a run whose data never needed it (arrays, synthetic). Each write is flushed: a crashed
    run's event file has every record written before the crash.
    """

    NOT_PLOTTED = ("step", "eval_count", "window_steps", "window_since_resume")

    def __init__(self, logdir: str, config_text: str | None = None) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar import summary_v2 as scalar_summary
        from tensorboard.plugins.text import summary_v2 as text_summary
        from tensorboard.summary.writer import record_writer

        self._event, self._scalar_pb = event_pb2.Event, scalar_summary.scalar_pb
        folder = epath.Path(logdir)
        folder.mkdir(parents=True, exist_ok=True)
        # tf.summary's name; its last number counts up past files of this second and process (a run resumed
        # in the same process within the second), which "wb" would empty.
        stem = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        path = next(p for n in itertools.count() if not (p := folder / f"{stem}.{n}.v2").exists())
        self._file = contextlib.ExitStack()  # epath's open is a context manager on gs://, a file locally.
        self._records = record_writer.RecordWriter(self._file.enter_context(path.open("wb")))
        events = [self._event(wall_time=time.time(), file_version="brain.Event:2")]
        if config_text is not None:  # Indented: TensorBoard renders text as Markdown.
            indented = "\n".join("    " + line for line in config_text.splitlines())
            events.append(self._event(wall_time=time.time(), step=0,
                                      summary=text_summary.text_pb("config", indented)))
        self._write(events)

    @staticmethod
    def tag(key: str) -> str:
        """`eval_top1` -> `eval/top1`, `loss` -> `train/loss`."""
        return f"eval/{key[len('eval_'):]}" if key.startswith("eval_") else f"train/{key}"

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        now = time.time()
        self._write([self._event(wall_time=now, step=int(step), summary=self._scalar_pb(self.tag(key), value))
                     for key, value in values.items()
                     if isinstance(value, int | float) and key not in self.NOT_PLOTTED])

    def _write(self, events: list[Any]) -> None:
        """Appends `events`, then flushes once (on gs://, a flush uploads the whole file again)."""
        for event in events:
            self._records.write(event.SerializeToString())
        self._records.flush()

    def close(self) -> None:
        self._file.close()


class MetricWriters:
    """Fans each record out to JSON lines and, where TensorBoard is installed, an event file."""

    def __init__(self, workdir: str, tensorboard: bool = True, config_text: str | None = None,
                 resume_step: int | None = None) -> None:
        self._writers: list[Any] = [JsonLinesWriter(os.path.join(workdir, "metrics.jsonl"), resume_step)]
        self.tensorboard_dir: str | None = None
        if tensorboard:
            try:
                self._writers.append(TensorBoardWriter(os.path.join(workdir, "tensorboard"), config_text))
                self.tensorboard_dir = os.path.join(workdir, "tensorboard")
            except ImportError as e:
                logger.warning("TensorBoard summaries off (%s); metrics.jsonl has every record.", e)

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        for writer in self._writers:
            writer.write(step, values)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value

