"""Realistic synthetic rollout dumps (trainer vs inference-engine log-probs), written chunk by chunk.

The data imitate a bf16 inference engine (vLLM / SGLang) against an fp32 trainer (FSDP / Megatron):
rollout log-probs concentrated near 0 with a long tail, a trainer side that disagrees by bf16-sized
noise growing with |log-prob|, rare catastrophic tokens, log-normal response lengths and, for
agent trajectories, several rounds separated by tool / environment tokens, later rounds diverging
more. Generation is vectorized per block of rows and streamed to disk, so memory does not grow with
the dump size. The data depend only on the spec (never on `row_group_tokens` or the format): the
same seed gives the same tokens in parquet, padded and packed safetensors.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mismatch_cli.errors import UsageError
from mismatch_cli.output import streamed_file

FORMATS = ("parquet", "safetensors")
LAYOUTS = ("padded", "packed")

# Rollout negative log-likelihood: a mixture of exponentials (weights 80 / 15 / 5 %, scales in
# nats). About 83 % of tokens lie above -0.1, ~2.4 % below -2 and ~2e-5 below -20.
_MIX_CUTS = (0.80, 0.95)
_MIX_SCALES = np.array([0.015, 0.4, 2.5], dtype=np.float32)
# Strictly negative: an exact 0.0 on one side only is what the analyzer flags as a sentinel.
_MIN_NLL = 1e-7
_MAX_NLL = 30.0
_MAX_LOG_PROB = -1e-9

# bf16 keeps ~8 significant bits, so each logit carries a relative error of ~2^-8 of the logit
# scale. The sampled token's log-prob error is (1 - p) times that (errors cancel for confident
# tokens) plus a part growing with |log-prob|, plus a tiny absolute floor.
_BF16_REL = 2.0**-8
_LOGIT_SCALE = 8.0
_ABS_NOISE = 1e-5
# Signed, slightly biased: mean Δ = +0.1 σ (the trainer a little more confident than the engine).
_BIAS = 0.1
_LAPLACE_UNIT = 1.0 / math.sqrt(2.0)  # Laplace scale with unit standard deviation
# Divergence multipliers: per round k (1 + 0.5 k), along the row, and over training steps.
_ROUND_GROWTH = 0.5
_POSITION_GROWTH = 0.25
_STEP_GROWTH = 0.25
# Catastrophic tokens: |Δ| uniform in 3-15 nats; 70 % with the trainer far below the engine.
_CATASTROPHIC_NATS = (3.0, 15.0)
_CATASTROPHIC_NEGATIVE = 0.7

# Lengths: log-normal per turn (σ of the log), capped like a max_response_length.
_LENGTH_SIGMA = 0.8
_MAX_LENGTH_FACTOR = 8
_GAP_RANGE = (5, 200)  # tool / environment tokens between rounds, log-uniform
_PROMPT_RANGE = (16, 512)  # leading prompt tokens of a multi-turn row, log-uniform
_PROMPT_PROBABILITY = 0.5
_TURN_DROP_P = 0.5  # turns of a row = K - (Geometric(p) - 1), at least 1: half the rows reach K

_BLOCK_POSITIONS = 1 << 18  # expected positions generated at once
_MAX_BLOCK_ROWS = 4096

_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int8): "I8", np.dtype(np.int64): "I64"}


@dataclass(frozen=True)
class SynthSpec:
    """What to generate; every field has a realistic default."""

    tokens: int = 100_000  # approx total response (mask=1) tokens
    turns: int = 1  # >1: multi-turn rows (runs of 1s separated by 0-gaps of env/tool tokens)
    seed: int = 0
    format: str = "parquet"  # parquet | safetensors
    layout: str = "padded"  # safetensors only: padded | packed
    empty_rows: float = 0.0  # fraction of rows whose mask is all zero
    steps: int = 1  # rows spread over steps 0..steps-1 (parquet `step` column when steps > 1)
    noise: float = 1.0  # scales the trainer/inference disagreement (for compare demos)
    catastrophic_rate: float = 2e-5  # fraction of response tokens with a large disagreement
    mean_length: int = 512  # mean response length per turn
    row_group_tokens: int = 1_000_000  # parquet: positions per row group at most (bounds readers)


@dataclass(frozen=True)
class SynthSummary:
    """What was written: sequences (rows), valid tokens (mask 1) and positions (any mask, no padding)."""

    path: str
    sequences: int
    tokens: int
    positions: int


@dataclass(frozen=True)
class _Structure:
    """Row shapes of one block: segment lengths [R, 2K] = prompt gap, turn 0, gap 0, ..., turn K-1."""

    segment_lengths: np.ndarray
    empty: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray


@dataclass(frozen=True)
class _Chunk:
    """Whole rows as flat per-position arrays; row i spans offsets[i]:offsets[i+1]."""

    old_log_probs: np.ndarray
    rollout_log_probs: np.ndarray
    response_mask: np.ndarray
    offsets: np.ndarray
    steps: np.ndarray
    uids: np.ndarray

    @property
    def num_rows(self) -> int:
        """Number of rows in the chunk."""
        return len(self.offsets) - 1

    def rows(self, start: int, stop: int) -> _Chunk:
        """Rows start..stop-1 as a chunk of their own (views, no copy)."""
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        return _Chunk(
            self.old_log_probs[first:last],
            self.rollout_log_probs[first:last],
            self.response_mask[first:last],
            self.offsets[start : stop + 1] - first,
            self.steps[start:stop],
            self.uids[start:stop],
        )


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
            math.isfinite(spec.noise) and spec.noise >= 0.0,
            f"noise must be finite and >= 0, got {spec.noise}",
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


def _block_rows(spec: SynthSpec) -> int:
    """Rows generated at once, so that a block holds about _BLOCK_POSITIONS positions."""
    expected_row = spec.turns * (spec.mean_length + 60)
    return int(np.clip(_BLOCK_POSITIONS // expected_row, 1, _MAX_BLOCK_ROWS))


def _rng(spec: SynthSpec, block: int, stream: int) -> np.random.Generator:
    """Independent generator for (seed, block, stream): 0 = row shapes, 1 = values."""
    return np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(block, stream)))


def _log_uniform(
    rng: np.random.Generator, bounds: tuple[int, int], size: int | tuple[int, ...]
) -> np.ndarray:
    """Integers log-uniform between the two bounds (inclusive)."""
    low, high = bounds
    values = np.exp(rng.uniform(math.log(low), math.log(high + 1), size))
    return np.clip(np.floor(values), low, high).astype(np.int64)


def _structure(spec: SynthSpec, block: int) -> _Structure:
    """Row shapes of one block: turns, their lengths, the gaps between them, empty rows."""
    rng = _rng(spec, block, 0)
    rows, turns = _block_rows(spec), spec.turns
    mu = math.log(spec.mean_length) - _LENGTH_SIGMA**2 / 2  # so that the mean is mean_length
    turn_lengths = np.rint(rng.lognormal(mu, _LENGTH_SIGMA, (rows, turns)))
    turn_lengths = np.clip(turn_lengths, 1, _MAX_LENGTH_FACTOR * spec.mean_length).astype(np.int64)
    segments = np.zeros((rows, 2 * turns), dtype=np.int64)
    if turns > 1:
        row_turns = turns - np.minimum(rng.geometric(_TURN_DROP_P, rows) - 1, turns - 1)
        gaps = _log_uniform(rng, _GAP_RANGE, (rows, turns - 1))
        prompts = _log_uniform(rng, _PROMPT_RANGE, rows)
        prompts[rng.random(rows) >= _PROMPT_PROBABILITY] = 0
        index = np.arange(turns)
        turn_lengths[index[None, :] >= row_turns[:, None]] = 0
        gaps[index[None, :-1] >= row_turns[:, None] - 1] = 0
        segments[:, 0] = prompts
        segments[:, 2::2] = gaps
    segments[:, 1::2] = turn_lengths
    empty = rng.random(rows) < spec.empty_rows
    tokens = np.where(empty, 0, turn_lengths.sum(axis=1))
    return _Structure(segments, empty, segments.sum(axis=1), tokens)


def _plan(spec: SynthSpec) -> tuple[np.ndarray, np.ndarray]:
    """Positions and valid tokens of every row: blocks are drawn until `tokens` is reached."""
    positions: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    reached, block = 0, 0
    while reached < spec.tokens:
        shape = _structure(spec, block)
        cumulative = reached + np.cumsum(shape.tokens)
        stop = int(np.searchsorted(cumulative, spec.tokens, side="left")) + 1
        positions.append(shape.positions[:stop])
        tokens.append(shape.tokens[:stop])
        reached = int(cumulative[min(stop, len(cumulative)) - 1])
        block += 1
    return np.concatenate(positions), np.concatenate(tokens)


def _chunks(spec: SynthSpec, total_rows: int) -> Iterator[_Chunk]:
    """Every row of the dump, one block of rows at a time, values included."""
    rows_per_block = _block_rows(spec)
    for block in range(-(-total_rows // rows_per_block)):
        first_row = block * rows_per_block
        chunk = _block_values(spec, block, _structure(spec, block), first_row, total_rows)
        yield chunk.rows(0, min(rows_per_block, total_rows - first_row))


def _block_values(spec: SynthSpec, block: int, shape: _Structure, first_row: int, total_rows: int) -> _Chunk:
    """Log-probs and mask of one block, vectorized over its positions."""
    rng = _rng(spec, block, 1)
    rows, slots = shape.segment_lengths.shape
    uids = np.arange(first_row, first_row + rows, dtype=np.int64)
    steps = np.minimum(uids * spec.steps // total_rows, spec.steps - 1)

    # Per segment: whether it is a response turn (odd slots), its round, and its divergence scale.
    lengths = shape.segment_lengths.ravel()
    slot = np.tile(np.arange(slots), rows)
    segment_row = np.repeat(np.arange(rows), slots)
    is_turn = (slot % 2 == 1) & ~shape.empty[segment_row]
    round_index = np.maximum(slot - 1, 0) // 2
    step_scale = 1.0 + _STEP_GROWTH * steps / max(spec.steps - 1, 1)
    segment_scale = (spec.noise * (1.0 + _ROUND_GROWTH * round_index) * step_scale[segment_row]).astype(
        np.float32
    )
    keep = lengths > 0
    lengths = lengths[keep]
    mask = np.repeat(is_turn[keep], lengths)
    scale = np.repeat(segment_scale[keep], lengths)
    n = len(mask)

    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(shape.positions, out=offsets[1:])
    position = np.arange(n, dtype=np.float32) - np.repeat(offsets[:-1], shape.positions).astype(np.float32)
    scale *= 1.0 + _POSITION_GROWTH * position / (position + spec.mean_length)

    # Rollout side: mixture of exponentials, strictly negative.
    component = rng.random(n, dtype=np.float32)
    nll = rng.standard_exponential(n, dtype=np.float32)
    nll *= _MIX_SCALES[(component >= _MIX_CUTS[0]).astype(np.int8) + (component >= _MIX_CUTS[1])]
    np.clip(nll, _MIN_NLL, _MAX_NLL, out=nll)
    rollout = -nll

    # Trainer side: rollout + signed, slightly biased Laplace noise of bf16 size.
    sigma = _BF16_REL * (_LOGIT_SCALE * -np.expm1(rollout) + nll) + _ABS_NOISE
    sigma *= scale
    laplace = rng.standard_exponential(n, dtype=np.float32) * _LAPLACE_UNIT
    laplace[rng.random(n, dtype=np.float32) < 0.5] *= -1.0
    old = rollout + sigma * (_BIAS + laplace)
    np.minimum(old, _MAX_LOG_PROB, out=old)

    # Catastrophic tokens on the response: the engine and the trainer disagree by 3-15 nats.
    catastrophic = np.flatnonzero(mask & (rng.random(n, dtype=np.float32) < spec.catastrophic_rate))
    magnitude = rng.uniform(*_CATASTROPHIC_NATS, len(catastrophic)).astype(np.float32)
    trainer_low = rng.random(len(catastrophic)) < _CATASTROPHIC_NEGATIVE
    low, high = catastrophic[trainer_low], catastrophic[~trainer_low]
    old[low] = rollout[low] - magnitude[trainer_low]
    old[high] = rollout[high]
    rollout[high] = rollout[high] - magnitude[~trainer_low]

    # Engines score only what they generated: tool / environment tokens carry 0.0 (verl's agent
    # loop pads response_logprobs so); empty rows keep their (masked-out) generated values.
    is_gap = np.repeat((slot % 2 == 0)[keep], lengths)
    rollout[is_gap] = 0.0
    return _Chunk(old, rollout, mask.astype(np.int8), offsets, steps, uids)


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
