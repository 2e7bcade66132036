"""The synthetic tokens: row structure, lengths and log-prob values, generated block by block from the spec."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mismatch_cli.synth.spec import SynthSpec

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
