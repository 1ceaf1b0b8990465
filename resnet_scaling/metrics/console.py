"""The command line: reading `--config` (one `error:` line when it is wrong) and what a run shows on the
console: our progress lines, other libraries' warnings, and a closing headline.

The library logs through `logging.getLogger("resnet_scaling.<module>")`; command-line entry points call
`configure_command_line_logging()` after absl has parsed the flags. Research code that calls
`train_and_evaluate` without configuring logging still sees progress (`show_progress()`).

Another library's traceback (orbax logs several per failed save, dozens of lines each) shows on the console
as its one message line, the whole record going to WORKDIR/logs/, so that the library's own `error:` line
is not buried and nothing is lost. A failed command ends within `EXIT_GRACE_SEC` of its `error:` line
(`exit_after_error`), whatever threads another library left waiting.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ml_collections
    from absl import flags

LIBRARY_LOGGER = "resnet_scaling"
# The name of the handler `show_progress` gives our logger.
PROGRESS_HANDLER = "resnet_scaling.progress"
# How long a failed command waits for other threads (an orbax save in flight) after its error line.
EXIT_GRACE_SEC = 10.0
# absl's help flags: each prints its text, then absl exits with status 1.
HELP_FLAGS = frozenset({"--help", "-help", "-h", "-?", "--helpshort", "-helpshort", "--helpfull", "-helpfull",
                        "--helpxml", "-helpxml"})


def parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
    """absl's `app.parse_flags_with_usage`, except that asking for help exits with status 0 (a user, or a
    script, who typed `--help` got what was asked for) and a flag that does not parse is one `error:` line
    (absl: `FATAL Flags parsing error`, then a hint). `flag_values`: absl's global `FLAGS` by default."""
    from absl import flags

    try:
        return (flag_values or flags.FLAGS)(argv)
    except flags.Error as e:
        raise SystemExit(f"error: {_flag_error_message(e)}") from None
    except SystemExit as e:  # absl's help flags print their text, then exit with status 1.
        if e.code == 1 and HELP_FLAGS.intersection(argv[1:]):
            raise SystemExit(0) from None
        raise


# What a value that does not parse was expected to be, by the words of Python's or absl's error.
_EXPECTED_VALUES = (("invalid literal for int()", "a whole number"),  # Lower case, as matched.
                    ("could not convert string to float", "a number"),
                    ("as tuple", "a tuple, e.g. '(1, 2)'"),
                    ("non-boolean", "true or false"))


def _flag_error_message(error: Exception) -> str:
    """absl's message for a flag that does not parse, as one line saying what the value should be:
    "--config.training.global_batch_size=6x4: expects a whole number, got '6x4'."."""
    text = " ".join(str(error).split())
    parsed = re.match(r"flag (--\S+?)=(.*?): (.*)$", text)
    if not parsed:
        return (text[0].lower() + text[1:]).replace(" ?", "?") if text else "a flag does not parse."
    flag, value, cause = parsed.groups()
    if "must have a value other than None" in cause:  # absl's words for a required flag left out.
        return f"{flag} is required (--help describes it)."
    if choices := re.match(r"value should be one of <(.*)>$", cause):  # An enum flag's value mistyped.
        return f"{flag}={value}: {_choice_suggestion(value, choices.group(1).split('|'))}"
    expected = next((words for key, words in _EXPECTED_VALUES if key in cause.lower()), None)
    if expected is None:
        return f"{flag}={value}: {cause}"
    return f"{flag}={value}: expects {expected}, got {value!r}."


def _choice_suggestion(value: str, choices: list[str]) -> str:
    """"expects one of export, best, got 'bset'; did you mean best?" (the hint where one is close)."""
    import difflib

    close = difflib.get_close_matches(value, choices, n=1)
    return (f"expects one of {', '.join(choices)}, got {value!r}" +
            (f"; did you mean {close[0]}?" if close else "."))


def refuse_arguments(argv: list[str]) -> None:
    """One `error:` line for words on a flags-only command line (absl's `UsageError`: its whole usage
    text), e.g. `python -m resnet_scaling.train --config=demo /tmp/run` without `--workdir=`."""
    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments: {' '.join(argv[1:])}; the command takes flags only "
                         "(--help lists them).")


def parse_config_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
    """`parse_flags` for an entry point with a `--config` flag: a shipped config's name (`--config=demo`)
    becomes its path; no such file, or a mistyped override, is one `error:` line (absl: its usage text, or
    a traceback)."""
    from resnet_scaling import config as config_lib

    argv = config_lib.resolve_config_flag(argv)
    for _, _, value in config_lib.flag_values(argv, "config"):
        if not os.path.isfile(value.split(":", 1)[0]):
            raise SystemExit(f"error: --config={value}: no such config file{_config_suggestion(value)}")
    try:
        return parse_flags(argv, flag_values)
    except (AttributeError, KeyError) as e:  # A mistyped override: --config.training.global_batchsize=8
        raise SystemExit(f"error: {_unknown_field_message(e, argv)}") from None


def _config_suggestion(value: str) -> str:
    """'; did you mean pod? Give ...' for `--config=pods`, then every shipped name."""
    import difflib

    from resnet_scaling import config as config_lib

    names = config_lib.shipped_config_names()
    stem = os.path.splitext(os.path.basename(value.split(":", 1)[0]))[0]
    close = difflib.get_close_matches(stem, names, n=1)
    hint = f"; did you mean {close[0]}? " if close else ". "
    return (f"{hint}Give a path to one (configs/*.py) or the name of a shipped config: "
            f"{', '.join(names)}.")


