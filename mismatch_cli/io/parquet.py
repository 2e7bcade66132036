"""Wide-layout parquet: one row per sequence, each role a list column."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ._common import check_file, missing_group, reason
from .aliases import ADVANTAGE_ALIASES, LAG_COLUMNS, PROCESS_COLUMN, TOKEN_ID_COLUMNS, VERSION_COLUMNS, resolve_roles
from .arrays import to_numpy
from .options import ReadOptions
from .remote import is_remote, open_remote, store_error
from .validate import Column, Decoded, PerRow

_READ_HINT = "check that the file is a complete parquet file (re-export it if it was truncated or half-written)"
_CHECKSUM_HINT = ("the file changed after it was written (a bad copy, disk or transfer): copy it again from its "
                  "source, or re-export it")


def _read_error(path: str, exc: BaseException, after: str = "") -> InputError:
    """The InputError for a pyarrow failure; a page whose CRC does not match says so (the data is corrupt)."""
    text = reason(exc)
    known = store_error(exc, path) if is_remote(path) else None
    if known is not None:
        return known  # the network, the credentials or a vanished object, not the file's bytes
    if "checksum" in text.lower() or "crc" in text.lower():
        return InputError(f"cannot read {path}: a data page failed its CRC checksum, so its bytes are corrupt{after}",
                          hint=_CHECKSUM_HINT)
    return InputError(f"cannot read {path} as parquet: {text}{after}", hint=_READ_HINT)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _check_role_type(field: pa.Field, role: str, source: str) -> None:
    value_type = field.type.value_type if _is_list(field.type) else None
    if value_type is not None and pa.types.is_floating(value_type):
        return
    if value_type is not None and role == "response_mask":
        if pa.types.is_boolean(value_type) or pa.types.is_integer(value_type):
            return
    expected = "a list of bool, int or float" if role == "response_mask" else "a list of float32 or float64"
    raise InputError(
        f"expected {expected} for {role}, got {field.type} in {source} column {field.name!r}",
        hint=f"store {role} as one list per row, or point --column {role}=NAME at the right column",
    )


def _process_index(column: pa.Array, name: str, source: str, first_row: int) -> PerRow:
    """The per-row process rank as read; a null names its row."""
    if column.null_count:
        row = int(np.argmax(to_numpy(column.is_null())))
        raise InputError(f"expected a {name} on every row, got null in {source} row {first_row + row} column {name!r}",
                         hint=f"write the rank that held each row, or drop the {name} column")
    return PerRow(to_numpy(column), f"{source} column {name!r}", name)


def _check_advantage_type(field: pa.Field, source: str) -> None:
    t = field.type.value_type if _is_list(field.type) else field.type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t)):
        raise InputError(f"expected numbers (one per token, or one per row) for advantages, got {field.type} in "
                         f"{source} column {field.name!r}",
                         hint="store advantages as a float list per row or a float per row, or rename the column")


def _flatten(arr: pa.Array, role: str, name: str, source: str, first_row: int) -> Column:
    """Flat values, chunk-relative int64 offsets and null positions (None: none) of a list array, no loop over rows.

    A null value becomes NaN (None in a bool mask) here; the validator refuses it on a valid token, since
    padding (mask 0) may hold anything.
    """
    if arr.null_count:
        row = int(np.argmax(to_numpy(arr.is_null())))
        raise InputError(
            f"expected a list of {role} values, got null in {source} row {first_row + row} column {name!r}",
            hint="drop or fill rows with a missing list before dumping",
        )
    # The child values by slicing, not arr.flatten(): that one imports pyarrow.compute (~0.25 s of start-up).
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        offsets = np.arange(len(arr) + 1, dtype=np.int64) * size
        flat = arr.values.slice(arr.offset * size, len(arr) * size)
    else:
        raw = to_numpy(arr.offsets)
        offsets = raw.astype(np.int64) - int(raw[0])
        flat = arr.values.slice(int(raw[0]), int(raw[-1]) - int(raw[0]))
    nulls = to_numpy(flat.is_null()) if flat.null_count else None
    return Column(to_numpy(flat), offsets, name, nulls)


def _steps(arr: pa.Array, name: str, source: str, first_row: int) -> PerRow:
    if arr.null_count:
        row = int(np.argmax(to_numpy(arr.is_null())))
        raise InputError(
            f"expected an integer step, got null in {source} row {first_row + row} column {name!r}",
            hint="fill the step column, or drop it",
        )
    return PerRow(to_numpy(arr), f"{source} column {name!r}", "step")


def decode_parquet(path: str, options: ReadOptions, row_groups: Sequence[int] | None = None) -> Iterator[Decoded]:
    """Stream a wide parquet file (or some of its row groups) as decoded chunks, reading only the needed columns."""
    source = _source(path)
    try:
        # Pages written with a CRC (ours are) are verified, so a flipped bit is refused, not read as data;
        # pages without one are read as before.
        handle = pq.ParquetFile(source, pre_buffer=False, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        _close(source)
        raise _read_error(path, exc) from exc
    try:
        with handle:
            yield from _read_open(handle, path, options, row_groups)
    finally:
        _close(source)


def _source(path: str) -> str | pa.NativeFile:
    """What pyarrow opens: a checked local path, or a ranged-read file over an object-store URI."""
    if is_remote(path):
        return open_remote(path)
    check_file(path)
    return path


def _close(source: str | pa.NativeFile) -> None:
    if not isinstance(source, str):
        source.close()


def parquet_metadata(path: str) -> pq.FileMetaData:
    """The footer of a local or object-store parquet file (an OSError or ArrowException when unreadable)."""
    if is_remote(path):
        with open_remote(path) as handle:
            return pq.ParquetFile(handle, pre_buffer=False).metadata
    return pq.ParquetFile(path, pre_buffer=False).metadata


def row_group_count(path: str) -> int:
    """Number of row groups of a parquet file (0 when its footer cannot be read; the reader reports why)."""
    return len(row_group_bytes(path))


def row_group_bytes(path: str) -> list[int]:
    """Each row group's uncompressed size in bytes (none when the footer cannot be read; the reader says why)."""
    try:
        metadata = parquet_metadata(path)
        return [metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)]
    except (pa.ArrowException, OSError, InputError):
        return []


