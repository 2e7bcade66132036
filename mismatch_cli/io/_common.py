"""Array checks shared by the readers; all vectorized over the whole chunk."""

from __future__ import annotations

import os
import stat

import numpy as np

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


def row_at(offsets: np.ndarray, position: int) -> int:
    """Index (within the chunk) of the row holding flat token `position`."""
    return int(np.searchsorted(offsets, position, side="right") - 1)


def to_log_probs(values: np.ndarray) -> np.ndarray:
    """Log-probs as float32 or float64; float16 is upcast to float32 (callers have refused non-floats)."""
    if values.dtype == np.float64 or values.dtype == np.float32:
        return values
    assert values.dtype.kind == "f", values.dtype
    return values.astype(np.float32)


def common_float(old: np.ndarray, rollout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sides in float64 when either is, else float32."""
    dtype = np.float64 if np.float64 in (old.dtype, rollout.dtype) else np.float32
    return old.astype(dtype, copy=False), rollout.astype(dtype, copy=False)


def log_prob_pair(values: dict[str, np.ndarray], offsets: np.ndarray, names: dict[str, str], source: str,
                  first_row: int, noun: str = "column") -> tuple[np.ndarray, np.ndarray]:
    """Both log-prob roles as one float dtype, refusing integers and rows that can only be ids or a mask."""
    for role in ("old_log_probs", "rollout_log_probs"):
        array = values[role]
        if array.dtype.kind != "f":
            raise InputError(
                f"expected float log-probs for {role}, got {array.dtype} (token ids?) in {source} "
                f"row {first_row} {describe(names[role], role, noun)}",
                hint=f"point --column {role}=NAME at the {noun} holding the log-probs",
            )
        check_log_prob_rows(array, offsets, role, names[role], source, first_row, noun)
    return common_float(to_log_probs(values["old_log_probs"]), to_log_probs(values["rollout_log_probs"]))


def check_log_prob_rows(values: np.ndarray, offsets: np.ndarray, role: str, name: str, source: str, first_row: int,
                        noun: str = "column") -> None:
    """InputError for the first row holding only whole numbers, some >= 1: token ids or a mask, never log-probs.

    A log-prob is <= 0 (a tiny positive one is log-softmax rounding); a whole number >= 1 is not one,
    and real log-probs are not all whole. JSON writes -1.0 as -1 in some writers, which this allows.
    """
    with np.errstate(invalid="ignore"):
        high = values >= 1.0
        if not high.any():  # the common case: one comparison per token
            return
        not_whole = ~(values == np.rint(values))  # NaN counts as not whole
    not_whole_before = np.concatenate(([0], np.cumsum(not_whole, dtype=np.int64)))
    high_before = np.concatenate(([0], np.cumsum(high, dtype=np.int64)))
    bad = (np.diff(not_whole_before[offsets]) == 0) & (np.diff(high_before[offsets]) > 0)
    if bad.any():
        row = int(np.argmax(bad))
        top = values[offsets[row]:offsets[row + 1]].max()
        raise InputError(
            f"expected log-probs (<= 0) for {role}, got only whole numbers up to {top:g} (token ids or a mask?) "
            f"in {source} row {first_row + row} {describe(name, role, noun)}",
            hint=f"point --column {role}=NAME at the {noun} holding the log-probs",
        )


INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def int64_values(values: np.ndarray, what: str, where: str, first_row: int = 0) -> np.ndarray:
    """Integers as int64, or InputError naming the first one outside int64 (a uint64 >= 2^63 would wrap negative).

    `where` names the file and column, e.g. "run.parquet column 'step'".
    """
    if values.dtype.kind == "u" and values.dtype.itemsize == 8:
        bad = values > np.uint64(INT64_MAX)
    elif values.dtype.kind == "O":  # Python ints (slime), unbounded
        bad = np.array([not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX for v in values], dtype=bool)
    else:
        return values.astype(np.int64, copy=False)
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(
            f"expected {what} within int64, got {values[row]} in {where} row {first_row + row} "
            "(it would wrap to a negative number)",
            hint=f"write {what}s below 2^63 (or as strings)",
        )
    return values.astype(np.int64)


def int64_scalar(value: int, what: str, where: str) -> int:
    """One integer (a step from a file name or metadata), or InputError when it does not fit int64."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise InputError(f"expected {what} within int64, got {value} in {where}", hint=f"write {what}s below 2^63")
    return value


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


def advantages_per_position(values: np.ndarray, offsets: np.ndarray | None, row_offsets: np.ndarray, name: str,
                            source: str, first_row: int, noun: str = "column") -> np.ndarray:
    """Advantages over a chunk's positions (float64, null = NaN): per-token lists as they are, a per-row value
    repeated over its row; a per-token list of another length than the row is refused."""
    values = np.asarray(values, dtype=np.float64)
    if offsets is None:
        return np.repeat(values, np.diff(row_offsets))
    if not np.array_equal(offsets, row_offsets):
        check_lengths({"old_log_probs": row_offsets, "advantages": offsets},
                      {"old_log_probs": "old_log_probs", "advantages": name}, source, first_row, noun)
    return values


def missing_group(column: str, source: str, available: list[str], noun: str = "column") -> InputError:
    """The error for a `--by COLUMN` that the file does not have."""
    from ..errors import MissingGroupError

    return MissingGroupError(column, source, available, noun)


def group_labels(values: np.ndarray, where: str = "", first_row: int = 0) -> np.ndarray:
    """Per-row group labels: integers as int64 (refused beyond it), anything else an object array of str / None."""
    if values.dtype.kind in "iu":
        return int64_values(values, "group label", where, first_row)
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind == "O":
        return values
    out = values.astype(str).astype(object)
    if values.dtype.kind == "f":
        out[np.isnan(values)] = None
    return out
