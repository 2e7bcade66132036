"""JSONL dumps (NeMo-RL, prime-rl): one JSON object per sequence, parsed by pyarrow in blocks.

pyarrow's JSON reader parses whole blocks in C++ and keeps only the fields we name, so neither a
Python loop over records nor the unused streams (token ids, advantages, entropy, ...) cost anything.
The field types come from the first record; JSON `null` inside a log-prob array becomes NaN (a
non-finite value, excluded and counted on valid tokens), and a log-prob array that is `null` as a
whole becomes NaN of the mask's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..errors import InputError
from ._common import check_file, missing_group, reason
from .aliases import ADVANTAGE_ALIASES, resolve_roles
from .arrays import to_numpy
from .detect import first_record
from .options import ReadOptions
from .validate import Column, Decoded, PerRow

_MIN_BLOCK = 4 << 20
_SCAN_BLOCK = 16 << 20
_MASK_SNIFF = 4096  # first values of the first record's mask that decide bool vs number


@dataclass(frozen=True)
class Flavor:
    """What differs between JSONL writers: where the step, the id and extra row masks live."""

    name: str  # "nemo-rl" | "prime-rl"
    id_fields: tuple[str, ...]  # first one present in the first record is the sequence id
    row_mask_field: str | None  # a per-record scalar that zeroes the whole row's mask when 0
    default_groups: tuple[str, ...]  # group columns attached whenever present (for convert)
    step_from_path: int | None  # the step the file name / folder carries, used without a step field
    parse_hint: str  # how to fix an unparsable file


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "array" | "scalar"
    nested: bool  # wrapped in a one-element list (NeMo-RL logs each record as a micro-batch of one)
    element: pa.DataType

    def arrow_type(self) -> pa.DataType:
        value = pa.list_(self.element) if self.kind == "array" else self.element
        return pa.list_(value) if self.nested else value


def _array_field(name: str, value: object, mask: bool) -> _Field:
    nested = isinstance(value, list) and len(value) > 0 and isinstance(value[0], list)
    inner = value[0] if nested and isinstance(value, list) else value
    is_bool = mask and isinstance(inner, list) and any(isinstance(v, bool) for v in inner[:_MASK_SNIFF])
    return _Field(name, "array", nested, pa.bool_() if is_bool else pa.float64())


def _scalar_field(name: str, value: object, source: str) -> _Field:
    nested = isinstance(value, list)
    if nested and isinstance(value, list):
        if len(value) != 1:
            raise InputError(
                f"expected field {name!r} to hold one value per record, got a list of {len(value)} in {source} "
                "record 0",
                hint="group by a field with one label per record (e.g. env_name)",
            )
        value = value[0]
    if isinstance(value, bool):
        element: pa.DataType = pa.bool_()
    elif isinstance(value, int):
        element = pa.int64()
    elif isinstance(value, float):
        element = pa.float64()
    elif value is None or isinstance(value, str):
        element = pa.string()
    else:
        raise InputError(
            f"expected field {name!r} to hold a number or a string, got {type(value).__name__} in {source} record 0",
            hint="group by a field with one label per record (e.g. env_name)",
        )
    return _Field(name, "scalar", nested, element)


def longest_line(path: str) -> int:
    """Length in bytes of the file's longest line (pyarrow's block must hold a whole record)."""
    longest, partial = 0, 0
    with open(path, "rb") as handle:
        while block := handle.read(_SCAN_BLOCK):
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            if len(newlines) == 0:
                partial += len(block)
                continue
            longest = max(longest, partial + int(newlines[0]))
            if len(newlines) > 1:
                longest = max(longest, int(np.diff(newlines).max()) - 1)
            partial = len(block) - int(newlines[-1]) - 1
    return max(longest, partial)


def _unwrap(column: pa.Array, field: _Field, source: str, first_row: int) -> pa.Array:
    """The value of a one-element-list field; an empty or null wrapper becomes null."""
    if not field.nested:
        return column
    lengths = to_numpy(pc.fill_null(pc.list_value_length(column), 0))
    too_long = lengths > 1
    if too_long.any():
        row = int(np.argmax(too_long))
        raise InputError(
            f"expected field {field.name!r} to wrap one value per record, got {int(lengths[row])} in {source} "
            f"row {first_row + row}",
            hint="every record of the file must be one sequence",
        )
    if (lengths == 0).any():
        column = pc.if_else(pa.array(lengths == 1), column, pa.nulls(len(column), column.type))
    return pc.list_element(column, 0)


@dataclass
class _Array:
    values: np.ndarray
    lengths: np.ndarray  # int64 per row (0 for a null row)
    null_rows: np.ndarray  # bool per row
    nulls: np.ndarray | None = None  # bool per value of a mask holding nulls (the validator refuses them)


def _array(column: pa.Array, field: _Field, role: str, source: str, first_row: int) -> _Array:
    column = _unwrap(column, field, source, first_row)
    lengths = to_numpy(pc.fill_null(pc.list_value_length(column), 0)).astype(np.int64)
    null_rows = to_numpy(column.is_null())
    flat = column.flatten()
    if role == "response_mask":
        if null_rows.any():
            row = int(np.argmax(null_rows))
            raise InputError(
                f"expected a response_mask array, got null in {source} row {first_row + row} field {field.name!r}",
                hint="every record needs its mask (1 = trained-on token)",
            )
    nulls = to_numpy(flat.is_null()) if role == "response_mask" and flat.null_count else None
    return _Array(to_numpy(flat), lengths, null_rows, nulls)


def _fill_null_rows(array: _Array, target: np.ndarray) -> _Array:
    """NaN rows of the target length where the whole array was null (an absent stream)."""
    lengths = np.where(array.null_rows, target, array.lengths)
    out = np.full(int(lengths.sum()), np.nan, dtype=np.float64)
    out[np.repeat(~array.null_rows, lengths)] = array.values
    return _Array(out, lengths, np.zeros_like(array.null_rows))


def _scalars(column: pa.Array, field: _Field, source: str, first_row: int) -> np.ndarray:
    column = _unwrap(column, field, source, first_row)
    if column.null_count and not pa.types.is_string(column.type):
        column = column.cast(pa.string())  # nulls stay None rather than NaN
    return to_numpy(column)


def _rechunk(record_batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of exactly `rows` rows (the last may be shorter), whatever the parser's block held."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for record_batch in record_batches:
        pending.append(record_batch)
        count += record_batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending).combine_chunks()
            yield from table.slice(0, rows).to_batches()
            rest = table.slice(rows)
            pending, count = list(rest.to_batches()), rest.num_rows
    if count:
        yield from pa.Table.from_batches(pending).combine_chunks().to_batches()


def decode_records(path: str, options: ReadOptions, flavor: Flavor) -> Iterator[Decoded]:
    """Stream a JSONL dump of one record per sequence as decoded chunks of at most `chunk_rows` rows."""
    check_file(path)
    record = first_record(path)
    if record is None:
        raise InputError(
            f"cannot read {path} as {flavor.name} JSONL: its first line is not a JSON object",
            hint=flavor.parse_hint,
        )
    available = list(record)
    roles = resolve_roles(available, options, path, noun="field")
    names = {role: name for role, name in roles.items() if name is not None}
    fields: dict[str, _Field] = {
        name: _array_field(name, record[name], role == "response_mask") for role, name in names.items()
    }
    step_name = options.step_column if options.step_column in record else None
    id_name = next((f for f in flavor.id_fields if f in record), None)
    row_mask = flavor.row_mask_field if flavor.row_mask_field in record else None
    groups = list(dict.fromkeys([*options.group_columns, *(g for g in flavor.default_groups if g in record)]))
    for column in options.group_columns:
        if column not in record:
            raise missing_group(column, path, available, noun="field")
    for name in (step_name, id_name, row_mask, *groups):
        if name is not None and name not in fields:
            fields[name] = _scalar_field(name, record[name], path)
    advantage = next((n for n in ADVANTAGE_ALIASES if n in record and n not in fields), None)
    if advantage is not None:  # per token (a list) or per record (a number)
        value = record[advantage]
        fields[advantage] = (_array_field(advantage, value, False) if isinstance(value, list)
                             else _scalar_field(advantage, value, path))

    schema = pa.schema([(f.name, f.arrow_type()) for f in fields.values()])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    first_row = 0
    try:
        block = max(_MIN_BLOCK, 4 * (longest_line(path) + 2))
        reader = pj.open_json(path, read_options=pj.ReadOptions(block_size=block), parse_options=parse)
        for part in _rechunk(reader, options.chunk_rows):
            yield _decode(part, names, fields, step_name, id_name, row_mask, groups, flavor, path, first_row,
                            advantage)
            first_row += part.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(
            f"cannot read {path} as {flavor.name} JSONL: {reason(exc)} (after record {first_row})",
            hint=flavor.parse_hint,
        ) from exc


def _decode(
    part: pa.RecordBatch,
    names: dict[str, str],
    fields: dict[str, _Field],
    step_name: str | None,
    id_name: str | None,
    row_mask: str | None,
    groups: list[str],
    flavor: Flavor,
    source: str,
    first_row: int,
    advantage: str | None = None,
) -> Decoded:
    arrays = {role: _array(part.column(name), fields[name], role, source, first_row) for role, name in names.items()}
    if "response_mask" in arrays:
        target = arrays["response_mask"].lengths
    else:
        old, rollout = arrays["old_log_probs"], arrays["rollout_log_probs"]
        target = np.where(old.null_rows, rollout.lengths, old.lengths)
    for role in ("old_log_probs", "rollout_log_probs"):
        if arrays[role].null_rows.any():
            arrays[role] = _fill_null_rows(arrays[role], target)
    roles = {role: Column(a.values, _offsets(a.lengths), names[role], a.nulls) for role, a in arrays.items()}
    keep = None
    if row_mask is not None:
        keep = _row_keep(_unwrap(part.column(row_mask), fields[row_mask], source, first_row))
    if step_name is not None:
        steps: PerRow | None = _steps(_unwrap(part.column(step_name), fields[step_name], source, first_row),
                                      step_name, source, first_row)
    elif flavor.step_from_path is not None:
        steps = PerRow(flavor.step_from_path, f"the name of {source}")
    else:
        steps = None
    advantages = None
    if advantage is not None:
        field = fields[advantage]
        if field.kind == "array":
            found = _array(part.column(advantage), field, "advantages", source, first_row)
            advantages = Column(found.values, _offsets(found.lengths), advantage)
        else:
            advantages = Column(_scalars(part.column(advantage), field, source, first_row), None, advantage)
    return Decoded(
        source=source,
        first_row=first_row,
        old_log_probs=roles["old_log_probs"],
        rollout_log_probs=roles["rollout_log_probs"],
        response_mask=roles.get("response_mask"),
        noun="field",
        row_keep=keep,
        steps=steps,
        sequence_ids=_scalars(part.column(id_name), fields[id_name], source, first_row) if id_name else None,
        groups={g: PerRow(_scalars(part.column(g), fields[g], source, first_row), f"{source} field {g!r}")
                for g in groups},
        advantages=advantages,
    )


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _row_keep(column: pa.Array) -> np.ndarray:
    """Rows a per-record sample mask keeps: non-zero or null (NeMo-RL multiplies the token mask by it)."""
    if pa.types.is_boolean(column.type):
        return to_numpy(pc.fill_null(column, True))
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return to_numpy(pc.fill_null(pc.not_equal(column, 0), True))
    return np.ones(len(column), dtype=bool)


def _steps(column: pa.Array, name: str, source: str, first_row: int) -> PerRow:
    if column.null_count or not pa.types.is_integer(column.type):
        bad = to_numpy(column.is_null()) if column.null_count else np.ones(len(column), bool)
        row = int(np.argmax(bad))
        raise InputError(
            f"expected an integer step, got {column[row].as_py()!r} in {source} row {first_row + row} field {name!r}",
            hint="every record needs an integer step, or drop the field to take the step from the file name",
        )
    return PerRow(to_numpy(column), f"{source} field {name!r}", "step")
