"""The always-on `diag/` keys: |delta|, signed bias, probability-space diffs, quantiles, ESS, counts.

Quantiles come from fixed-size mergeable counts bucketed like `LogSketch` (the top 16 bits of a float32: <= 0.4 %
relative error, never `torch.quantile`, which refuses > 2^24 values). Taking the top 16 bits of delta itself (sign
included) puts delta >= 0 and delta < 0 into two halves of one count array, so signed and |delta| quantiles come
from the same counts, which also back the plots' histograms. Nothing here sorts or keeps per-token data.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from mismatch_cli.correction import SAFETY_BOUND
from mismatch_cli.engine.accumulators.signatures import token_sums
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import ess
from mismatch_cli.engine.core.protocol import DIAG_PREFIX, Accumulator, ChunkDecisions, Contribution, finite_or_none
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.engine.kernels.ops import bincount, count, numpy_kernels, scratch, segment_sum
from mismatch_cli.engine.kernels.sketch import NUM_BUCKETS, SHIFT, PackableCounts, pack
from mismatch_cli.engine.kernels.sweep import TokenSums

SIGNED_LEVELS = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
ABS_LEVELS = (0.5, 0.9, 0.99, 0.999, 0.9999)
# diag/ quantile keys and their levels: of delta, then of |delta| (SPEC §3.4).
SIGNED_KEYS = {"log_ratio_p001": 0.001, "log_ratio_p01": 0.01, "log_ratio_p50": 0.5, "log_ratio_p99": 0.99,
               "log_ratio_p999": 0.999}
ABS_KEYS = {"abs_log_ratio_p50": 0.5, "abs_log_ratio_p90": 0.9, "abs_log_ratio_p99": 0.99, "abs_log_ratio_p999": 0.999}
SKETCH_RELATIVE_ERROR = 2.0**-8  # half a bucket: buckets are 2^-7 of their lower edge wide
HISTOGRAM_MERGE = 16  # sketch buckets per histogram bin: 128 / 16 = 8 bins per octave of |delta|
POSITION_BIN = 32  # token positions per bin of the position profile
POSITION_MAX_BINS = 256  # the report's profile is coarsened to at most this many bins


@lru_cache(maxsize=1)
def bucket_values() -> np.ndarray:
    """The value each sketch bucket reports (its midpoint; bucket 0 holds zeros), float64 [NUM_BUCKETS]."""
    buckets = np.arange(NUM_BUCKETS, dtype=np.int64)
    middle = ((buckets << SHIFT) | (1 << (SHIFT - 1))).astype(np.int32)
    with np.errstate(invalid="ignore"):  # the top buckets are inf / NaN bit patterns, never filled
        values = middle.view(np.float32).astype(np.float64)
    values[0] = 0.0
    return values


def quantiles_from_counts(counts: np.ndarray, values: np.ndarray, levels: tuple[float, ...]) -> list[float | None]:
    """numpy-style (linear) quantiles of a histogram whose bin i holds `counts[i]` copies of `values[i]`."""
    total = int(counts.sum())
    if total == 0:
        return [None for _ in levels]
    cumulative = np.cumsum(counts)
    position = np.asarray(levels, dtype=np.float64) * (total - 1)
    low = np.floor(position).astype(np.int64)
    frac = position - low
    high = np.minimum(low + 1, total - 1)
    low_value = values[np.searchsorted(cumulative, low, side="right")]
    high_value = values[np.searchsorted(cumulative, high, side="right")]
    return [float(v) for v in low_value + frac * (high_value - low_value)]


def signed_counts(sketch_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts and values in ascending signed order from the (non-negative, negative) sketch groups."""
    magnitudes = bucket_values()
    positive, negative = sketch_counts[0], sketch_counts[1]
    counts = np.concatenate([negative[::-1], positive])
    values = np.concatenate([-magnitudes[::-1], magnitudes])
    return counts, values


def _edge(coarse_bin: int) -> float:
    bits = np.array([coarse_bin * HISTOGRAM_MERGE << SHIFT], dtype=np.int64).astype(np.int32)
    return float(bits.view(np.float32)[0])