def _shipped_configs() -> str:
    from resnet_scaling import config as config_lib

    return ", ".join(config_lib.shipped_config_names())


def _unknown_field_message(error: BaseException, argv: list[str]) -> str:
    """'--config.training.global_batchsize: no such config field; did you mean "global_batch_size"?'."""
    text = str(error).replace("\\", "")
    name = re.search(r"[A-Za-z_]\w*", text)
    name = name.group(0) if name else "?"
    # The override that names it, as typed: a mistyped field, or a mistyped section
    # (--config.trainng.num_epochs), named as such.
    from resnet_scaling import config as config_lib

    override = config_lib.CONFIG_OVERRIDE_PREFIX + next(
        (field for field in config_lib.command_line_overrides(argv) if name in field.split(".")), name)
    what = "field" if override.rsplit(".", 1)[-1] == name else f"section {name}"
    suggestion = re.search(r'Did you mean "(\w+)"', text)
    return (f"{override}: no such config {what}" +
            (f"; did you mean {suggestion.group(1)}?" if suggestion else "."))


def read_config_flag(config_flag: flags.FlagHolder, argv: list[str] | None = None, *, log: bool = True
                     ) -> ml_collections.ConfigDict:
    """The ConfigDict a `config_flags.DEFINE_config_file` flag holds, its recipe applied to the final batch
    (`recipes.resolve`: the `--config.*` overrides in `argv`, default `sys.argv`, keep their values; the
    changes are logged where `log`), or one `error:` line when its file does not load (ml_collections:
    chained tracebacks) or its recipe is unknown."""
    from resnet_scaling import config as config_lib
    from resnet_scaling.config import recipes
    from resnet_scaling.job import workdir
    from resnet_scaling.job.errors import ConfigError

    try:
        config = config_flag.value
        config.keys()  # ml_collections defers a failed get_config() to the config's first use.
    except OSError as e:  # the file is missing or does not load
        missing = next((c for c in workdir.exception_chain(e) if isinstance(c, FileNotFoundError)), None)
        cause = f"no such file: {missing.filename}" if missing else str(e).splitlines()[0]
        raise SystemExit(f"error: cannot load the config file given by --config ({cause}). Give a path to "
                         f"a config file, or one of: {_shipped_configs()}.") from None
    try:
        resolution = recipes.resolve(config, explicit=set(config_lib.command_line_overrides(
            sys.argv if argv is None else argv)))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if log:
        recipes.log_resolution(resolution, kept_by="the command line or the config file")
    return resolution.config


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
        absl_logging.get_absl_handler().python_handler.setFormatter(ConsoleFormatter(log_file))
    return log_file


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


def headline(summary: Mapping[str, Any], paths: Mapping[str, str]) -> list[str]:
    """The few lines that end a run: accuracy, throughput, time to the target, and where things are.

    Args:
      summary: the run's summary (`metrics.summary` schema).
      paths: name -> path of what the run wrote (summary, TensorBoard, checkpoints, export).
    """
    run, accuracy, throughput, time = (summary[k] for k in ("run", "accuracy", "throughput", "time"))
    status = " (preempted: run the same command to resume)" if run["preempted"] else ""
    images_per_sec = throughput["images_per_sec"]
    if images_per_sec:
        speed = (f"{images_per_sec:,.0f} images/sec in the steady state "
                 f"({throughput['images_per_sec_per_device']:,.0f} per device)")
    else:
        speed = "not measured (the run ended before its timed steps: training.timing_warmup_*)"
    target = f"time to {_percent(accuracy['target_top1'])} top-1: "
    if accuracy["reached"]:
        target += (f"{_duration(accuracy['time_to_accuracy_sec'])} timed, "
                   f"{_duration(accuracy['mlperf_time_to_accuracy_sec'])} wall, at epoch "
                   f"{accuracy['epochs_to_accuracy']:.2f}")
    else:
        target += "not reached"
    lines = [
        f"Done: step {run['final_step']} of {run['total_steps']}{status}; compile "
        f"{_duration(time['compile_sec'])}, training loop {_duration(time['wall_sec'])}.",
        f"  top-1: final {_percent(accuracy['final_eval_top1'])}, "
        f"best {_percent(accuracy['best_eval_top1'])}",
        f"  throughput: {speed}",
        f"  {target}",
    ]
    goodput = summary.get("goodput") or {}
    if goodput.get("goodput") is not None:
        causes = {k[:-len("_sec")].replace("_", " "): v for k, v in goodput.items()
                  if k.endswith("_sec") and k not in ("total_wall_sec", "productive_sec") and v}
        largest = sorted(causes.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  goodput: {_percent(goodput['goodput'])} of {_duration(goodput['total_wall_sec'])} "
                     f"over {goodput['launches']} launch(es); badput: "
                     + ", ".join(f"{name} {_duration(sec)}" for name, sec in largest))
    lines += [f"  {name}: {path}" for name, path in paths.items()]
    return lines


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _duration(seconds: float | None) -> str:
    from resnet_scaling.metrics.writers import format_duration

    return "n/a" if seconds is None else format_duration(seconds)
