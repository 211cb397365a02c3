"""User-facing errors.

Every error a user can cause is raised as a :class:`GenolcError` carrying three parts: what went wrong, where
(a file, a record, an option) and what to do about it. The CLI prints it as one message and exits non-zero,
without a traceback.
"""

from __future__ import annotations


class GenolcError(Exception):
    """An error caused by the user's input or environment, reported without a traceback."""

    exit_code = 2
    # How a run record labels a command that ended with this error ("interrupted" for a stop the user asked for).
    run_status = "failed"

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [self.what.rstrip(".")]
        if self.where:
            parts[0] += f" ({self.where})"
        text = parts[0] + "."
        if self.fix:
            text += " " + self.fix.rstrip(".") + "."
        return text


class InputError(GenolcError):
    """A genome, BED, dataset or checkpoint file that cannot be used as given."""


class ConfigError(GenolcError):
    """An option or configuration value that is invalid or inconsistent."""


class RefusedOutputError(InputError):
    """An output path genolc will not write into: it holds something genolc did not write, or the working directory."""
