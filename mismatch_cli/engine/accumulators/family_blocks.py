"""The metric blocks of the older families: one IS or RS block on raw ratios, and the token veto.

Formulas: docs/legacy-semantics.md. Every block keeps fixed-size float64 state (sums, extrema, Welford
moments), except verl 0.6.0's exact percentiles, which keep the raw weights up to a cap and then fall
back to the quantile sketch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mismatch_cli.correction import SAFETY_BOUND, RatioBlockSpec, VetoSpec, threshold_log
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import ChunkDecisions
from mismatch_cli.engine.core.state import F64, Moments, Reducer, float32_fraction
from mismatch_cli.engine.kernels.sketch import LogSketch

PERCENTILES = (("p25", 0.25), ("p50", 0.50), ("p75", 0.75), ("p95", 0.95), ("p99", 0.99))
EXACT_PERCENTILE_CAP = 1 << 22  # raw weights kept for exact torch.quantile parity; beyond, the sketch


class Means:
    """masked_mean arithmetic of one family: float masks add 1e-8; bool masks divide exactly."""

    def __init__(self, exact: bool) -> None:
        self.exact = exact

    def denominator(self, tokens: float) -> float:
        """A token mean's denominator."""
        # A bool mask's count is an integer; + 1e-8 in float32 only survives when the count is 0.
        if self.exact:
            return tokens if tokens > 0 else 1e-8
        return tokens + 1e-8

    def row_denominator(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each row mean's denominator, from the row's valid-token count."""
        if self.exact:
            return torch.where(tokens > 0, tokens, torch.full_like(tokens, 1e-8))
        return tokens + 1e-8

    def token_mean(self, total: float, tokens: float) -> float:
        """The masked mean of a token sum."""
        return total / self.denominator(tokens)

    def token_fraction(self, count: float, tokens: float) -> float:
        """The masked mean of an indicator, with the dtype upstream returns."""
        # A bool mask makes the indicator's masked mean a float32 tensor.
        if self.exact:
            return float32_fraction(count, tokens) if tokens else 0.0
        return count / self.denominator(tokens)


class RatioBlock:
    """One older family's IS or RS metric block on raw (untruncated) safety-clamped ratios."""

    def __init__(self, spec: RatioBlockSpec, means: Means, device: torch.device) -> None:
        self.spec = spec
        self.means = means
        self.state = Reducer(device)
        self.rows = Moments(device)
        self.log_upper = threshold_log(spec.upper)
        self.log_lower = threshold_log(spec.lower)
        self.values: list[np.ndarray] = []  # raw weights for exact percentiles (verl 0.6.0)
        self.kept_values = 0
        self.sketch: LogSketch | None = None

    def _row_ratio(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        log_sum = chunk.log_ratio_row_sum
        if self.spec.level == "sequence":
            log_ratio = log_sum
        else:  # geometric: the per-row mean log-ratio
            log_ratio = log_sum / self.means.row_denominator(chunk.row_tokens)
            log_ratio = torch.where(chunk.row_valid, log_ratio, torch.zeros_like(log_ratio))
        return log_ratio, torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk in; an RS block decides which tokens or rows its band rejects."""
        s, spec = self.state, self.spec
        tokens = chunk.row_tokens
        denominator = self.means.row_denominator(tokens)
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        s.add("valid_rows", chunk.row_valid.sum())
        if spec.level == "token":
            ratio = chunk.ratio_safe
            clamped = ratio.clamp(spec.lower, spec.upper).to(F64)  # float64 before squaring: std cancels
            s.add("sum", ratio)
            s.add("sum_c", clamped.sum())
            s.add("sum_c_sq", clamped.square().sum())
            s.add("high", (ratio > spec.upper).sum())
            s.add("low", (ratio < spec.lower).sum())
            if chunk.num_tokens:
                s.max("max", ratio.max())
                s.min("min", ratio.min())
            row_mean = chunk.row_sum(ratio) / denominator
            if spec.keep_band is not None:
                keep = (ratio >= spec.keep_band[0]) & (ratio <= spec.keep_band[1])
                rejected = ~keep
                if spec.prefix == "rollout_rs":
                    decisions.decide(family_rs_token_reject=rejected)
                s.add("rejected_tokens", rejected.sum())
                s.add("rejected_rows", (chunk.row_count(rejected) > 0).sum())
            if spec.batch_normalize:
                truncated = ratio.clamp(max=spec.upper)
                s.add("sum_truncated", truncated)
            if spec.percentiles:
                self._keep_values(ratio)
        else:
            log_ratio, ratio = self._row_ratio(chunk)
            clamped = ratio.clamp(spec.lower, spec.upper)
            s.add("sum", (ratio * tokens).sum())
            s.add("sum_c", (clamped * tokens).sum())
            s.add("sum_c_sq", (clamped.square() * tokens).sum())
            if chunk.num_rows:
                s.max("max_log", log_ratio.max())
                s.min("min_log", log_ratio.min())
            high, low = log_ratio > self.log_upper, log_ratio < self.log_lower
            if spec.level == "geometric" and not spec.geometric_fraction_by_rows:
                s.add("high", (high * tokens).sum())
                s.add("low", (low * tokens).sum())
            else:
                s.add("row_high", high.sum())
                s.add("row_low", low.sum())
            row_mean = ratio * tokens / denominator
            if spec.keep_band is not None:
                keep = (ratio >= spec.keep_band[0]) & (ratio <= spec.keep_band[1])
                if spec.prefix == "rollout_rs":
                    decisions.decide(family_rs_row_reject=~keep)
                s.add("rejected_tokens", ((~keep) * tokens).sum())
                s.add("rejected_rows", (~keep).sum())  # every row, empty ones included (ratio 1)
            if spec.batch_normalize:
                s.add("sum_truncated", (ratio.clamp(max=spec.upper) * tokens).sum())
            if spec.percentiles:
                self._keep_values(torch.repeat_interleave(ratio, chunk.lengths))
        if spec.batch_normalize == "valid":
            truncated_row = self._truncated_row_mean(chunk, denominator)
            s.add("sum_norm_rows", (truncated_row * chunk.row_valid).sum())
        elif spec.batch_normalize == "all":
            s.add("sum_norm_rows", self._truncated_row_mean(chunk, denominator).sum())
        rows = row_mean[chunk.row_valid] if spec.valid_rows_only else row_mean
        self.rows.update(rows)
        s.add("seq_rows", float(rows.numel()))
        if rows.numel():
            s.max("seq_max", rows.max())
            s.min("seq_min", rows.min())
            s.max("seq_max_deviation", (rows - 1.0).abs().max())
        s.add("seq_high", (rows > spec.upper).sum())
        s.add("seq_low", (rows < spec.lower).sum())

    def _truncated_row_mean(self, chunk: Chunk, denominator: torch.Tensor) -> torch.Tensor:
        if self.spec.level == "token":
            return chunk.row_sum(chunk.ratio_safe.clamp(max=self.spec.upper)) / denominator
        _, ratio = self._row_ratio(chunk)
        return ratio.clamp(max=self.spec.upper) * chunk.row_tokens / denominator

    def _keep_values(self, values: torch.Tensor) -> None:
        if self.sketch is None and self.kept_values + values.numel() <= EXACT_PERCENTILE_CAP:
            self.values.append(values.detach().to("cpu", F64).numpy())
            self.kept_values += values.numel()
            return
        if self.sketch is None:
            self.sketch = LogSketch(values.device)
            for kept in self.values:
                self.sketch.update(torch.from_numpy(kept).to(values.device))
            self.values = []
        self.sketch.update(values)

    def merge(self, other: RatioBlock) -> None:
        """Fold another shard in."""
        self.state.merge(other.state)
        self.rows.merge(other.rows)
        if other.sketch is not None or self.sketch is not None:
            for kept in other.values:
                self._keep_values(torch.from_numpy(kept))
            if other.sketch is not None:
                if self.sketch is None:
                    self._keep_values(torch.zeros(0, dtype=F64))
                    self.sketch = self.sketch or LogSketch(other.sketch.device)
                self.sketch.merge(other.sketch)
        else:
            for kept in other.values:
                self._keep_values(torch.from_numpy(kept))

    def compute(self) -> tuple[dict[str, float], list[str]]:
        """The block's keys (unprefixed) and notes about approximations."""
        s, spec, means = self.state, self.spec, self.means
        p = spec.prefix
        tokens, rows = s.get("tokens"), s.get("rows")
        mean = means.token_mean(s.get("sum"), tokens)
        out: dict[str, float] = {f"{p}_mean": mean}
        notes: list[str] = []
        if spec.level == "token":
            out[f"{p}_max"] = s.get("max", -math.inf)
            out[f"{p}_min"] = s.get("min", math.inf)
            out[f"{p}_ratio_fraction_high"] = means.token_fraction(s.get("high"), tokens)
            out[f"{p}_ratio_fraction_low"] = means.token_fraction(s.get("low"), tokens)
        else:
            out[f"{p}_max"] = math.exp(min(s.get("max_log"), SAFETY_BOUND))
            out[f"{p}_min"] = math.exp(s.get("min_log"))
            if spec.level == "geometric" and not spec.geometric_fraction_by_rows:
                out[f"{p}_ratio_fraction_high"] = means.token_fraction(s.get("high"), tokens)
                out[f"{p}_ratio_fraction_low"] = means.token_fraction(s.get("low"), tokens)
            else:
                out[f"{p}_ratio_fraction_high"] = float32_fraction(s.get("row_high"), rows)
                out[f"{p}_ratio_fraction_low"] = float32_fraction(s.get("row_low"), rows)
        mean_c = means.token_mean(s.get("sum_c"), tokens)
        mean_c_sq = means.token_mean(s.get("sum_c_sq"), tokens)
        out[f"{p}_std"] = math.sqrt(max(mean_c_sq - mean_c * mean_c, 0.0)) if tokens > 1 else 0.0
        normalized = mean_c_sq / (mean_c + 1e-8) ** 2 if tokens else math.nan
        out[f"{p}_eff_sample_size"] = 1.0 / normalized if normalized else math.inf
        seq_rows = s.get("seq_rows")
        if seq_rows:
            out[f"{p}_seq_mean"] = float(self.rows.mean.item())
            out[f"{p}_seq_std"] = self.rows.std()
            out[f"{p}_seq_max"] = s.get("seq_max")
            out[f"{p}_seq_min"] = s.get("seq_min")
            out[f"{p}_seq_max_deviation"] = s.get("seq_max_deviation")
            out[f"{p}_seq_fraction_high"] = float32_fraction(s.get("seq_high"), seq_rows)
            out[f"{p}_seq_fraction_low"] = float32_fraction(s.get("seq_low"), seq_rows)
        else:  # xtuner head with no valid row: all seven are 0
            for key in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
                        "seq_fraction_low"):
                out[f"{p}_{key}"] = 0.0
        if spec.percentiles:
            out.update(self._percentiles(notes))
        if spec.keep_band is not None:
            out[f"{p}_masked_fraction"] = means.token_fraction(s.get("rejected_tokens"), tokens)
            out[f"{p}_seq_masked_fraction"] = float32_fraction(s.get("rejected_rows"), rows)
        if spec.batch_normalize:
            if spec.level == "token":
                factor = means.token_mean(s.get("sum_truncated"), tokens)
            elif spec.batch_normalize == "valid":
                factor = s.get("sum_norm_rows") / max(s.get("valid_rows"), 1e-8)
            else:
                factor = s.get("sum_norm_rows") / rows
            out[f"{p}_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
        return out, notes

    def _percentiles(self, notes: list[str]) -> dict[str, float]:
        p = self.spec.prefix
        if self.sketch is not None:
            notes.append(f"{p}_p25..p99 come from the quantile sketch (<= 0.4 % relative error): more than "
                         f"{EXACT_PERCENTILE_CAP:,} tokens")
            values = self.sketch.quantiles([q for _, q in PERCENTILES])
            return {f"{p}_{name}": (math.nan if v is None else v) for (name, _), v in zip(PERCENTILES, values,
                                                                                          strict=True)}
        if not self.values:
            return {f"{p}_{name}": math.nan for name, _ in PERCENTILES}
        every = np.concatenate(self.values)
        return {f"{p}_{name}": float(np.quantile(every, q)) for name, q in PERCENTILES}


class VetoBlock:
    """Catastrophic tokens and the sequences they veto (one- or two-sided)."""

    def __init__(self, spec: VetoSpec | None, means: Means, device: torch.device) -> None:
        self.spec = spec
        self.means = means
        self.state = Reducer(device)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk in and decide which rows the veto drops."""
        s = self.state
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        s.add("valid_rows", chunk.row_valid.sum())
        if self.spec is None:
            return
        log_ratio = chunk.log_ratio  # unclamped, as upstream
        catastrophic = torch.zeros_like(log_ratio, dtype=torch.bool)
        if self.spec.lower is not None:
            catastrophic |= log_ratio < threshold_log(self.spec.lower)
        if self.spec.upper is not None:
            catastrophic |= log_ratio > threshold_log(self.spec.upper)
        vetoed = chunk.row_count(catastrophic) > 0
        decisions.decide(vetoed_rows=vetoed)
        s.add("catastrophic", catastrophic.sum())
        s.add("vetoed_rows", vetoed.sum())

    def merge(self, other: VetoBlock) -> None:
        """Fold another shard in."""
        self.state.merge(other.state)

    def compute(self) -> dict[str, float]:
        """rollout_is_veto_fraction and rollout_is_catastrophic_token_fraction (0.0 without a veto)."""
        s = self.state
        if self.spec is None:
            return {"rollout_is_veto_fraction": 0.0, "rollout_is_catastrophic_token_fraction": 0.0}
        rows = s.get("valid_rows") if self.spec.valid_rows_only else s.get("rows")
        return {
            "rollout_is_veto_fraction": float32_fraction(s.get("vetoed_rows"), rows) if rows else 0.0,
            "rollout_is_catastrophic_token_fraction": self.means.token_fraction(s.get("catastrophic"),
                                                                                s.get("tokens")),
        }


__all__ = ["EXACT_PERCENTILE_CAP", "PERCENTILES", "Means", "RatioBlock", "VetoBlock"]
