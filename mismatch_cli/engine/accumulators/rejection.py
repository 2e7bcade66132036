"""verl's rejection sampling ("trust-region masking"): 11 options, AND-chained, streamed."""

from __future__ import annotations

import math
from typing import Any

import torch

from mismatch_cli.correction import RsOption
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import VERL_PREFIX, Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Moments, Reducer, float32_fraction
from mismatch_cli.engine.kernels import sweep


def token_statistic(chunk: Chunk, statistic: str) -> torch.Tensor:
    """Per-token k1 / k2 / k3 of the safety-clamped log-ratio, written as verl writes them."""
    safe = chunk.log_ratio_safe
    if statistic == "k1":
        k1 = -safe
        row_sums = chunk.known_row_sum(safe)
        if row_sums is not None:  # a sum of negated values is the negated sum, bit for bit
            chunk.remember_row_sum(k1, -row_sums)
        return k1
    if statistic == "k2":
        return 0.5 * safe**2
    # Where nothing was clamped, exp(safe) is the chunk's own exp of the same tensor: taken once.
    return (chunk.ratio if safe is chunk.log_ratio else torch.exp(safe)) - 1.0 - safe


class OptionBounds:
    """Keep band and metric thresholds of one option on its statistic's scale."""

    def __init__(self, option: RsOption, k1_bounds: str) -> None:
        self.option = option
        if option.is_k1:
            assert option.lower is not None
            if k1_bounds == "ratio":
                # Corrected rule: keep L <= rho <= U, i.e. -log U <= k1 <= -log L.
                self.low, self.high = -math.log(option.upper), -math.log(option.lower)
            else:
                # verl compares k1 = -log rho with [log L, log U], i.e. keeps 1/U <= rho <= 1/L.
                self.low, self.high = math.log(option.lower), math.log(option.upper)
        else:
            self.low, self.high = 0.0, option.upper

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        """Keep decision for each value of the statistic."""
        if self.option.is_k1:
            return (stat >= self.low) & (stat <= self.high)
        return stat <= self.high


