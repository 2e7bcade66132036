"""One exception hierarchy; the CLI maps each class to its exit code in one place."""

from __future__ import annotations


class MismatchError(Exception):
    """Base of every error the tool reports to a user; carries an exit code and a fix."""

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; fix: {self.hint}" if self.hint else self.message


class UsageError(MismatchError):
    """A flag, option or configuration value is wrong (exit 2)."""

    exit_code = 2


class ConfigError(UsageError):
    """A correction configuration that verl itself would reject (exit 2)."""


class InputError(MismatchError):
    """An input file is missing, unreadable or has the wrong schema (exit 3)."""

    exit_code = 3


class DataError(InputError):
    """The data itself cannot be analyzed, e.g. no valid token at all (exit 3)."""


class BreachError(MismatchError):
    """A metric broke a threshold (exit 1)."""

    exit_code = 1
