"""One validation step between every reader and the engine: a reader's `Decoded` chunk in, a `Batch` out.

A reader only decodes its format (its schema, shapes and structure are its own business) into `Decoded`:
per role the flat values as read (any dtype), that role's row offsets and where the file held nulls, plus
the per-row extras as read. `to_batch` then checks every chunk the same way, whatever the format, in one
fixed order: equal lengths per row, the mask's nulls and values (0/1), nulls only on masked-out tokens,
float log-probs and no row of whole numbers >= 1 (ids or a mask), one float dtype for both sides, int64
range of steps, process ranks and integer labels, the advantages' length, and group-label normalization.
Every message names the file, the row, the column (or field, key, tensor) and the fix. All checks are
vectorized over the whole chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..batch import Batch
from ..errors import InputError
from .extras import row_versions, token_ids_per_position


@dataclass(frozen=True)
class Column:
    """One per-token stream as its reader decoded it.

    `values` are flat over the chunk, in the file's dtype; row i spans `offsets[i]:offsets[i+1]` (int64,
    chunk-relative). `offsets` None means one value per row (advantages only). `nulls` marks the positions
    the file held as null (None: none, or the format turns them into NaN on its own), `name` is the
    column, field, key or tensor that held the stream.
    """

    values: np.ndarray
    offsets: np.ndarray | None
    name: str
    nulls: np.ndarray | None = None


@dataclass(frozen=True)
class PerRow:
    """Per-row integers or labels as read (or one integer for every row), and where they came from.

    `where` names the file and column in messages ("run.parquet column 'step'"); `what` names the value
    ("step", "step (rollout_id)", "process_index").
    """

    values: np.ndarray | int
    where: str = ""
    what: str = "step"


@dataclass(frozen=True)
class Decoded:
    """What a reader decoded from one chunk of whole sequences, before any value is checked.

    `noun` is what the format calls a stream ("column", "field", "key", "tensor"); `row_keep` is a
    per-row bool that empties a row's mask after the mask is checked (NeMo-RL's sample_loss_mask).
    """

    source: str
    first_row: int
    old_log_probs: Column
    rollout_log_probs: Column
    response_mask: Column | None = None
    noun: str = "column"
    row_keep: np.ndarray | None = None
    steps: PerRow | None = None
    sequence_ids: np.ndarray | None = None
    groups: dict[str, PerRow] = field(default_factory=dict)
    advantages: Column | None = None
    process_index: PerRow | None = None
    labels: dict[str, str] = field(default_factory=dict)
    policy_versions: Column | None = None  # per row (offsets None) or per token, as read
    version_kind: str = ""  # "version" (counts up) or "lag" (versions behind), with policy_versions
    token_ids: Column | None = None  # the sampled token ids, one list per row


def to_batch(decoded: Decoded) -> Batch:
    """The checked Batch of a decoded chunk, or InputError naming the file, row, column and fix."""
    d = decoded
    source, first_row, noun = d.source, d.first_row, d.noun
    columns = {"old_log_probs": d.old_log_probs, "rollout_log_probs": d.rollout_log_probs}
    if d.response_mask is not None:
        columns["response_mask"] = d.response_mask
    names = {role: column.name for role, column in columns.items()}
    check_lengths({role: column.offsets for role, column in columns.items()}, names, source, first_row, noun)
    offsets = np.asarray(d.old_log_probs.offsets)
    mask = None
    if d.response_mask is not None:
        if d.response_mask.nulls is not None:
            _refuse_mask_nulls(d.response_mask.nulls, offsets, d.response_mask.name, source, first_row, noun)
        mask = mask_to_bool(d.response_mask.values, offsets, first_row, source, d.response_mask.name, noun)
    for role in ("old_log_probs", "rollout_log_probs"):
        if columns[role].nulls is not None:
            refuse_valid_nulls(columns[role].nulls, mask, offsets, role, names[role], source, first_row, noun)
    old, rollout = log_prob_pair({role: columns[role].values for role in ("old_log_probs", "rollout_log_probs")},
                                 offsets, names, source, first_row, noun, mask)
    if mask is None:
        mask = np.ones(len(old), dtype=np.bool_)
    if d.row_keep is not None:
        mask = mask & np.repeat(d.row_keep, np.diff(offsets))
    rows = len(offsets) - 1
    steps = None if d.steps is None else _per_row_int64(d.steps, rows, first_row)
    process_index = None if d.process_index is None else _per_row_int64(d.process_index, rows, first_row)
    advantages = None
    if d.advantages is not None:
        advantages = advantages_per_position(d.advantages.values, d.advantages.offsets, offsets, d.advantages.name,
                                             source, first_row, noun)
    return Batch(
        old_log_probs=old,
        rollout_log_probs=rollout,
        response_mask=mask,
        offsets=offsets,
        source=source,
        first_row=first_row,
        steps=steps,
        sequence_ids=d.sequence_ids,
        labels=dict(d.labels),
        groups={name: group_labels(labels.values, labels.where, first_row)  # type: ignore[arg-type]
                for name, labels in d.groups.items()},
        advantages=advantages,
        process_index=process_index,
        policy_versions=None if d.policy_versions is None else row_versions(d.policy_versions, rows),
        token_ids=None if d.token_ids is None else token_ids_per_position(d.token_ids, offsets),
        version_kind=d.version_kind if d.policy_versions is not None else "",
    )



def _per_row_int64(values: PerRow, rows: int, first_row: int) -> np.ndarray:
    if isinstance(values.values, (int, np.integer)):
        return np.full(rows, int64_scalar(int(values.values), values.what, values.where), dtype=np.int64)
    return int64_values(values.values, values.what, values.where, first_row)


def row_at(offsets: np.ndarray, position: int) -> int:
    """Index (within the chunk) of the row holding flat token `position`."""
    return int(np.searchsorted(offsets, position, side="right") - 1)


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


def _refuse_mask_nulls(nulls: np.ndarray, offsets: np.ndarray, name: str, source: str, first_row: int,
                       noun: str) -> None:
    """InputError for the first null in the mask: every token needs a 0 or a 1, padding included."""
    if nulls.any():
        position = int(np.argmax(nulls))
        row = row_at(offsets, position)
        raise InputError(
            f"expected response_mask values 0 or 1, got null in {source} row {first_row + row} {noun} "
            f"{name!r} (token {position - int(offsets[row])})",
            hint="write the mask as 0/1 or true/false on every token",
        )


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


def refuse_valid_nulls(nulls: np.ndarray, mask: np.ndarray | None, offsets: np.ndarray, role: str, name: str,
                       source: str, first_row: int, noun: str = "column") -> None:
    """InputError for the first null log-prob on a valid token (mask 1, or anywhere without a mask)."""
    bad = nulls if mask is None else nulls & mask
    if bad.any():
        position = int(np.argmax(bad))
        row = row_at(offsets, position)
        raise InputError(
            f"expected {role} values, got null in {source} row {first_row + row} {noun} {name!r} "
            f"(token {position - int(offsets[row])})" + (" where the mask is 1" if mask is not None else ""),
            hint="fill missing values on trained-on tokens before dumping (padding, mask 0, may hold nulls)",
        )


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
                  first_row: int, noun: str = "column",
                  mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Both log-prob roles as one float dtype, refusing integers and rows that can only be ids or a mask."""
    for role in ("old_log_probs", "rollout_log_probs"):
        array = values[role]
        if array.dtype.kind != "f":
            raise InputError(
                f"expected float log-probs for {role}, got {array.dtype} (token ids?) in {source} "
                f"row {first_row} {describe(names[role], role, noun)}",
                hint=f"point --column {role}=NAME at the {noun} holding the log-probs",
            )
        check_log_prob_rows(array, offsets, role, names[role], source, first_row, noun, mask)
    return common_float(to_log_probs(values["old_log_probs"]), to_log_probs(values["rollout_log_probs"]))