def _read_open(handle: pq.ParquetFile, path: str, options: ReadOptions,
               row_groups: Sequence[int] | None = None) -> Iterator[Decoded]:
    schema = handle.schema_arrow
    available = schema.names
    roles = resolve_roles(available, options, path)
    names = {role: name for role, name in roles.items() if name is not None}
    _refuse_duplicates(available, [*names.values(), options.step_column, *options.id_columns,
                                   *options.group_columns], path)
    for role, name in names.items():
        _check_role_type(schema.field(name), role, path)

    step_name: str | None = None
    if options.step_column in available:
        step_type = schema.field(options.step_column).type
        if not pa.types.is_integer(step_type):
            raise InputError(
                f"expected an integer step column, got {step_type} in {path} column {options.step_column!r}",
                hint="store the training step as an integer column, or drop or rename the column",
            )
        step_name = options.step_column
    id_name = next(
        (
            name
            for name in options.id_columns
            if name in available
            and (
                pa.types.is_integer(schema.field(name).type)
                or pa.types.is_string(schema.field(name).type)
                or pa.types.is_large_string(schema.field(name).type)
            )
        ),
        None,
    )
    for column in options.group_columns:
        if column not in available:
            raise missing_group(column, path, list(available))
        _check_group_type(schema.field(column), path)
    groups = tuple(options.group_columns)
    advantage_name = next((n for n in ADVANTAGE_ALIASES if n in available and n not in names.values()), None)
    if advantage_name is not None:
        _check_advantage_type(schema.field(advantage_name), path)
    process_name = PROCESS_COLUMN if PROCESS_COLUMN in available else None
    if process_name is not None and not pa.types.is_integer(schema.field(process_name).type):
        raise InputError(f"expected an integer {process_name} column (the rank that held each row), got "
                         f"{schema.field(process_name).type} in {path}",
                         hint=f"store {process_name} as an integer per row, or rename the column")
    version = _version_column(schema, set(names.values()) | set(groups) | {step_name})
    ids = next((n for n in TOKEN_ID_COLUMNS if n in available and available.count(n) == 1 and _is_list(
        schema.field(n).type) and pa.types.is_integer(schema.field(n).type.value_type)), None)
    extra = (step_name, id_name, advantage_name, process_name, version[0] if version else None, ids)
    needed = list(dict.fromkeys([*names.values(), *(n for n in extra if n is not None), *groups]))

    metadata = handle.metadata
    selected = range(metadata.num_row_groups) if row_groups is None else row_groups
    first_row = sum(metadata.row_group(g).num_rows for g in range(min(selected, default=0)))
    try:
        # One row group at a time, so a row-group range read on its own (parallel reading) yields exactly
        # the batches a whole-file read does.
        for group in selected:
            for record_batch in handle.iter_batches(batch_size=options.chunk_rows, columns=needed, row_groups=[group]):
                if record_batch.num_rows == 0:
                    continue
                decoded = _decode(record_batch, names, step_name, id_name, groups, path, first_row, advantage_name,
                                  process_name)
                if version is not None:
                    column = record_batch.column(version[0])
                    values = _flatten(column, "version", version[0], path, first_row) if _is_list(column.type) \
                        else Column(to_numpy(column.cast(pa.float64())), None, version[0])
                    decoded = replace(decoded, policy_versions=values, version_kind=version[1])
                if ids is not None:
                    decoded = replace(decoded, token_ids=_flatten(record_batch.column(ids), "token id", ids, path,
                                                                  first_row))
                yield decoded
                first_row += record_batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise _read_error(path, exc, f" (after row {first_row})") from exc


