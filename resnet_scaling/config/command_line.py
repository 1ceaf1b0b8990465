"""Reading a command's line: its flags, `--config` and its `--config.FIELD=VALUE` overrides, `--help` exiting
with status 0, and each mistake as one `error:` line (absl: its usage text, or a traceback).

It imports neither JAX nor the training code: the commands read their flags with it first, so that `--help`,
`--print_config` and a usage mistake answer before the seconds JAX takes to import.
"""

from __future__ import annotations

import difflib
import os
import re
import sys

import ml_collections
from absl import flags

from resnet_scaling import config as config_lib
from resnet_scaling.config import recipes
from resnet_scaling.job import workdir
from resnet_scaling.job.errors import ConfigError

# absl's help flags: each prints its text, then absl exits with status 1.
HELP_FLAGS = frozenset({"--help", "-help", "-h", "-?", "--helpshort", "-helpshort", "--helpfull", "-helpfull",
                        "--helpxml", "-helpxml"})


def parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
    """absl's `app.parse_flags_with_usage`, except that asking for help exits with status 0 (a user, or a
    script, who typed `--help` got what was asked for) and a flag that does not parse is one `error:` line
    (absl: `FATAL Flags parsing error`, then a hint). `flag_values`: absl's global `FLAGS` by default."""
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
    names = config_lib.shipped_config_names()
    stem = os.path.splitext(os.path.basename(value.split(":", 1)[0]))[0]
    close = difflib.get_close_matches(stem, names, n=1)
    hint = f"; did you mean {close[0]}? " if close else ". "
    return f"{hint}Give a path to one (configs/*.py) or the name of a shipped config: {_shipped_configs()}."


def _shipped_configs() -> str:
    return ", ".join(config_lib.shipped_config_names())


def _unknown_field_message(error: BaseException, argv: list[str]) -> str:
    """'--config.training.global_batchsize: no such config field; did you mean "global_batch_size"?'."""
    text = str(error).replace("\\", "")
    name = re.search(r"[A-Za-z_]\w*", text)
    name = name.group(0) if name else "?"
    # The override that names it, as typed: a mistyped field, or a mistyped section
    # (--config.trainng.num_epochs), named as such.
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
