"""Array checks shared by the readers; all vectorized over the whole chunk."""

from __future__ import annotations

import os
import stat

import numpy as np

from ..errors import InputError
from ..oserrors import explain_os_error


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


def row_at(offsets: np.ndarray, position: int) -> int:
    """Index (within the chunk) of the row holding flat token `position`."""
    return int(np.searchsorted(offsets, position, side="right") - 1)


def to_log_probs(values: np.ndarray) -> np.ndarray:
    """Log-probs as float32 or float64; float16 is upcast to float32."""
    if values.dtype == np.float64 or values.dtype == np.float32:
        return values
    return values.astype(np.float32)


def common_float(old: np.ndarray, rollout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sides in float64 when either is, else float32."""
    dtype = np.float64 if np.float64 in (old.dtype, rollout.dtype) else np.float32
    return old.astype(dtype, copy=False), rollout.astype(dtype, copy=False)


def mask_to_bool(
    values: np.ndarray, offsets: np.ndarray, first_row: int, source: str, name: str, noun: str = "column"
) -> np.ndarray:
    """The mask as bool, or InputError naming the first row whose value is not exactly 0 or 1."""
    if values.dtype == np.bool_:
        return values
    bad = (values != 0) & (values != 1)  # also catches NaN
    if bad.any():
        position = int(np.argmax(bad))
        row = row_at(offsets, position)
        token = position - int(offsets[row])
        raise InputError(
            f"expected response_mask values 0 or 1, got {values[position].item()!r} in {source} "
            f"row {first_row + row} {noun} {name!r} (token {token})",
            hint="write the mask as 0/1 (1 = trained-on token), or point --column response_mask=NAME "
            "at the right column",
        )
    return values != 0


def describe(name: str, role: str, noun: str = "column") -> str:
    """`column 'NAME' (role)`, without repeating the role when the name is the role."""
    return f"{noun} {name!r}" if name == role else f"{noun} {name!r} ({role})"


def check_lengths(
    offsets: dict[str, np.ndarray], names: dict[str, str], source: str, first_row: int, noun: str = "column"
) -> None:
    """InputError naming the first row whose roles hold different numbers of tokens."""
    roles = list(offsets)
    reference = roles[0]
    for other in roles[1:]:
        if np.array_equal(offsets[reference], offsets[other]):
            continue
        ref_len, other_len = np.diff(offsets[reference]), np.diff(offsets[other])
        row = int(np.argmax(ref_len != other_len))
        raise InputError(
            f"expected equal lengths in {source} row {first_row + row}, got {int(ref_len[row])} tokens in "
            f"{describe(names[reference], reference, noun)} and {int(other_len[row])} in "
            f"{describe(names[other], other, noun)}",
            hint="every role must hold one value per token of the same response; check the columns "
            "chosen with --column",
        )


def missing_group(column: str, source: str, available: list[str], noun: str = "column") -> InputError:
    """The error for a `--by COLUMN` that the file does not have."""
    from .aliases import format_available

    return InputError(
        f"no {noun} {column!r} (asked for by --by {column}) in {source}; available {noun}s: "
        f"{format_available(available)}",
        hint=f"group by one of the available {noun}s, or drop --by {column}",
    )


def group_labels(values: np.ndarray) -> np.ndarray:
    """Per-row group labels: integers as int64, everything else as an object array of str or None."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind == "O":
        return values
    out = values.astype(str).astype(object)
    if values.dtype.kind == "f":
        out[np.isnan(values)] = None
    return out
