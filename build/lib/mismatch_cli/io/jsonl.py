"""JSONL dumps (NeMo-RL, prime-rl): one JSON object per sequence, parsed by pyarrow in blocks.

pyarrow's JSON reader parses whole blocks in C++ and keeps only the fields we name, so neither a
Python loop over records nor the unused streams (token ids, advantages, entropy, ...) cost anything.
The field types come from the first record, or the first few where it leaves one open (`null`, `[]`);
a later record that still shows another type makes one Python pass over the whole file find the
types every record fits (or refuse the record that fits none), and reading goes on. JSON `null`
inside a log-prob array becomes NaN (a non-finite value, excluded and counted on valid tokens), and
a log-prob array that is `null` as a whole becomes NaN of the mask's length.
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
from .jsonl_types import Field, infer_fields, records
from .options import ReadOptions
from .validate import Column, Decoded, PerRow

_MIN_BLOCK = 4 << 20
_SCAN_BLOCK = 16 << 20


@dataclass(frozen=True)
class Flavor:
    """What differs between JSONL writers: where the step, the id and extra row masks live."""

    name: str  # "nemo-rl" | "prime-rl"
    id_fields: tuple[str, ...]  # first one present in the first record is the sequence id
    row_mask_field: str | None  # a per-record scalar that zeroes the whole row's mask when 0
    default_groups: tuple[str, ...]  # group columns attached whenever present (for convert)
    step_from_path: int | None  # the step the file name / folder carries, used without a step field
    parse_hint: str  # how to fix an unparsable file


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


def _unwrap(column: pa.Array, field: Field, source: str, first_row: int) -> pa.Array:
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


def _array(column: pa.Array, field: Field, role: str, source: str, first_row: int) -> _Array:
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


def _scalars(column: pa.Array, field: Field, source: str, first_row: int) -> np.ndarray:
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
    if record is None and next(records(path), None) is None:
        raise InputError(f"cannot read {path} as {flavor.name} JSONL: the file is empty (no record)",
                         hint="point at a step's file that holds records, or leave this one out")
    if record is None:
        raise InputError(
            f"cannot read {path} as {flavor.name} JSONL: its first line is not a JSON object",
            hint=flavor.parse_hint,
        )
    available = list(record)
    roles = resolve_roles(available, options, path, noun="field")
    names = {role: name for role, name in roles.items() if name is not None}
    wanted = {name: "mask" if role == "response_mask" else "log-probs" for role, name in names.items()}
    step_name = options.step_column if options.step_column in record else None
    id_name = next((f for f in flavor.id_fields if f in record), None)
    row_mask = flavor.row_mask_field if flavor.row_mask_field in record else None
    groups = list(dict.fromkeys([*options.group_columns, *(g for g in flavor.default_groups if g in record)]))
    for column in options.group_columns:
        if column not in record:
            raise missing_group(column, path, available, noun="field")
    for name, role in ((step_name, "step"), (id_name, "id"), (row_mask, "row-mask"), *((g, "group") for g in groups)):
        if name is not None and name not in wanted:
            wanted[name] = role
    advantage = next((n for n in ADVANTAGE_ALIASES if n in record and n not in wanted), None)
    if advantage is not None:  # per token (a list) or per record (a number)
        wanted[advantage] = "advantages"
    fields = infer_fields(path, wanted, advantage, whole=False)

    first_row = 0
    while True:
        try:
            for part in _read(path, fields, options.chunk_rows, first_row):
                yield _decode(part, names, fields, step_name, id_name, row_mask, groups, flavor, path, first_row,
                              advantage)
                first_row += part.num_rows
            return
        except (pa.ArrowInvalid, OSError) as exc:
            # The first records left a type open (null, [], an unwrapped null) that a later one shows otherwise:
            # read every record for the types (refusing one that contradicts another) and go on from here.
            wider = infer_fields(path, wanted, advantage, whole=True) if _type_clash(exc) else fields
            if wider == fields:
                raise InputError(
                    f"cannot read {path} as {flavor.name} JSONL: {reason(exc)} (after record {first_row})",
                    hint=flavor.parse_hint,
                ) from exc
            fields = wider


def _type_clash(exc: Exception) -> bool:
    """Whether pyarrow stopped at a value of another type than the schema's (not at broken JSON)."""
    text = str(exc)
    return isinstance(exc, pa.ArrowInvalid) and ("changed from" in text or "Failed to convert JSON" in text)


def _read(path: str, fields: dict[str, Field], rows: int, skip: int) -> Iterator[pa.RecordBatch]:
    """The file's records as batches of `rows` rows (pyarrow's parser), from row `skip` on."""
    schema = pa.schema([(f.name, f.arrow_type()) for f in fields.values()])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    block = max(_MIN_BLOCK, 4 * (longest_line(path) + 2))
    reader = pj.open_json(path, read_options=pj.ReadOptions(block_size=block), parse_options=parse)
    yield from _rechunk(_skip(reader, skip), rows)


def _skip(record_batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    for record_batch in record_batches:
        if rows >= record_batch.num_rows:
            rows -= record_batch.num_rows
            continue
        yield record_batch.slice(rows) if rows else record_batch
        rows = 0


def _decode(
    part: pa.RecordBatch,
    names: dict[str, str],
    fields: dict[str, Field],
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
            values = _unwrap(part.column(advantage), field, source, first_row).cast(pa.float64())
            advantages = Column(to_numpy(pc.fill_null(values, np.nan)), None, advantage)  # null: NaN
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
