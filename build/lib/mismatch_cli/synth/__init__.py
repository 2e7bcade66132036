"""Realistic synthetic rollout dumps (trainer vs inference-engine log-probs), written chunk by chunk.

The data imitate a bf16 inference engine (vLLM / SGLang) against an fp32 trainer (FSDP / Megatron):
rollout log-probs concentrated near 0 with a long tail, a trainer side that disagrees by bf16-sized
noise growing with |log-prob|, rare catastrophic tokens, log-normal response lengths and, for
agent trajectories, several rounds separated by tool / environment tokens, later rounds diverging
more. Generation is vectorized per block of rows and streamed to disk, so memory does not grow with
the dump size. The data depend only on the spec (never on `row_group_tokens` or the format): the
same seed gives the same tokens in parquet, padded and packed safetensors.

Layout: `spec` (the request and the summary), `values` (the tokens), here the validation and the writers.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mismatch_cli.errors import UsageError
from mismatch_cli.synth.spec import FORMATS, LAYOUTS, SynthSpec, SynthSummary
from mismatch_cli.synth.values import _Chunk, _chunks, _plan
from mismatch_cli.system.output import streamed_file

_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int8): "I8", np.dtype(np.int64): "I64"}


def write_synthetic_dump(path: str | Path, spec: SynthSpec) -> SynthSummary:
    """Write a synthetic rollout dump described by `spec` to `path` and summarize what was written."""
    _validate(spec)
    path = Path(path)
    row_positions, row_tokens = _plan(spec)
    with streamed_file(path, "") as tmp:  # the dump appears only once complete
        if spec.format == "parquet":
            _write_parquet(Path(tmp), spec, row_positions)
        else:
            _write_safetensors(Path(tmp), spec, row_positions)
    return SynthSummary(
        path=str(path),
        sequences=len(row_positions),
        tokens=int(row_tokens.sum()),
        positions=int(row_positions.sum()),
    )


MAX_NOISE = 1e4  # far past any real gap; beyond it the float32 log-probs overflow


def _validate(spec: SynthSpec) -> None:
    """Reject a spec that cannot describe a dump, saying which field and how to fix it."""
    checks: list[tuple[bool, str, str]] = [
        (spec.tokens >= 1, f"tokens must be >= 1, got {spec.tokens}", "ask for at least one token"),
        (spec.turns >= 1, f"turns must be >= 1, got {spec.turns}", "use 1 for single-turn rows"),
        (spec.seed >= 0, f"seed must be >= 0, got {spec.seed}", "use a non-negative seed"),
        (
            spec.format in FORMATS,
            f"format must be one of {', '.join(FORMATS)}, got {spec.format!r}",
            "pick parquet or safetensors",
        ),
        (
            spec.layout in LAYOUTS,
            f"layout must be one of {', '.join(LAYOUTS)}, got {spec.layout!r}",
            "pick padded or packed",
        ),
        (
            0.0 <= spec.empty_rows < 1.0,
            f"empty_rows must be in [0, 1), got {spec.empty_rows}",
            "give a fraction of rows, e.g. 0.02",
        ),
        (spec.steps >= 1, f"steps must be >= 1, got {spec.steps}", "use 1 for a single step"),
        (
            spec.format != "safetensors" or spec.steps == 1,
            f"a safetensors dump holds one step, got steps={spec.steps}",
            "write parquet for several steps, or one safetensors file per step",
        ),
        (
            math.isfinite(spec.noise) and 0.0 <= spec.noise <= MAX_NOISE,
            f"noise must be in [0, {MAX_NOISE:g}], got {spec.noise:g}",
            "use 1.0 for bf16-like disagreement",
        ),
        (
            0.0 <= spec.catastrophic_rate <= 1.0,
            f"catastrophic_rate must be in [0, 1], got {spec.catastrophic_rate}",
            "give a fraction of tokens, e.g. 2e-5",
        ),
        (spec.mean_length >= 1, f"mean_length must be >= 1, got {spec.mean_length}", "use e.g. 512"),
        (
            spec.row_group_tokens >= 1,
            f"row_group_tokens must be >= 1, got {spec.row_group_tokens}",
            "use e.g. 1000000",
        ),
    ]
    for ok, message, hint in checks:
        if not ok:
            raise UsageError(f"synthetic dump: {message}", hint)


def _spec_metadata(spec: SynthSpec) -> str:
    """The spec as JSON, stored in the file so that a dump says how it was made."""
    return json.dumps({"generator": "mismatch synth", **asdict(spec)}, sort_keys=True)


def _write_parquet(path: Path, spec: SynthSpec, row_positions: np.ndarray) -> None:
    """Stream chunks into row groups of at most `row_group_tokens` positions (one row may exceed it)."""
    fields = [
        pa.field("old_log_probs", pa.list_(pa.float32())),
        pa.field("rollout_log_probs", pa.list_(pa.float32())),
        pa.field("response_mask", pa.list_(pa.int8())),
        pa.field("uid", pa.int64()),
    ]
    if spec.steps > 1:
        fields.append(pa.field("step", pa.int64()))
    schema = pa.schema(fields, metadata={"mismatch.synth": _spec_metadata(spec)})
    floats = ("old_log_probs", "rollout_log_probs")
    with pq.ParquetWriter(
        path,
        schema,
        compression="zstd",
        use_dictionary=False,
        # Byte-stream split makes float mantissas compressible; every parquet reader decodes it.
        column_encoding={f"{name}.list.element": "BYTE_STREAM_SPLIT" for name in floats},
        write_statistics=["uid", "step"],
        write_page_checksum=True,  # readers verify the CRC: a corrupted copy is refused, not misread
    ) as writer:
        pending: _Chunk | None = None
        for chunk in _chunks(spec, len(row_positions)):
            if pending is not None:
                chunk = _concatenate(pending, chunk)
            pending = None
            start = 0
            while start < chunk.num_rows:
                limit = chunk.offsets[start] + spec.row_group_tokens
                stop = max(int(np.searchsorted(chunk.offsets, limit, side="right")) - 1, start + 1)
                if (
                    stop == chunk.num_rows
                    and chunk.offsets[stop] - chunk.offsets[start] < spec.row_group_tokens
                ):
                    pending = chunk.rows(start, stop)  # room left: fill it from the next block
                    break
                _write_row_group(writer, schema, chunk.rows(start, stop))
                start = stop
        if pending is not None:
            _write_row_group(writer, schema, pending)


def _concatenate(first: _Chunk, second: _Chunk) -> _Chunk:
    """Rows of `first` followed by rows of `second`."""
    return _Chunk(
        np.concatenate([first.old_log_probs, second.old_log_probs]),
        np.concatenate([first.rollout_log_probs, second.rollout_log_probs]),
        np.concatenate([first.response_mask, second.response_mask]),
        np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]]),
        np.concatenate([first.steps, second.steps]),
        np.concatenate([first.uids, second.uids]),
    )


def _write_row_group(writer: pq.ParquetWriter, schema: pa.Schema, chunk: _Chunk) -> None:
    """Write one chunk as exactly one row group."""
    offsets = pa.array(chunk.offsets.astype(np.int32))
    columns = {
        "old_log_probs": pa.ListArray.from_arrays(offsets, pa.array(chunk.old_log_probs)),
        "rollout_log_probs": pa.ListArray.from_arrays(offsets, pa.array(chunk.rollout_log_probs)),
        "response_mask": pa.ListArray.from_arrays(offsets, pa.array(chunk.response_mask)),
        "uid": pa.array(chunk.uids),
        "step": pa.array(chunk.steps),
    }
    table = pa.Table.from_arrays([columns[name] for name in schema.names], schema=schema)
    writer.write_table(table, row_group_size=max(chunk.num_rows, 1))


def _write_safetensors(path: Path, spec: SynthSpec, row_positions: np.ndarray) -> None:
    """Write the safetensors format by hand, tensor regions filled block by block (bounded memory)."""
    rows, width, total = len(row_positions), int(row_positions.max()), int(row_positions.sum())
    packed = spec.layout == "packed"
    value_shape = [total] if packed else [rows, width]
    tensors: list[tuple[str, np.dtype, list[int]]] = []
    if packed:
        tensors.append(("num_tokens", np.dtype(np.int64), [rows]))
    tensors += [
        ("old_log_probs", np.dtype(np.float32), value_shape),
        ("rollout_log_probs", np.dtype(np.float32), value_shape),
        ("response_mask", np.dtype(np.int8), value_shape),
    ]
    header: dict[str, object] = {"__metadata__": {"mismatch.synth": _spec_metadata(spec)}}
    begins: dict[str, int] = {}
    cursor = 0
    for name, dtype, shape in tensors:
        size = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": shape,
            "data_offsets": [cursor, cursor + size],
        }
        begins[name] = cursor
        cursor += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-(8 + len(header_bytes)) % 8)  # data starts 8-byte aligned
    data_start = 8 + len(header_bytes)

    with path.open("wb") as file:  # path: the temporary file output.streamed_file gave write_synthetic_dump
        file.write(struct.pack("<Q", len(header_bytes)))
        file.write(header_bytes)
        file.truncate(data_start + cursor)
        if packed:
            _write_at(file, data_start + begins["num_tokens"], row_positions.astype(np.int64))
        written_rows, written_positions = 0, 0
        for chunk in _chunks(spec, rows):
            arrays = {
                "old_log_probs": chunk.old_log_probs,
                "rollout_log_probs": chunk.rollout_log_probs,
                "response_mask": chunk.response_mask,
            }
            for name, values in arrays.items():
                if packed:
                    _write_at(file, data_start + begins[name] + written_positions * values.itemsize, values)
                else:
                    # Right padding: mask 0 and log-prob 0.0 after each row's last position.
                    padded = np.zeros((chunk.num_rows, width), dtype=values.dtype)
                    lengths = np.diff(chunk.offsets)
                    row = np.repeat(np.arange(chunk.num_rows), lengths)
                    column = np.arange(len(values)) - np.repeat(chunk.offsets[:-1], lengths)
                    padded[row, column] = values
                    _write_at(
                        file, data_start + begins[name] + written_rows * width * values.itemsize, padded
                    )
            written_rows += chunk.num_rows
            written_positions += int(chunk.offsets[-1])


def _write_at(file: BinaryIO, offset: int, values: np.ndarray) -> None:
    """Write an array's bytes (little-endian, C order) at a byte offset of the file."""
    file.seek(offset)
    file.write(np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes())