class RejectionAccumulator(Accumulator):
    """Per-option and combined rejection statistics of one RS configuration; decides the rejections."""

    decides = frozenset({"rs_row_reject", "rs_token_reject"})

    def __init__(self, options: tuple[RsOption, ...], k1_bounds: str, device: torch.device,
                 exact_mask: bool = False) -> None:
        # exact_mask: verl given a bool / integer mask divides exactly and returns float32 indicator means.
        self.exact_mask = exact_mask
        self.bounds = [OptionBounds(option, k1_bounds) for option in options]
        self.state = Reducer(device)
        self.row_stats = {b.option.name: Moments(device) for b in self.bounds}

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences into the state and decide which rows and tokens RS rejects."""
        s = self.state
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        valid = chunk.row_valid
        s.add("valid_rows", valid.sum())
        token_reject: torch.Tensor | None = None  # union over token-level options, per token
        row_reject_any = torch.zeros_like(valid)  # union over sequence-level options, per row
        fused = sweep.wanted(chunk.log_ratio_safe, chunk.fused)  # a token-level option in one numba pass
        for bounds in self.bounds:
            name = bounds.option.name
            is_k1 = bounds.option.is_k1
            stat = token_statistic(chunk, bounds.option.statistic)
            if bounds.option.level == "token":
                reject, rejected_rows, totals = self._token_option(chunk, bounds, stat, fused)
                row_value = chunk.row_mean(stat, exact=self.exact_mask)
                keys = ["sum", "sum_c", "sum_c_sq", "count_high", "rejected_tokens"] + (["count_low"] if is_k1 else [])
                for key in keys:
                    s.add(f"{name}:{key}", totals[key])
                if chunk.num_tokens:
                    s.max(f"{name}:max", totals["max"])
                    s.min(f"{name}:min", totals["min"])
                token_reject = reject if token_reject is None else token_reject | reject
            else:
                reduction = bounds.option.reduction
                if reduction == "sum":
                    row_value = chunk.row_sum(stat)
                elif reduction == "mean":
                    row_value = chunk.row_mean(stat, exact=self.exact_mask)
                else:
                    row_value = chunk.row_max(stat)
                rejected_rows = ~bounds.keep(row_value)
                tokens = chunk.row_tokens
                clamped = row_value.clamp(min=bounds.low, max=bounds.high)
                s.add(f"{name}:sum", (row_value * tokens).sum())
                s.add(f"{name}:sum_c", (clamped * tokens).sum())
                s.add(f"{name}:sum_c_sq", (clamped.square() * tokens).sum())
                s.add(f"{name}:rejected_tokens", (rejected_rows * tokens).sum())
                row_reject_any |= rejected_rows
            # Over the valid rows, without selecting them (a selection waits for the device to size it).
            row_value = row_value.to(F64)
            self.row_stats[name].update_where(row_value, valid)
            if chunk.num_tokens:  # then some row is valid
                s.max(f"{name}:seq_max", torch.where(valid, row_value, -math.inf).max())
                s.min(f"{name}:seq_min", torch.where(valid, row_value, math.inf).min())
                s.max(f"{name}:seq_max_deviation", torch.where(valid, row_value.abs(), -math.inf).max())
            s.add(f"{name}:seq_count_high", ((row_value > bounds.high) & valid).sum())
            if is_k1:
                s.add(f"{name}:seq_count_low", ((row_value < bounds.low) & valid).sum())
            s.add(f"{name}:rejected_rows", (rejected_rows & valid).sum())
        # Combined keep = AND of all options: a row rejected by a sequence option loses all its
        # tokens; elsewhere the tokens rejected by any token option are lost.
        tokens_rejected_in_row = (
            chunk.row_count(token_reject) if token_reject is not None else torch.zeros_like(chunk.row_tokens)
        )
        lost = torch.where(row_reject_any, chunk.row_tokens, tokens_rejected_in_row)
        decisions.decide(rs_row_reject=row_reject_any)
        if token_reject is not None:
            decisions.decide(rs_token_reject=token_reject)
        s.add("rejected_tokens", lost.sum())
        s.add("rejected_rows", (valid & (lost > 0)).sum())

    @staticmethod
    def _token_option(chunk: Chunk, bounds: OptionBounds, stat: torch.Tensor, fused: bool,
                      ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """A token-level option's rejected tokens, the rows it rejects a token of, and its totals (sweep.OPTION_SUMS:
        numbers from the one-pass kernel, else float64 tensors and flags that Reducer.add sums)."""
        if fused:
            sums = sweep.option_sums(stat, chunk.lengths, bounds.low, bounds.high, bounds.option.is_k1)
            chunk.remember_row_sum(stat, sums.row_sums)  # for the row means
            chunk.remember_row_sum(sums.reject, sums.row_rejects.to(F64))  # row_count of the flags, when alone
            return sums.reject, sums.row_rejects > 0, sums.sums
        reject = ~bounds.keep(stat)
        clamped = stat.clamp(min=bounds.low, max=bounds.high).to(F64)  # float64: the std cancels
        totals: dict[str, Any] = {"sum": stat, "sum_c": clamped.sum(), "sum_c_sq": clamped.square().sum(),
                                  "count_high": stat > bounds.high, "count_low": stat < bounds.low,
                                  "rejected_tokens": reject}
        if stat.numel():
            totals["max"], totals["min"] = stat.max(), stat.min()
        return reject, chunk.row_count(reject) > 0, totals

    def merge(self, other: RejectionAccumulator) -> None:
        """Fold another accumulator of the same configuration into this one."""
        self.state.merge(other.state)
        for name, moments in self.row_stats.items():
            moments.merge(other.row_stats[name])

    def compute(self) -> Contribution:
        """verl's `rollout_corr/rollout_rs_*` keys; callers guarantee at least one valid token."""
        return Contribution(family={VERL_PREFIX + k: v for k, v in self._metrics().items()})

    def _metrics(self) -> dict[str, float]:
        s = self.state
        tokens = s.get("tokens")
        denominator = tokens if self.exact_mask and tokens > 0 else tokens + 1e-8

        def indicator(count: float) -> float:
            return float32_fraction(count, tokens) if self.exact_mask else count / denominator
        valid_rows = s.get("valid_rows")
        metrics: dict[str, float] = {}
        for bounds in self.bounds:
            name = bounds.option.name
            prefix = f"rollout_rs_{name}"
            is_k1 = bounds.option.is_k1
            per_sequence = bounds.option.level == "sequence"
            moments = self.row_stats[name]
            metrics[f"{prefix}_mean"] = s.get(f"{name}:sum") / denominator
            if per_sequence:
                metrics[f"{prefix}_max"] = s.get(f"{name}:seq_max")
                metrics[f"{prefix}_min"] = s.get(f"{name}:seq_min")
                # verl computes these as `bool.float().mean()`: float32 even in a float64 run.
                metrics[f"{prefix}_fraction_high"] = float32_fraction(s.get(f"{name}:seq_count_high"), valid_rows)
                metrics[f"{prefix}_fraction_low"] = (
                    float32_fraction(s.get(f"{name}:seq_count_low"), valid_rows) if is_k1 else 0.0
                )
            else:
                metrics[f"{prefix}_max"] = s.get(f"{name}:max")
                metrics[f"{prefix}_min"] = s.get(f"{name}:min")
                metrics[f"{prefix}_fraction_high"] = indicator(s.get(f"{name}:count_high"))
                metrics[f"{prefix}_fraction_low"] = indicator(s.get(f"{name}:count_low")) if is_k1 else 0.0
            if tokens > 1:
                mean_c = s.get(f"{name}:sum_c") / denominator
                var = s.get(f"{name}:sum_c_sq") / denominator - mean_c * mean_c
                metrics[f"{prefix}_std"] = math.sqrt(max(var, 0.0))
            else:
                metrics[f"{prefix}_std"] = 0.0
            metrics[f"{prefix}_seq_mean"] = float(moments.mean.item())
            metrics[f"{prefix}_seq_std"] = moments.std()
            metrics[f"{prefix}_seq_max"] = s.get(f"{name}:seq_max")
            metrics[f"{prefix}_seq_min"] = s.get(f"{name}:seq_min")
            metrics[f"{prefix}_seq_max_deviation"] = s.get(f"{name}:seq_max_deviation")
            metrics[f"{prefix}_seq_fraction_high"] = float32_fraction(s.get(f"{name}:seq_count_high"), valid_rows)
            if is_k1:
                metrics[f"{prefix}_seq_fraction_low"] = float32_fraction(s.get(f"{name}:seq_count_low"), valid_rows)
            metrics[f"{prefix}_masked_fraction"] = s.get(f"{name}:rejected_tokens") / denominator
            metrics[f"{prefix}_seq_masked_fraction"] = (
                s.get(f"{name}:rejected_rows") / valid_rows if valid_rows > 0 else 0.0
            )
        metrics["rollout_rs_masked_fraction"] = s.get("rejected_tokens") / denominator
        metrics["rollout_rs_seq_masked_fraction"] = float32_fraction(s.get("rejected_rows"), s.get("rows"))
        return metrics