def _version_column(schema: pa.Schema, taken: set[str | None]) -> tuple[str, str] | None:
    """The first lag or policy-version column holding integers (one per row or a list per row), and its kind."""
    for names, kind in ((LAG_COLUMNS, "lag"), (VERSION_COLUMNS, "version")):
        for name in names:
            if name in schema.names and name not in taken and schema.names.count(name) == 1:
                t = schema.field(name).type
                t = t.value_type if _is_list(t) else t
                if pa.types.is_integer(t):
                    return name, kind
    return None


def _refuse_duplicates(available: list[str], wanted: list[str], path: str) -> None:
    """Refuse a column this read needs that the file holds twice (which of the two is meant is unknowable)."""
    for name in dict.fromkeys(wanted):
        count = available.count(name)
        if count > 1:
            raise InputError(f"{path} has {count} columns named {name!r}",
                             hint="rename or drop the extra column so each name is unique, then re-run")


def _decode(
    record_batch: pa.RecordBatch,
    names: dict[str, str],
    step_name: str | None,
    id_name: str | None,
    groups: tuple[str, ...],
    source: str,
    first_row: int,
    advantage_name: str | None = None,
    process_name: str | None = None,
) -> Decoded:
    roles = {role: _flatten(record_batch.column(name), role, name, source, first_row) for role, name in names.items()}
    advantages = None
    if advantage_name is not None:
        column = record_batch.column(advantage_name)
        if _is_list(column.type):
            advantages = _flatten(column, "advantages", advantage_name, source, first_row)
        else:
            advantages = Column(to_numpy(column.cast(pa.float64())), None, advantage_name)
    return Decoded(
        source=source,
        first_row=first_row,
        old_log_probs=roles["old_log_probs"],
        rollout_log_probs=roles["rollout_log_probs"],
        response_mask=roles.get("response_mask"),
        steps=_steps(record_batch.column(step_name), step_name, source, first_row) if step_name else None,
        sequence_ids=to_numpy(record_batch.column(id_name)) if id_name else None,
        groups={name: PerRow(_group_values(record_batch.column(name)), f"{source} column {name!r}")
                for name in groups},
        advantages=advantages,
        process_index=_process_index(record_batch.column(process_name), process_name, source, first_row)
        if process_name else None,
    )


def _check_group_type(field: pa.Field, source: str) -> None:
    t = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
    if (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_boolean(t)
        or pa.types.is_floating(t)
    ):
        return
    raise InputError(
        f"expected a string or integer column to group by, got {field.type} in {source} column {field.name!r}",
        hint="group by a column holding one label per row (e.g. env_name, data_source)",
    )


def _group_values(arr: pa.Array) -> np.ndarray:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count and not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())  # keeps nulls as None instead of NaN
    return to_numpy(arr)