def check_log_prob_rows(values: np.ndarray, offsets: np.ndarray, role: str, name: str, source: str, first_row: int,
                        noun: str = "column", mask: np.ndarray | None = None) -> None:
    """InputError for the first row whose valid tokens hold only whole numbers, some >= 1: token ids or a mask.

    A log-prob is <= 0 (a tiny positive one is log-softmax rounding); a whole number >= 1 is not one,
    and real log-probs are not all whole. JSON writes -1.0 as -1 in some writers, which this allows.
    Only valid tokens count (padding may hold anything), and +inf is a broken log-prob, not an id.
    """
    with np.errstate(invalid="ignore"):
        high = values >= 1.0
        if not high.any():  # the common case: one comparison per token
            return
        high &= values != np.inf
        if mask is not None:
            high &= mask
        if not high.any():
            return
        not_whole = ~(values == np.rint(values))  # NaN counts as not whole
        if mask is not None:
            not_whole &= mask
    not_whole_before = np.concatenate(([0], np.cumsum(not_whole, dtype=np.int64)))
    high_before = np.concatenate(([0], np.cumsum(high, dtype=np.int64)))
    bad = (np.diff(not_whole_before[offsets]) == 0) & (np.diff(high_before[offsets]) > 0)
    if bad.any():
        row = int(np.argmax(bad))
        top = values[offsets[row]:offsets[row + 1]][high[offsets[row]:offsets[row + 1]]].max()
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


