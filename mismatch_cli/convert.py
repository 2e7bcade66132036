"""`mismatch convert`: stream any supported dump into mismatch's wide parquet layout.

One row per sequence: `old_log_probs`, `rollout_log_probs` (list of float32 or float64) and
`response_mask` (list of int8), plus `step` (int64) when the input knows it, `uid` (string) when it
has sequence ids, and the group columns the readers attach (prime-rl's `env_name`, `--keep COLUMN`).
Values are copied as they are (NaN, sentinels and padding included), so analyzing the converted
file gives the same numbers as analyzing the original. Memory is bounded by one reader chunk; the
file appears only once complete (written under a temporary name, then renamed; `output.streamed_file`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mismatch_cli.batch import Batch
from mismatch_cli.errors import DataError, MissingGroupError, UsageError
from mismatch_cli.io import InputFile, ReadOptions, discover_inputs, discovery_warnings, iter_batches
from mismatch_cli.system.output import streamed_file

FLOAT_TYPES = {"float32": (pa.float32(), np.float32), "float64": (pa.float64(), np.float64)}
ROLE_COLUMNS = ("old_log_probs", "rollout_log_probs", "response_mask")
QUALITY_NOTES = {
    "nonfinite_tokens": "valid tokens with a NaN or infinite log-prob (copied as they are; analyze excludes them)",
    "sentinel_tokens": "valid tokens with a sentinel log-prob <= -9000 (copied; analyze excludes them)",
    "positive_logprob_tokens": "valid tokens with a log-prob > 0 (copied; analyze keeps and counts them)",
    "one_side_zero_tokens": "valid tokens with a log-prob of exactly 0.0 on one side only (copied; analyze keeps "
    "and counts them)",
}


@dataclass
class ConvertSummary:
    """What `convert` wrote: the file, its inputs, its columns and what the data held."""

    path: str
    inputs: list[InputFile]
    columns: list[str]
    sequences: int = 0
    positions: int = 0
    valid_tokens: int = 0
    quality: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _schema(batch: Batch, float_type: pa.DataType) -> pa.Schema:
    fields = [
        pa.field("old_log_probs", pa.list_(float_type)),
        pa.field("rollout_log_probs", pa.list_(float_type)),
        pa.field("response_mask", pa.list_(pa.int8())),
    ]
    if batch.steps is not None:
        fields.append(pa.field("step", pa.int64()))
    if batch.sequence_ids is not None:
        fields.append(pa.field("uid", pa.string()))
    for name, values in batch.groups.items():
        if name in ROLE_COLUMNS or name in ("step", "uid"):
            continue
        fields.append(pa.field(name, pa.int64() if values.dtype.kind in "iu" else pa.string()))
    return pa.schema(fields)


def _strings(values: np.ndarray | None, rows: int) -> pa.Array:
    if values is None:
        return pa.nulls(rows, pa.string())
    try:
        return pa.array(values).cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Mixed ids (ints and strings in one object array): spell each one out.
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def _list(values: np.ndarray, offsets: np.ndarray, dtype: type, arrow_type: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values.astype(dtype, copy=False), type=arrow_type)
    )


def _record_batch(batch: Batch, schema: pa.Schema, float_type: pa.DataType, float_np: type) -> pa.RecordBatch:
    rows = batch.num_rows
    columns: list[pa.Array] = [
        _list(batch.old_log_probs, batch.offsets, float_np, float_type),
        _list(batch.rollout_log_probs, batch.offsets, float_np, float_type),
        _list(batch.response_mask, batch.offsets, np.int8, pa.int8()),
    ]
    for schema_field in list(schema)[3:]:
        name = schema_field.name
        if name == "step":
            if batch.steps is None:
                raise DataError(
                    f"{batch.source} has no step, but the inputs before it had one; a converted file has a step "
                    "on every row or on none",
                    hint="convert inputs with and without steps into separate files",
                )
            columns.append(pa.array(batch.steps.astype(np.int64, copy=False)))
        elif name == "uid":
            columns.append(_strings(batch.sequence_ids, rows))
        else:
            values = batch.groups.get(name)
            if schema_field.type == pa.int64() and values is not None and values.dtype.kind in "iu":
                columns.append(pa.array(values.astype(np.int64, copy=False)))
            elif schema_field.type == pa.int64():
                columns.append(pa.nulls(rows, pa.int64()))
            else:
                columns.append(_strings(values, rows))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def convert(
    paths: Sequence[str],
    output: str | Path,
    read_options: ReadOptions | None = None,
    dtype: str = "float32",
) -> ConvertSummary:
    """Stream every input into one wide parquet file at `output`, written atomically."""
    from mismatch_cli.engine.core.quality import EXCLUDED_CATEGORIES, quality_counts

    if dtype not in FLOAT_TYPES:
        raise UsageError(f"unknown dtype '{dtype}'", hint="use float32 or float64")
    float_type, float_np = FLOAT_TYPES[dtype]
    suffix = Path(output).suffix.lower()
    if suffix and suffix not in (".parquet", ".pq"):
        raise UsageError(f"convert writes parquet, but -o {output} names a {suffix} file",
                         hint="name the output FILE.parquet")
    options = read_options or ReadOptions()
    files = discover_inputs(paths, options.input_format)
    target = Path(output)
    summary = ConvertSummary(path=str(target), inputs=files, columns=[])
    writer: pq.ParquetWriter | None = None
    with streamed_file(target, "-o", inputs=[f.path for f in files]) as tmp:
        try:
            for batch in iter_batches(files, options):
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    schema = _schema(batch, float_type)
                    summary.columns = schema.names
                    writer = pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True)
                writer.write_batch(_record_batch(batch, schema, float_type, float_np))
                _, counts = quality_counts(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask)
                summary.sequences += batch.num_rows
                summary.positions += batch.num_positions
                summary.valid_tokens += counts["masked_tokens"] - sum(counts[c] for c in EXCLUDED_CATEGORIES)
                for key, value in counts.items():
                    summary.quality[key] = summary.quality.get(key, 0) + value
            if writer is None:
                raise DataError(
                    f"the input has no rows ({', '.join(f.path for f in files)})",
                    hint="check that the dump files are not empty",
                )
            writer.close()
        except MissingGroupError as exc:  # the readers name --by; here the column was asked for by --keep
            if writer is not None:
                with suppress(Exception):
                    writer.close()
            raise exc.asked_by(f"--keep {exc.column}") from None
        except BaseException:
            if writer is not None:
                with suppress(Exception):  # the original error is the one to report
                    writer.close()
            raise
    summary.warnings.extend(discovery_warnings(files))
    for key, text in QUALITY_NOTES.items():
        if summary.quality.get(key):
            summary.warnings.append(f"{summary.quality[key]} {text}")
    return summary
