"""verl's importance-sampling weights (TIS / IcePop, token / sequence) and their metrics, streamed."""

from __future__ import annotations

import math

import torch

from mismatch_cli.correction import SAFETY_BOUND, IsThreshold
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import ess
from mismatch_cli.engine.core.protocol import VERL_PREFIX, Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Moments, Reducer, float32_fraction
from mismatch_cli.engine.kernels import sweep


def _float32_log(value: float) -> float:
    # verl compares sequence log-ratios with torch.log(torch.tensor(U)), a float32 tensor.
    return float(torch.log(torch.tensor(value, dtype=torch.float32)).item())


class ImportanceAccumulator(Accumulator):
    """Applied and raw IS weights of one configuration, reduced to fixed-size state; decides the weights."""

    decides = frozenset({"is_token_weight", "is_row_weight"})

    def __init__(self, level: str, threshold: IsThreshold, batch_normalize: bool, device: torch.device,
                 seq_fraction_weights: str = "raw") -> None:
        self.level = level
        self.seq_fraction_weights = seq_fraction_weights  # "applied" reproduces verl 0.8
        self.threshold = threshold
        self.batch_normalize = batch_normalize
        self.state = Reducer(device)
        self.row_weight = Moments(device)

    def _apply(self, raw: torch.Tensor) -> torch.Tensor:
        upper, lower = self.threshold.upper, self.threshold.lower
        if lower is None:
            return raw.clamp(max=upper)
        kept = (raw >= lower) & (raw <= upper)
        return torch.where(kept, raw, torch.zeros_like(raw))

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences into the state and decide its applied IS weights."""
        if self.level == "token":
            self._update_token(chunk, decisions)
        else:
            self._update_sequence(chunk, decisions)

    def _update_token(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        s, threshold = self.state, self.threshold
        raw = chunk.ratio_safe
        if sweep.wanted(raw, chunk.fused):  # the weights, their row sums and totals in one numba pass
            weight, row_sums, totals = sweep.is_weights(raw, chunk.lengths, threshold.upper, threshold.lower,
                                                        threshold.metric_lower)
            chunk.remember_row_sum(weight, row_sums)  # the rounds and the bootstrap sum the weights per row too
        else:
            weight = self._apply(raw)
            totals = self._token_totals(raw, weight)
        decisions.decide(is_token_weight=weight)
        s.add("tokens", float(chunk.num_tokens))
        for key in ("sum_w", "sum_w_sq", "count_high", "count_low") + (("count_oob",) if threshold.icepop else ()):
            s.add(key, totals[key])
        if chunk.num_tokens:
            s.max("max_w", totals["max_w"])
            s.min("min_w", totals["min_w"])
        self._rows(chunk, chunk.row_mean(weight), chunk.row_mean(raw))

    def _token_totals(self, raw: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """sweep.WEIGHT_SUMS by torch's passes: float64 sums, flags (counted by Reducer.add), extremes."""
        upper = self.threshold.upper
        # float64 before squaring: std = sqrt(E[w^2] - E[w]^2) cancels badly for weights near 1.
        weight64 = weight.to(F64)
        totals = {"sum_w": weight64.sum(),
                  "sum_w_sq": weight64.square().sum(),  # verl clamps to [0, U] before std / ESS: weights lie there
                  "count_high": raw > upper, "count_low": raw < self.threshold.metric_lower}
        if self.threshold.icepop:
            totals["count_oob"] = (raw < self.threshold.lower) | (raw > upper)
        if weight.numel():
            totals["max_w"], totals["min_w"] = weight.max(), weight.min()
        return totals

    def _update_sequence(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        s, upper = self.state, self.threshold.upper
        log_sum = chunk.log_ratio_row_sum
        raw = torch.exp(log_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        weight = self._apply(raw)
        decisions.decide(is_row_weight=weight)
        tokens = chunk.row_tokens
        s.add("tokens", float(chunk.num_tokens))
        s.add("sum_w", (weight * tokens).sum())
        s.add("sum_w_sq", (weight.square() * tokens).sum())
        if self.threshold.icepop:
            oob = (raw < self.threshold.lower) | (raw > upper)
            s.add("count_oob", (oob.to(F64) * tokens).sum())
        # Sequence-level max/min/fractions run over all rows: an empty row has S = 0.
        if chunk.num_rows:
            s.max("max_log_sum", log_sum.max())
            s.min("min_log_sum", log_sum.min())
        s.add("count_high", (log_sum > _float32_log(upper)).sum())
        s.add("count_low", (log_sum < _float32_log(self.threshold.metric_lower)).sum())
        denominator = chunk.row_denominator
        self._rows(chunk, weight * tokens / denominator, raw * tokens / denominator)

    def _rows(self, chunk: Chunk, row_mean: torch.Tensor, raw_row_mean: torch.Tensor) -> None:
        s = self.state
        s.add("rows", float(chunk.num_rows))
        self.row_weight.update(row_mean)
        if chunk.num_rows:
            s.max("seq_max", row_mean.max())
            s.min("seq_min", row_mean.min())
            s.max("seq_max_deviation", (row_mean - 1.0).abs().max())
        counted = row_mean if self.seq_fraction_weights == "applied" else raw_row_mean
        s.add("seq_count_high", (counted > self.threshold.upper).sum())
        s.add("seq_count_low", (counted < self.threshold.metric_lower).sum())
        s.add("valid_rows", chunk.row_valid.sum())
        s.add("sum_valid_row_mean", (row_mean * chunk.row_valid).sum())

    def merge(self, other: ImportanceAccumulator) -> None:
        """Fold another accumulator of the same configuration into this one."""
        self.state.merge(other.state)
        self.row_weight.merge(other.row_weight)

    def compute(self) -> Contribution:
        """verl's `rollout_corr/rollout_is_*` keys, and whether every applied weight was zero."""
        metrics, all_zero = self._metrics()
        notes = ["every valid IS weight is outside the IcePop band, so the ESS is undefined "
                 "(verl raises ZeroDivisionError here)"] if all_zero else []
        return Contribution(family={VERL_PREFIX + k: v for k, v in metrics.items()}, notes=notes,
                            icepop_rejects_all=all_zero)

    def _metrics(self) -> tuple[dict[str, float], bool]:
        s = self.state
        tokens, rows = s.get("tokens"), s.get("rows")
        denominator = tokens + 1e-8
        mean = s.get("sum_w") / denominator
        mean_sq = s.get("sum_w_sq") / denominator
        metrics: dict[str, float] = {"rollout_is_mean": mean}
        if self.level == "token":
            metrics["rollout_is_ratio_fraction_high"] = s.get("count_high") / denominator
            metrics["rollout_is_ratio_fraction_low"] = s.get("count_low") / denominator
            metrics["rollout_is_max"] = s.get("max_w")
            metrics["rollout_is_min"] = s.get("min_w")
        else:
            metrics["rollout_is_max"] = math.exp(min(s.get("max_log_sum"), SAFETY_BOUND))
            metrics["rollout_is_min"] = math.exp(s.get("min_log_sum"))
            # verl computes these as `bool.float().mean()`: float32 even in a float64 run.
            metrics["rollout_is_ratio_fraction_high"] = float32_fraction(s.get("count_high"), rows)
            metrics["rollout_is_ratio_fraction_low"] = float32_fraction(s.get("count_low"), rows)
        metrics["rollout_is_std"] = math.sqrt(max(mean_sq - mean * mean, 0.0)) if tokens > 1 else 0.0
        metrics["rollout_is_eff_sample_size"] = ess(mean, mean_sq)
        metrics["rollout_is_seq_mean"] = float(self.row_weight.mean.item())
        metrics["rollout_is_seq_std"] = self.row_weight.std()
        metrics["rollout_is_seq_max"] = s.get("seq_max")
        metrics["rollout_is_seq_min"] = s.get("seq_min")
        metrics["rollout_is_seq_max_deviation"] = s.get("seq_max_deviation")
        metrics["rollout_is_seq_fraction_high"] = float32_fraction(s.get("seq_count_high"), rows)
        metrics["rollout_is_seq_fraction_low"] = float32_fraction(s.get("seq_count_low"), rows)
        if self.threshold.icepop:
            metrics["rollout_is_oob_ratio"] = s.get("count_oob") / denominator
        if self.batch_normalize:
            if self.level == "token":
                factor = mean
            else:
                factor = s.get("sum_valid_row_mean") / max(s.get("valid_rows"), 1e-8)
            metrics["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
        return metrics, mean_sq == 0.0  # every weight 0: verl raises ZeroDivisionError
