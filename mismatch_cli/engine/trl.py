"""TRL 1.16.0's vLLM importance-sampling correction: its weights per mode and its five `sampling/*` keys.

Formulas: docs/trl-semantics.md (sections 3 and 4); the settings come resolved as a `TrlSpec`
(`correction/trl.py`). TRL reads every masked-in token whatever its value, so this accumulator works on
the chunk's `masked` tokens, not on its valid ones: a NaN rollout log-prob is a log-ratio of 0 (weight 1)
there, and ±inf become the dtype's extremes (torch's `nan_to_num`). One process holds the whole dump.
"""

from __future__ import annotations

import torch

from mismatch_cli.correction.trl import TrlSpec
from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.ops import segment_sum
from mismatch_cli.engine.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.state import Reducer

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


class TrlAccumulator(Accumulator):
    """The five keys TRL logs, from sums, counts and extrema over the whole dump (one process, one batch)."""

    def __init__(self, spec: TrlSpec, device: torch.device) -> None:
        self.spec = spec
        self.state = Reducer(device)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: |o - r| of its masked tokens (NaN left out) and the weights TRL's metrics read."""
        old, rollout, lengths = chunk.masked
        state = self.state
        difference = (old - rollout).abs()
        scored = ~torch.isnan(difference)  # a mask, not a selection: no wait for the device
        state.add("logp_count", scored)
        if difference.numel():
            state.add("logp_sum", torch.where(scored, difference, torch.zeros_like(difference)))
            state.max("logp_max", torch.where(scored, difference, torch.full_like(difference, -torch.inf)))
        # Token modes: the weights of the masked-in tokens (zeros included); sequence modes: every row's.
        weights = trl_weights(trl_log_ratio(old, rollout, lengths, self.spec.level), self.spec)
        state.add("ratio_count", float(weights.numel()))
        if weights.numel():
            state.add("ratio_sum", weights)
            state.min("ratio_min", weights)
            state.max("ratio_max", weights)

    def merge(self, other: TrlAccumulator) -> None:
        """Fold another shard of the same batch in."""
        self.state.merge(other.state)

    def compute(self) -> Contribution:
        """The keys as TRL logs them; an empty selection gives 0.0, as in TRL."""
        get = self.state.get
        logp, ratios = get("logp_count"), get("ratio_count")
        values = {
            LOGP + "mean": get("logp_sum") / logp if logp else 0.0,
            LOGP + "max": get("logp_max") if logp else 0.0,
            RATIO + "min": get("ratio_min") if ratios else 0.0,
            RATIO + "mean": get("ratio_sum") / ratios if ratios else 0.0,
            RATIO + "max": get("ratio_max") if ratios else 0.0,
        }
        return Contribution(family=values)


__all__ = ["LOGP", "RATIO", "TrlAccumulator", "trl_log_ratio", "trl_weights"]
