"""One exception hierarchy; the CLI maps each class to its exit code in one place."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class MismatchError(Exception):
    """Base of every error the tool reports to a user; carries an exit code and a fix."""

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; fix: {self.hint}" if self.hint else self.message

    def __reduce__(self) -> tuple:
        # Rebuilt field by field, whatever the subclass's __init__ takes: a worker process (--jobs) sends it back.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls: type[MismatchError], args: tuple, state: dict) -> MismatchError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class UsageError(MismatchError):
    """A flag, option or configuration value is wrong (exit 2)."""

    exit_code = 2


class ConfigError(UsageError):
    """A correction configuration that verl itself would reject (exit 2)."""


class InputError(MismatchError):
    """An input file is missing, unreadable or has the wrong schema (exit 3)."""

    exit_code = 3


class MissingGroupError(InputError):
    """An input lacks the column a `--by COLUMN` (or a rule over COLUMN) groups by (exit 3)."""

    def __init__(self, column: str, source: str, available: Sequence[str], noun: str = "column",
                 asked_by: str = "") -> None:
        self.column, self.source, self.available, self.noun = column, source, list(available), noun
        asked_by = asked_by or f"--by {column}"
        # A flag is fixed by a flag (`did you mean --by step?`), a rule by the name to write in it.
        close = did_you_mean(column, self.available, spelled="--by {}" if asked_by.startswith("--by") else "{}")
        fix = f"{close} (or drop {asked_by})" if close else f"use one of the available {noun}s, or drop {asked_by}"
        super().__init__(f"no {noun} {column!r} (asked for by {asked_by}) in {source}; available {noun}s: "
                         f"{format_available(self.available)}", hint=fix)

    def asked_by(self, what: str) -> MissingGroupError:
        """The same error, naming what asked for the column (a rule rather than a flag)."""
        return MissingGroupError(self.column, self.source, self.available, self.noun, what)


class DataError(InputError):
    """The data itself cannot be analyzed, e.g. no valid token at all (exit 3)."""


class BreachError(MismatchError):
    """A metric broke a threshold (exit 1)."""

    exit_code = 1


_MAX_LISTED = 30


def format_available(available: Sequence[str]) -> str:
    """The available names as one short, readable list."""
    if not available:
        return "(none)"
    shown = ", ".join(available[:_MAX_LISTED])
    more = len(available) - _MAX_LISTED
    return f"{shown}, … (+{more} more)" if more > 0 else shown


def close_names(name: str, known: Iterable[str], count: int = 1) -> list[str]:
    """The known names closest to a mistyped one, best first (difflib, the one place suggestions are made)."""
    return difflib.get_close_matches(name, list(dict.fromkeys(known)), n=count, cutoff=0.6)


def did_you_mean(name: str, known: Iterable[str], otherwise: str = "", spelled: str = "{}") -> str:
    """`did you mean X?` for the closest known name, or `otherwise` when none is close."""
    return suggest(close_names(name, known), otherwise, spelled)


def suggest(close: Sequence[str], otherwise: str = "", spelled: str = "{}") -> str:
    """`did you mean X?` (or `X, Y?`) for names already found close, or `otherwise` when there are none."""
    if not close:
        return otherwise
    return f"did you mean {', '.join(spelled.format(name) for name in close)}?"
