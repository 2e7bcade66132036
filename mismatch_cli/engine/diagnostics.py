"""Cheap always-on `diag/` sums that need no extra pass: |delta|, signed bias, token ESS, counts."""

from __future__ import annotations

import math

import torch

from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.state import Reducer


class DiagnosticsAccumulator:
    """Token-mean |delta|, bias and the token-weighted ESS of raw safety-clamped ratios."""

    def __init__(self, device: torch.device) -> None:
        self.state = Reducer(device)

    def update(self, chunk: Chunk) -> None:
        """Fold one chunk of whole sequences into the state."""
        s = self.state
        log_ratio = chunk.log_ratio
        abs_log_ratio = chunk.abs_log_ratio
        ratio = chunk.ratio_safe
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        s.add("empty_rows", (~chunk.row_valid).sum())
        s.add("sum_abs", abs_log_ratio.sum())
        s.add("sum_log_ratio", log_ratio.sum())
        s.add("negative", (log_ratio < 0).sum())
        s.add("sum_exp_abs", torch.exp(abs_log_ratio).sum())
        s.add("sum_ratio", ratio.sum())
        s.add("sum_ratio_sq", chunk.ratio_safe_sq.sum())
        if chunk.num_tokens:
            s.max("max_abs", abs_log_ratio.max())
        for name in ("nonfinite_tokens", "sentinel_tokens"):
            s.add(name, float(chunk.quality[name]))

    def merge(self, other: DiagnosticsAccumulator) -> None:
        """Fold another accumulator into this one."""
        self.state.merge(other.state)

    def compute(self) -> dict[str, float]:
        """The `diag/` keys (unprefixed) this accumulator owns."""
        s = self.state
        tokens = s.get("tokens") or math.nan  # no valid token: every mean is undefined
        mean_ratio = s.get("sum_ratio") / (tokens + 1e-8)
        mean_ratio_sq = s.get("sum_ratio_sq") / (tokens + 1e-8)
        return {
            "logprob_abs_diff_mean": s.get("sum_abs") / tokens,
            "logprob_abs_diff_max": s.get("max_abs"),
            "token_mult_prob_error": s.get("sum_exp_abs") / tokens,
            "log_ratio_mean": s.get("sum_log_ratio") / tokens,
            "log_ratio_neg_fraction": s.get("negative") / tokens,
            # verl's ESS formula (1 / MM((w / MM(w))^2)) on raw, untruncated token ratios.
            "ess_token": (mean_ratio + 1e-8) ** 2 / mean_ratio_sq if mean_ratio_sq > 0 else math.nan,
            "sequences": s.get("rows"),
            "valid_tokens": s.get("tokens"),
            "empty_rows": s.get("empty_rows"),
            "nonfinite_tokens": s.get("nonfinite_tokens"),
            "sentinel_tokens": s.get("sentinel_tokens"),
        }
