"""Decoding helpers the readers share: files they may open, library errors as clauses, a missing `--by` column.

Value checks live in `validate.py`, which every decoded chunk passes through on its way to a Batch.
"""

from __future__ import annotations

import os
import stat

from ..errors import InputError
from ..system.oserrors import explain_os_error


def reason(exc: BaseException) -> str:
    """A library exception as a short clause: no trailing period, no repeated file name for OS errors."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip().rstrip(".")


def check_file(path: str) -> None:
    """InputError when `path` is not a regular file this process may open, saying why (permission, link loop...)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and os.path.islink(path):
            raise InputError(f"cannot read {path}: it is a symbolic link to a missing file ({os.readlink(path)})",
                             hint="fix the link, or name the file it should point at") from None
        raise explain_os_error(exc, path) from None
    if stat.S_ISDIR(info.st_mode):
        raise explain_os_error(IsADirectoryError(21, "Is a directory"), path)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"cannot read {path}: not a regular file (a device, FIFO or socket)",
                         hint="save the dump to a file and name that file")
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise explain_os_error(exc, path) from None


def missing_group(column: str, source: str, available: list[str], noun: str = "column") -> InputError:
    """The error for a `--by COLUMN` that the file does not have."""
    from ..errors import MissingGroupError

    return MissingGroupError(column, source, available, noun)