def advantages_per_position(values: np.ndarray, offsets: np.ndarray | None, row_offsets: np.ndarray, name: str,
                            source: str, first_row: int, noun: str = "column") -> np.ndarray:
    """Advantages over a chunk's positions (float64, null = NaN): per-token lists as they are, a per-row value
    repeated over its row; a per-token list of another length than the row is refused."""
    values = _numbers(values, offsets, name, source, first_row, noun)
    if offsets is None:
        return np.repeat(values, np.diff(row_offsets))
    if not np.array_equal(offsets, row_offsets):
        check_lengths({"old_log_probs": row_offsets, "advantages": offsets},
                      {"old_log_probs": "old_log_probs", "advantages": name}, source, first_row, noun)
    return values


def _numbers(values: np.ndarray, offsets: np.ndarray | None, name: str, source: str, first_row: int,
             noun: str) -> np.ndarray:
    """Advantages as float64 (null = NaN), or InputError naming the first value that is not a number."""
    values = np.asarray(values)
    if values.dtype.kind in "fiu":
        return values.astype(np.float64, copy=False)
    if values.dtype.kind == "O":
        bad = np.array([not (v is None or (isinstance(v, (int, float, np.integer, np.floating))
                                           and not isinstance(v, bool))) for v in values], dtype=bool)
    else:  # strings, bools, dates
        bad = np.ones(len(values), dtype=bool)
    if bad.any():
        position = int(np.argmax(bad))
        row = position if offsets is None else row_at(offsets, position)
        raise InputError(f"expected numbers for advantages, got {values[position]!r} in {source} row "
                         f"{first_row + row} {noun} {name!r}",
                         hint="write advantages as numbers (one per token, or one per row), or rename the "
                         f"{noun} so it is not read as advantages")
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def group_labels(values: np.ndarray, where: str = "", first_row: int = 0) -> np.ndarray:
    """Per-row group labels: integers as int64 (refused beyond it), anything else an object array of str / None.

    An object array of Python ints only (slime's per-sample values) counts as integers.
    """
    if values.dtype.kind == "O" and len(values) and all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in values):
        return int64_values(values, "group label", where, first_row)
    if values.dtype.kind in "iu":
        return int64_values(values, "group label", where, first_row)
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind == "O":
        return _scalar_labels(values, where, first_row)
    out = values.astype(str).astype(object)
    if values.dtype.kind == "f":
        out[np.isnan(values)] = None
    return out


def _scalar_labels(values: np.ndarray, where: str, first_row: int) -> np.ndarray:
    """Object labels as str / int / None (0-d arrays and tensors unwrapped), or InputError for a list or array."""
    if set(map(type, values)) <= {str, int, type(None)}:  # the common case (parquet strings): no loop in Python
        return values
    out = np.empty(len(values), dtype=object)
    for row, value in enumerate(values):
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()  # a 0-d tensor or numpy scalar
        if value is None or isinstance(value, (str, int, float)):
            out[row] = value if not isinstance(value, float) or value == value else None
            continue
        kind = type(value).__name__
        raise InputError(f"expected one label per row to group by, got a {kind} in {where} row {first_row + row}",
                         hint="group by a column or field holding one string or integer per row "
                         "(e.g. env_name, data_source)")
    return out