def signed_histogram(sketch_counts: np.ndarray) -> dict[str, object]:
    """A compact histogram of a signed quantity: 8 bins per octave of magnitude on each side."""
    coarse = sketch_counts.reshape(2, -1, HISTOGRAM_MERGE).sum(axis=2)
    zero = int(coarse[:, 0].sum())  # the first bin holds exact zeros (and subnormals)
    occupied = np.flatnonzero(coarse[:, 1:].sum(axis=0)) + 1
    if occupied.size == 0:
        return {"bins_per_octave": 128 // HISTOGRAM_MERGE, "edges": [], "negative": [], "positive": [], "zero": zero}
    first, last = int(occupied[0]), int(occupied[-1])
    return {
        "bins_per_octave": 128 // HISTOGRAM_MERGE,
        "edges": [_edge(c) for c in range(first, last + 2)],
        "negative": [int(x) for x in coarse[1, first : last + 1]],
        "positive": [int(x) for x in coarse[0, first : last + 1]],
        "zero": zero,
    }


def signed_buckets(values: torch.Tensor) -> torch.Tensor:
    """Flat sketch index per value: the bucket of |value|, plus NUM_BUCKETS when the value is negative."""
    n, device = values.numel(), values.device
    if values.dtype != torch.float32:
        values = scratch("float32", n, torch.float32, device).copy_(values)
    # An arithmetic shift keeps the sign bit, so masking to 16 bits puts negatives above NUM_BUCKETS.
    out = torch.bitwise_right_shift(values.view(torch.int32), SHIFT, out=scratch("bucket", n, torch.int32, device))
    return out.bitwise_and_(2 * NUM_BUCKETS - 1)


def _exp(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """exp into a work buffer; on the CPU through numpy, markedly faster than torch on one thread."""
    if numpy_kernels(values):
        with np.errstate(over="ignore"):  # inf, as torch gives (and as verl's k3_kl does)
            np.exp(values.numpy(), out=out.numpy())
        return out
    return torch.exp(values, out=out)


class PairSums:
    """Sums of x = exp(old), d = exp(old) - exp(rollout) and their products: verl's probability-space metrics.

    Pearson's r is computed from x and d (y = x - d), so the small disagreement d never comes from a
    difference of two large sums; per-chunk sums are plain reductions (no float64 copy of the tokens).
    """

    def __init__(self, device: torch.device) -> None:
        self.state = Reducer(device)

    def update(self, old: torch.Tensor, rollout: torch.Tensor) -> None:
        """Add the valid tokens of one chunk."""
        s = self.state
        n, dtype, device = old.numel(), old.dtype, old.device
        x = _exp(old, scratch("x", n, dtype, device))
        d = _exp(rollout, scratch("d", n, dtype, device))
        torch.sub(x, d, out=d)
        s.add("n", float(x.numel()))
        s.add("x", x)
        s.add("d", d)
        # Products per token in the compute dtype, their sums in float64 (a float32 dot is chunk-dependent).
        product = scratch("product", n, dtype, device)
        s.add("xx", torch.mul(x, x, out=product))
        s.add("xd", torch.mul(x, d, out=product))
        s.add("dd", torch.mul(d, d, out=product))
        d.abs_()
        s.add("abs_d", d)
        s.max("max_abs_d", d.max())

    def add(self, tokens: float, sums: dict[str, float]) -> None:
        """Add one chunk's sums taken elsewhere (the fused sweep's x, d, xx, xd, dd, abs_d and max_abs_d)."""
        s = self.state
        s.add("n", tokens)
        for name in ("x", "d", "xx", "xd", "dd", "abs_d"):
            s.add(name, sums[name])
        s.max("max_abs_d", sums["max_abs_d"])

    def merge(self, other: PairSums) -> None:
        """Fold another accumulator into this one."""
        self.state.merge(other.state)

    def compute(self) -> dict[str, float]:
        """`prob_abs_diff_mean/_max/_std` (unbiased) and `prob_pearson_corr`; NaN where undefined (as verl)."""
        s = self.state
        n = s.get("n")
        if n == 0:
            return {"prob_abs_diff_mean": math.nan, "prob_abs_diff_max": math.nan, "prob_abs_diff_std": math.nan,
                    "prob_pearson_corr": math.nan}
        sum_x, sum_d, sum_abs = s.get("x"), s.get("d"), s.get("abs_d")
        var_abs = (s.get("dd") - sum_abs * sum_abs / n) / (n - 1) if n > 1 else math.nan
        var_x = s.get("xx") - sum_x * sum_x / n
        cov_xd = s.get("xd") - sum_x * sum_d / n
        var_d = s.get("dd") - sum_d * sum_d / n
        var_y = var_x - 2 * cov_xd + var_d
        # A variance from moment sums within rounding of the raw second moment is a constant's (verl's two-pass
        # corrcoef gives NaN there): the residue's sign and size depend on summation order, CPU or GPU.
        floor_x, floor_y = 1e-12 * s.get("xx"), 1e-12 * (s.get("xx") - 2 * s.get("xd") + s.get("dd"))
        defined = n > 1 and var_x > floor_x and var_y > floor_y
        pearson = (var_x - cov_xd) / math.sqrt(var_x * var_y) if defined else math.nan
        return {
            "prob_abs_diff_mean": sum_abs / n,
            "prob_abs_diff_max": s.get("max_abs_d"),
            "prob_abs_diff_std": math.sqrt(max(var_abs, 0.0)) if n > 1 else math.nan,
            "prob_pearson_corr": pearson,
        }


class PositionProfile:
    """Sum of |delta| and valid tokens per bin of token position within the row (positions from 0), on the device."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(0, dtype=F64, device=device)
        self.tokens = torch.zeros(0, dtype=torch.int64, device=device)

    def _grow(self, size: int) -> None:
        if size > self.sums.numel():
            self.sums = torch.cat([self.sums, self.sums.new_zeros(size - self.sums.numel())])
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(size - self.tokens.numel())])

    def update(self, chunk: Chunk) -> None:
        """Fold the chunk's |delta| into position bins: one segment sum over (row, bin) pieces, no token loop."""
        if chunk.num_tokens == 0:
            return
        assert chunk.layout is not None and chunk.offsets is not None
        # How many bins each row spans comes from the reader's offsets (host, per row); the rest is on the device.
        bins_per_row_np = (np.diff(chunk.offsets) + POSITION_BIN - 1) // POSITION_BIN
        total_bins, size = int(bins_per_row_np.sum()), int(bins_per_row_np.max())
        offsets = chunk.layout.offsets
        device = offsets.device
        bins_per_row = (offsets[1:] - offsets[:-1] + POSITION_BIN - 1) // POSITION_BIN
        row = torch.repeat_interleave(torch.arange(bins_per_row.numel(), device=device), bins_per_row,
                                      output_size=total_bins)
        first_bin = torch.cumsum(bins_per_row, 0) - bins_per_row
        index = torch.arange(total_bins, dtype=torch.int64, device=device) - first_bin[row]
        start = offsets[row] + POSITION_BIN * index  # the pieces tile the chunk's positions
        counts = chunk.layout.valid_from(start)
        sums = segment_sum(chunk.abs_log_ratio, counts, dtype=F64)
        self._grow(size)
        self.sums.index_add_(0, index, sums)
        self.tokens.index_add_(0, index, counts)

    def add(self, sums: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add one chunk's per-bin sums and tokens taken elsewhere (the fused sweep)."""
        self._grow(sums.numel())
        self.sums[: sums.numel()] += sums
        self.tokens[: tokens.numel()] += tokens

    def merge(self, other: PositionProfile) -> None:
        """Add another profile's sums."""
        self.add(other.sums.to(self.sums.device), other.tokens.to(self.tokens.device))

    def compute(self) -> dict[str, object]:
        """Mean |delta| per position bin, coarsened (bin widths doubling) to at most POSITION_MAX_BINS bins."""
        sums, tokens, width = self.sums.cpu().numpy(), self.tokens.cpu().numpy(), POSITION_BIN
        while sums.size > POSITION_MAX_BINS:
            pad = sums.size % 2
            sums = np.concatenate([sums, np.zeros(pad)]).reshape(-1, 2).sum(axis=1)
            tokens = np.concatenate([tokens, np.zeros(pad, dtype=np.int64)]).reshape(-1, 2).sum(axis=1)
            width *= 2
        means = [float(s / t) if t else None for s, t in zip(sums, tokens, strict=True)]
        return {"bin_width": width, "tokens": [int(t) for t in tokens], "abs_log_ratio_mean": means}


class DiagnosticsAccumulator(Accumulator):
    """Token-mean |delta|, bias, probability-space diffs, sketches, ESS both ways, and the counts."""

    late = True  # reads the fused sweep (signatures.token_sums)
    counts, row_counts = PackableCounts(), PackableCounts()

    def __init__(self, device: torch.device, tables: bool = True) -> None:
        self.state = Reducer(device)
        self.tables = tables  # the quantile ladders and histograms (the overall batch's; a step reports keys only)
        # Sketch counts of delta, then of the rows' S_i: [0, NUM_BUCKETS) hold >= 0 by |value| bucket, the rest < 0.
        self.counts, self.row_counts = (torch.zeros(2 * NUM_BUCKETS, dtype=torch.int64, device=device) for _ in "ab")
        self.prob = PairSums(device)
        self.positions = PositionProfile(device)

    def pack(self) -> None:
        """Keep both sketches as their occupied buckets while nothing updates them (a breakdown state at rest)."""
        pack(self, "counts", "row_counts")

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences into the state."""
        s = self.state
        s.add("tokens", float(chunk.num_tokens))
        s.add("rows", float(chunk.num_rows))
        s.add("empty_rows", (~chunk.row_valid).sum())
        for name in ("nonfinite_tokens", "sentinel_tokens"):
            s.add(name, float(chunk.quality[name]))
        fused = token_sums(chunk)
        if fused is not None:
            self._fused_token_sums(chunk, fused)
        else:
            self._token_sums(chunk)
        if chunk.num_tokens == 0:
            return
        s.max("max_abs", chunk.abs_log_ratio.index_select(0, chunk.worst_token)[0])  # the signatures' argmax too
        # Kish ESS over valid rows of the sequence weights exp(clamp(S_i, +-20)).
        # Empty rows weigh 0 and fall in one extra bucket (no boolean selection: it would wait for the device).
        valid = chunk.row_valid
        row_log_ratio = chunk.log_ratio_row_sum
        row_weight = torch.where(valid, torch.exp(row_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)), 0.0)
        s.add("valid_rows", valid.sum())
        s.add("sum_row_weight", row_weight)
        s.add("sum_row_weight_sq", row_weight.square())
        buckets = torch.where(valid, signed_buckets(row_log_ratio), 2 * NUM_BUCKETS)
        self.row_counts += bincount(buckets, 2 * NUM_BUCKETS + 1)[: 2 * NUM_BUCKETS]

    def _token_sums(self, chunk: Chunk) -> None:
        """The token sums, sketch counts, probability-space pair and position profile, pass by pass."""
        s = self.state
        log_ratio = chunk.log_ratio
        abs_log_ratio = chunk.abs_log_ratio
        s.add("sum_abs", chunk.total(abs_log_ratio))
        s.add("sum_log_ratio", chunk.total(log_ratio))
        n, dtype, device = chunk.num_tokens, log_ratio.dtype, log_ratio.device
        negative = scratch("flag", n, torch.bool, device)
        if numpy_kernels(device):  # numpy's comparison: ~6x torch's on one thread
            np.less(log_ratio.numpy(), 0, out=negative.numpy())
        else:
            torch.lt(log_ratio, 0, out=negative)
        s.add("negative", count(negative))
        s.add("sum_exp_abs", _exp(abs_log_ratio, scratch("x", n, dtype, device)))
        s.add("sum_ratio", chunk.ratio_safe)
        s.add("sum_ratio_sq", chunk.total(chunk.ratio_safe_sq))
        if n == 0:
            return
        self.counts += bincount(signed_buckets(log_ratio), 2 * NUM_BUCKETS)
        self.prob.update(chunk.old, chunk.rollout)
        self.positions.update(chunk)

    def _fused_token_sums(self, chunk: Chunk, fused: TokenSums) -> None:
        """The same, from the chunk's fused sweep (signatures.token_sums)."""
        s, sums = self.state, fused.sums
        for name in ("negative", "sum_exp_abs"):
            s.add(name, sums[name])
        for name, values in (("sum_abs", chunk.abs_log_ratio), ("sum_log_ratio", chunk.log_ratio),
                             ("sum_ratio", chunk.ratio_safe), ("sum_ratio_sq", chunk.ratio_safe_sq)):
            s.add(name, chunk.total(values))  # the row-sum kernel's totals (Chunk.fuse_row_sums)
        self.counts += fused.sketch
        self.prob.add(float(chunk.num_tokens), sums)
        if fused.position_sums is None:  # the GPU sweep leaves the position profile to torch's segment sums
            self.positions.update(chunk)
        else:
            self.positions.add(fused.position_sums, fused.position_tokens)

    def merge(self, other: DiagnosticsAccumulator) -> None:
        """Fold another accumulator into this one."""
        self.state.merge(other.state)
        self.counts += other.counts.to(self.counts.device)
        self.row_counts += other.row_counts.to(self.row_counts.device)
        self.prob.merge(other.prob)
        self.positions.merge(other.positions)

    @staticmethod
    def _as_numpy(counts: torch.Tensor) -> np.ndarray:
        return counts.cpu().numpy().reshape(2, NUM_BUCKETS)

    def compute(self) -> Contribution:
        """The `diag/` keys, the quantile ladders and the histograms."""
        tables = {"quantiles": self.quantiles(), "histograms": self.histograms()} if self.tables else {}
        return Contribution(metrics={DIAG_PREFIX + k: finite_or_none(v) for k, v in self.values().items()}, **tables)

    def values(self) -> dict[str, float]:
        """The `diag/` keys (unprefixed) this accumulator owns."""
        s = self.state
        tokens = s.get("tokens") or math.nan  # no valid token: every mean is undefined
        mean_ratio = s.get("sum_ratio") / (tokens + 1e-8)
        mean_ratio_sq = s.get("sum_ratio_sq") / (tokens + 1e-8)
        counts = self._as_numpy(self.counts)
        signed = quantiles_from_counts(*signed_counts(counts), levels=tuple(SIGNED_KEYS.values()))
        absolute = quantiles_from_counts(counts.sum(axis=0), bucket_values(), levels=tuple(ABS_KEYS.values()))
        quantile = dict(zip([*SIGNED_KEYS, *ABS_KEYS], signed + absolute, strict=True))
        valid_rows = s.get("valid_rows")
        sum_w, sum_w_sq = s.get("sum_row_weight"), s.get("sum_row_weight_sq")
        prob = self.prob.compute()
        metrics: dict[str, float] = {
            "logprob_abs_diff_mean": s.get("sum_abs") / tokens,
            "logprob_abs_diff_max": s.get("max_abs", math.nan),
            "token_mult_prob_error": s.get("sum_exp_abs") / tokens,
            "log_ratio_mean": s.get("sum_log_ratio") / tokens,
            "log_ratio_median": _or_nan(quantile["log_ratio_p50"]),
            "log_ratio_neg_fraction": s.get("negative") / tokens,
            **prob,
        }
        metrics.update({key: _or_nan(value) for key, value in quantile.items()})
        metrics.update({
            "ess_token": ess(mean_ratio, mean_ratio_sq),  # verl's formula on raw, untruncated token ratios
            "ess_seq_kish": sum_w * sum_w / (valid_rows * sum_w_sq) if valid_rows and sum_w_sq > 0 else math.nan,
            "sequences": s.get("rows"),
            "valid_tokens": s.get("tokens"),
            "empty_rows": s.get("empty_rows"),
            "nonfinite_tokens": s.get("nonfinite_tokens"),
            "sentinel_tokens": s.get("sentinel_tokens"),
        })
        return metrics

    def quantiles(self) -> dict[str, object]:
        """A richer quantile ladder of delta and |delta| for the report (keys are the levels as strings)."""
        counts = self._as_numpy(self.counts)
        signed = quantiles_from_counts(*signed_counts(counts), levels=SIGNED_LEVELS)
        absolute = quantiles_from_counts(counts.sum(axis=0), bucket_values(), levels=ABS_LEVELS)
        rows = self._as_numpy(self.row_counts)
        row_signed = quantiles_from_counts(*signed_counts(rows), levels=SIGNED_LEVELS)
        return {
            "relative_error": SKETCH_RELATIVE_ERROR,
            "log_ratio": {str(q): v for q, v in zip(SIGNED_LEVELS, signed, strict=True)},
            "abs_log_ratio": {str(q): v for q, v in zip(ABS_LEVELS, absolute, strict=True)},
            "sequence_log_ratio_sum": {str(q): v for q, v in zip(SIGNED_LEVELS, row_signed, strict=True)},
        }

    def histograms(self) -> dict[str, object]:
        """Compact histograms for the plots: delta per token, S_i per valid row, |delta| by position."""
        return {
            "log_ratio": signed_histogram(self._as_numpy(self.counts)),
            "sequence_log_ratio_sum": signed_histogram(self._as_numpy(self.row_counts)),
            "position": self.positions.compute(),
        }


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


__all__ = ["DiagnosticsAccumulator", "PairSums", "PositionProfile", "bucket_values", "quantiles_from_counts",
           "signed_buckets", "signed_histogram"]
