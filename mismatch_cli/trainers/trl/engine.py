"""TRL 1.16.0's vLLM importance-sampling correction: its weights per mode and its five `sampling/*` keys.

Formulas: docs/trl-semantics.md (sections 3 and 4); the settings come resolved as a `TrlSpec`
(`settings.py`). TRL reads every masked-in token whatever its value, so this accumulator works on
the chunk's `masked` tokens, not on its valid ones: a NaN rollout log-prob is a log-ratio of 0 (weight 1)
there, and ±inf become the dtype's extremes (torch's `nan_to_num`). Rows go to the process of the dump's
`process_index` column (one process holding the dump without it).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import Reducer
from mismatch_cli.engine.kernels.ops import segment_sum
from mismatch_cli.trainers.trl.settings import TrlSpec

LOGP = "sampling/sampling_logp_difference/"
RATIO = "sampling/importance_sampling_ratio/"


def trl_log_ratio(old: torch.Tensor, rollout: torch.Tensor, lengths: torch.Tensor, level: str) -> torch.Tensor:
    """TRL's log-ratio: per masked token, or per row its unclamped sum (0 for a row without a token)."""
    # nan_to_num with only nan given: NaN -> 0, and +-inf -> the dtype's largest / most negative finite number.
    token = torch.nan_to_num(old - rollout, nan=0.0)
    if level == "token":
        return token
    return segment_sum(token, lengths)  # in the compute dtype, as TRL sums: exp may overflow to inf


def trl_weights(log_ratio: torch.Tensor, spec: TrlSpec) -> torch.Tensor:
    """exp of the log-ratio (no clamp before it), then truncated to or masked outside [clip_min, clip_max]."""
    ratio = torch.exp(log_ratio)
    if spec.bound == "truncate":
        return torch.clamp(ratio, min=spec.clip_min, max=spec.clip_max)
    outside = torch.zeros_like(ratio, dtype=torch.bool)
    if spec.clip_min is not None:
        outside |= ratio < spec.clip_min
    if spec.clip_max is not None:
        outside |= ratio > spec.clip_max
    return torch.where(outside, torch.zeros_like(ratio), ratio)  # a ratio on a bound is kept


def _fold(state: Reducer, difference: torch.Tensor, weights: torch.Tensor) -> None:
    """One process's share of a chunk: |o - r| of its tokens (NaN left out) and the weights TRL's metrics read."""
    scored = ~torch.isnan(difference)  # a mask, not a selection: no wait for the device
    state.add("logp_count", scored)
    if difference.numel():
        state.add("logp_sum", torch.where(scored, difference, torch.zeros_like(difference)))
        state.max("logp_max", torch.where(scored, difference, torch.full_like(difference, -torch.inf)))
    state.add("ratio_count", float(weights.numel()))
    if weights.numel():
        state.add("ratio_sum", weights)
        state.min("ratio_min", weights)
        state.max("ratio_max", weights)


def _process_values(state: Reducer) -> dict[str, float]:
    """One process's five scalars, as TRL computes them before the gather (0.0 for an empty selection)."""
    get = state.get
    logp, ratios = get("logp_count"), get("ratio_count")
    return {
        LOGP + "mean": get("logp_sum") / logp if logp else 0.0,
        LOGP + "max": get("logp_max") if logp else 0.0,
        RATIO + "min": get("ratio_min") if ratios else 0.0,
        RATIO + "mean": get("ratio_sum") / ratios if ratios else 0.0,
        RATIO + "max": get("ratio_max") if ratios else 0.0,
    }


def _nan_reduce(values: list[float], reduce: str) -> float:
    # accelerate's gather, then TRL's reductions: .mean() for the log-prob mean, .max() for its max, and the
    # NaN-ignoring nanmin / nanmax / nanmean of trl/trainer/utils.py for the ratio keys.
    kept = [v for v in values if not math.isnan(v)] if reduce.startswith("nan") else values
    if not kept:
        return math.nan
    if reduce.endswith("mean"):
        return math.fsum(kept) / len(kept) if all(math.isfinite(v) for v in kept) else sum(kept) / len(kept)
    return min(kept) if reduce.endswith("min") else max(kept)


ACROSS_PROCESSES = {LOGP + "mean": "mean", LOGP + "max": "max", RATIO + "min": "nanmin", RATIO + "mean": "nanmean",
                    RATIO + "max": "nanmax"}


class TrlAccumulator(Accumulator):
    """The five keys TRL logs: per process (the dump's `process_index`, else one process holding the dump), one
    scalar per key from sums, counts and extrema, then reduced across processes as TRL's gather does."""

    def __init__(self, spec: TrlSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.processes: dict[int, Reducer] = {}

    def _state(self, process: int) -> Reducer:
        if process not in self.processes:
            self.processes[process] = Reducer(self.device)
        return self.processes[process]

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk into the state of each process its rows belong to."""
        old, rollout, lengths = chunk.masked
        difference = (old - rollout).abs()
        weights = trl_weights(trl_log_ratio(old, rollout, lengths, self.spec.level), self.spec)
        ranks = chunk.process_index
        if ranks is None or len(np.unique(ranks)) == 1:
            self._fold_rows(0 if ranks is None else int(ranks[0]), difference, weights)
            return
        rank_of_token = torch.repeat_interleave(torch.as_tensor(ranks, device=lengths.device), lengths)
        rank_of_row = torch.as_tensor(ranks, device=lengths.device)
        for process in np.unique(ranks).tolist():  # one step per process, not per row
            tokens = rank_of_token == process
            picked = weights[rank_of_row == process] if self.spec.level == "sequence" else weights[tokens]
            self._fold_rows(int(process), difference[tokens], picked)

    def _fold_rows(self, process: int, difference: torch.Tensor, weights: torch.Tensor) -> None:
        _fold(self._state(process), difference, weights)

    def merge(self, other: TrlAccumulator) -> None:
        """Fold another shard of the same batch in (a process's state merges with the same process's)."""
        for process, state in other.processes.items():
            self._state(process).merge(state)

    def compute(self) -> Contribution:
        """The keys as TRL logs them: each process's scalar, then the reduction across processes."""
        per_process = [_process_values(self.processes[p]) for p in sorted(self.processes)] or \
            [_process_values(Reducer(self.device))]
        values = {key: _nan_reduce([v[key] for v in per_process], reduce) for key, reduce in ACROSS_PROCESSES.items()}
        notes = [f"TRL's keys averaged over {len(per_process)} processes (process_index)"] if len(per_process) > 1 \
            else []
        if self.spec.clip_max is not None and self.spec.clip_max <= 0:
            # GRPOConfig accepts it (it only checks clip_min < clip_max), so the weights are what TRL would use.
            notes.append(f"vllm_importance_sampling_clip_max = {self.spec.clip_max:g} is not above 0: TRL accepts "
                         "it, and every importance weight is then 0 or negative")
        return Contribution(family=values, notes=notes)


__all__ = ["LOGP", "RATIO", "TrlAccumulator", "trl_log_ratio", "trl_weights"]
