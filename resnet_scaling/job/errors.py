"""The one base class of the errors a user can fix: bad config values, missing or corrupt data, an unusable
workdir, unreadable or incompatible checkpoints, a diverged run, a failed save.

Each message names the problem and what to do; command-line entry points print it as one `error:` line
and exit non-zero, without a traceback. Library users catch `RunError` (or a subclass) the usual way.
"""

from __future__ import annotations


class RunError(Exception):
    """An error whose message says what went wrong and how to fix it."""


class MissingExtraError(RunError, ImportError):
    """A feature needs a package that only one of the package's extras installs; the message names it."""


class ConfigError(RunError, ValueError):
    """An invalid configuration; the message names the field and the fix."""
