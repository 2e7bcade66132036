"""Streaming Poisson bootstrap over sequences: 95 % intervals for the headline metrics in one pass.

Each row (sequence) gets K Poisson(1) weights that are a pure function of (seed, source file, row
index within the file), so intervals do not depend on chunking, on merge order or on whether a
report or its dumps are compared. Per chunk the per-row sums that the headline metrics are ratios
of ([B, F], float64) are folded into a [K, F] state as `weights^T @ features`; every replicate's
metric is then the same ratio of its weighted sums, and the interval is the percentile interval.
Weights come from splitmix64 hashes cut into 16-bit uniforms and Poisson(1)'s inverse CDF on that grid
(probabilities exact to 2^-16; weights above 8 are never drawn, P = 1e-6).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os

import numpy as np
import torch

from mismatch_cli.correction import SAFETY_BOUND
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import chi2, ess
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels.ops import count_in_segments, numpy_kernels

DEFAULT_REPLICATES = 200
MIN_INTERVAL_REPLICATES = 20  # fewer give no interval: the 2.5th and 97.5th percentiles of a handful are single draws
DEFAULT_SEED = 0
LEVEL = 0.95
ROW_BLOCK = 4096  # rows per weight block: bounds the [rows, K] temporaries to a few MB



_U64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit pattern as the signed int64 torch stores."""
    value &= _U64
    return value - (1 << 64) if value >= 1 << 63 else value


GOLDEN = _signed(0x9E3779B97F4A7C15)
MIX1 = _signed(0xBF58476D1CE4E5B9)
MIX2 = _signed(0x94D049BB133111EB)
LANE_BITS = 16  # four 16-bit uniforms per 64-bit hash
LANES = 64 // LANE_BITS


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; masking off the sign-extended bits makes it logical.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors (wrapping arithmetic, bit-exact on CPU and CUDA)."""
    x = (x ^ _shift_right(x, 30)) * MIX1
    x = (x ^ _shift_right(x, 27)) * MIX2
    return x ^ _shift_right(x, 31)


def _poisson_table() -> np.ndarray:
    """Inverse CDF of Poisson(1) on the 2^16 grid: entry u is the weight of the uniform (u + 0.5) / 2^16."""
    grid = (np.arange(1 << LANE_BITS, dtype=np.float64) + 0.5) / (1 << LANE_BITS)
    cdf = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(24)])
    return np.searchsorted(cdf, grid, side="right").astype(np.uint8)


POISSON_TABLE = _poisson_table()
# Weight of u = how many of these it reaches: a few compares beat a gather from the table on the CPU.
_THRESHOLDS = np.searchsorted(POISSON_TABLE, np.arange(1, int(POISSON_TABLE.max()) + 1)).astype(np.uint16)
_TORCH_TABLES: dict[torch.device, torch.Tensor] = {}


@functools.lru_cache(maxsize=4096)
def source_key(seed: int, source: str) -> int:
    """A 64-bit key for one input file (its normalized path) under one seed."""
    digest = hashlib.blake2b(f"{seed}\0{os.path.normpath(source)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _mix_numpy(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer in place on a uint64 array (numpy wraps; ~10x torch's int64 speed on a CPU)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(MIX1 & _U64)
    x ^= x >> np.uint64(27)
    x *= np.uint64(MIX2 & _U64)
    x ^= x >> np.uint64(31)
    return x


def _uniforms_numpy(key: int, row_numbers: np.ndarray, replicates: int) -> np.ndarray:
    words = -(-replicates // LANES)
    golden = np.uint64(GOLDEN & _U64)
    rows = row_numbers.astype(np.uint64)
    count = len(rows)
    row_hash = _mix_numpy(rows * golden + np.uint64(key & _U64))
    counters = np.arange(1, words + 1, dtype=np.uint64) * golden
    hashed = _mix_numpy(row_hash[:, None] + counters[None, :])
    # Lane l of a word is bits 16l..16l+15 (a little-endian view, as the shifts of the torch path).
    return hashed.astype("<u8", copy=False).view("<u2").reshape(count, words * LANES)[:, :replicates]


def _uniforms_torch(key: int, row_numbers: np.ndarray, replicates: int, device: torch.device) -> torch.Tensor:
    words = -(-replicates // LANES)
    count = len(row_numbers)
    if count and int(row_numbers[-1]) - int(row_numbers[0]) == count - 1:  # consecutive: made on the device
        rows = torch.arange(int(row_numbers[0]), int(row_numbers[0]) + count, dtype=torch.int64, device=device)
    else:  # scattered rows (an interleaved --by part): a copy, which waits for the device
        rows = torch.from_numpy(row_numbers.astype(np.int64)).to(device)
    row_hash = mix64(rows * GOLDEN + key)
    counters = torch.arange(1, words + 1, dtype=torch.int64, device=device) * GOLDEN
    hashed = mix64(row_hash[:, None] + counters[None, :])  # [B, words]
    shifts = torch.arange(LANES, dtype=torch.int64, device=device) * LANE_BITS
    lanes = (hashed[:, :, None] >> shifts) & ((1 << LANE_BITS) - 1)  # [B, words, LANES]
    return lanes.reshape(count, words * LANES)[:, :replicates]


def poisson_weights(key: int, row_numbers: np.ndarray, replicates: int, device: torch.device | None = None,
                    ) -> torch.Tensor:
    """Poisson(1) weights [rows, replicates] (float64) of the rows with these indices in the file with this key."""
    device = device or torch.device("cpu")
    if numpy_kernels(device):
        uniforms = _uniforms_numpy(key, row_numbers, replicates)
        weights = np.zeros(uniforms.shape, dtype=np.uint8)
        for threshold in _THRESHOLDS:
            weights += uniforms >= threshold
        return torch.from_numpy(weights.astype(np.float64))
    if device not in _TORCH_TABLES:
        _TORCH_TABLES[device] = torch.from_numpy(POISSON_TABLE.astype(np.float64)).to(device)
    return _TORCH_TABLES[device][_uniforms_torch(key, row_numbers, replicates, device)]


# Per-row features; every headline metric is a ratio of their (weighted) sums.
BASE_FEATURES = (
    "tokens",  # valid tokens
    "rows",  # 1 per row, empty rows included (verl's row means)
    "neg_log_ratio",  # sum of rollout - old
    "k3",
    "ratio_safe",
    "ratio_safe_sq",
    "abs_log_ratio",
    "rho_sq_seq",  # exp(2 clamp(S_i, +-20))
    "ppl_ratio",  # exp(log_ppl_diff_i)
    "log_ppl_abs_diff",  # |log_ppl_diff_i|
    "valid_row",  # 1 per row with a valid token
    "seq_weight",  # exp(clamp(S_i, +-20)) on valid rows (Kish ESS)
    "seq_weight_sq",
)
IS_FEATURES = ("is_weight", "is_weight_sq")
RS_FEATURES = ("rs_lost_tokens", "rs_rejected_row")


class BootstrapAccumulator(Accumulator):
    """K Poisson-bootstrap replicates of the headline metrics' sums, as a [K, F] float64 state."""

    reads = frozenset({"is_token_weight", "is_row_weight", "rs_row_reject", "rs_token_reject"})

    def __init__(
        self,
        replicates: int,
        device: torch.device,
        is_level: str | None = None,
        rejection: bool = False,
        seed: int | None = None,
    ) -> None:
        self.replicates = replicates
        self.seed = DEFAULT_SEED if seed is None else seed
        self.is_level = is_level
        self.rejection = rejection
        self.features = BASE_FEATURES + (IS_FEATURES if is_level else ()) + (RS_FEATURES if rejection else ())
        self.sums = torch.zeros((replicates, len(self.features)), dtype=F64, device=device)

    def _row_features(self, chunk: Chunk, decisions: ChunkDecisions) -> torch.Tensor:
        tokens = chunk.row_tokens
        log_sum = chunk.log_ratio_row_sum
        # rollout_mean - train_mean of verl's log_ppl_diff, from the one cached row sum of old - rollout.
        log_ppl_diff = -log_sum / chunk.row_denominator
        valid = chunk.row_valid.to(F64)
        rho_sq_seq = chunk.row_ratio_safe_sq
        columns = [
            tokens,
            torch.ones_like(tokens),
            -log_sum,
            chunk.row_sum(chunk.k3),
            chunk.row_sum(chunk.ratio_safe),
            chunk.row_sum(chunk.ratio_safe_sq),
            chunk.row_sum(chunk.abs_log_ratio),
            rho_sq_seq,
            torch.exp(log_ppl_diff),
            log_ppl_diff.abs(),
            valid,
            torch.exp(log_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * valid,
            rho_sq_seq * valid,
        ]
        if self.is_level == "token":
            weight = decisions.require("is_token_weight")
            columns += [chunk.row_sum(weight), chunk.row_sum(weight.square())]
        elif self.is_level is not None:
            weight = decisions.require("is_row_weight").to(F64)
            columns += [weight * tokens, weight.square() * tokens]
        if self.rejection:
            row_reject = decisions.require("rs_row_reject")
            token_reject = decisions.rs_token_reject  # None without a token-level option
            rejected_in_row = (
                count_in_segments(token_reject, chunk.lengths) if token_reject is not None
                else torch.zeros_like(tokens)
            )
            lost = torch.where(row_reject, tokens, rejected_in_row.to(tokens.device))
            columns += [lost, (chunk.row_valid & (lost > 0)).to(F64)]
        return torch.stack(columns, dim=1)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk's rows into every replicate, with the IS weights and RS rejections decided for it."""
        if chunk.num_rows == 0:
            return
        features = self._row_features(chunk, decisions)
        row_numbers = chunk.row_numbers  # each row's weights hang on its index in the file, whatever the chunking
        key = source_key(self.seed, chunk.source)
        device = features.device
        for start in range(0, chunk.num_rows, ROW_BLOCK):
            stop = min(start + ROW_BLOCK, chunk.num_rows)
            weights = poisson_weights(key, row_numbers[start:stop], self.replicates, device)
            self.sums.addmm_(weights.T, features[start:stop])

    def merge(self, other: BootstrapAccumulator) -> None:
        """Fold another shard's replicates into this one."""
        self.sums += other.sums.to(self.sums.device)

    def replicate_metrics(self) -> dict[str, np.ndarray]:
        """Every headline metric for each replicate (float64 [K]; NaN where undefined)."""
        sums = self.sums.cpu().numpy()
        f = {name: sums[:, i] for i, name in enumerate(self.features)}
        with np.errstate(divide="ignore", invalid="ignore"):
            tokens = f["tokens"] + 1e-8  # verl's masked_mean denominator
            rows = np.where(f["rows"] > 0, f["rows"], np.nan)
            valid = np.where(f["tokens"] > 0, f["tokens"], np.nan)
            mean_ratio = f["ratio_safe"] / tokens
            mean_ratio_sq = f["ratio_safe_sq"] / tokens
            out = {
                "rollout_corr/kl": f["neg_log_ratio"] / tokens,
                "rollout_corr/k3_kl": f["k3"] / tokens,
                "rollout_corr/chi2_token": chi2(f["ratio_safe_sq"], tokens),
                "rollout_corr/chi2_seq": chi2(f["rho_sq_seq"], rows),
                "rollout_corr/ppl_ratio": f["ppl_ratio"] / rows,
                "rollout_corr/log_ppl_abs_diff": f["log_ppl_abs_diff"] / rows,
                "diag/logprob_abs_diff_mean": f["abs_log_ratio"] / valid,
                "diag/ess_token": ess(mean_ratio, mean_ratio_sq),
                "diag/ess_seq_kish": f["seq_weight"] ** 2
                / (f["valid_row"] * np.where(f["seq_weight_sq"] > 0, f["seq_weight_sq"], np.nan)),
            }
            if self.is_level:
                mean = f["is_weight"] / tokens
                mean_sq = f["is_weight_sq"] / tokens
                normalized_sq = mean_sq / (mean + 1e-8) ** 2
                out["rollout_corr/rollout_is_mean"] = mean
                out["rollout_corr/rollout_is_std"] = np.sqrt(np.maximum(mean_sq - mean * mean, 0.0))
                out["rollout_corr/rollout_is_eff_sample_size"] = 1.0 / np.where(
                    normalized_sq > 0, normalized_sq, np.nan
                )
            if self.rejection:
                out["rollout_corr/rollout_rs_masked_fraction"] = f["rs_lost_tokens"] / tokens
                out["rollout_corr/rollout_rs_seq_masked_fraction"] = f["rs_rejected_row"] / rows
        return out

    def compute(self, level: float = LEVEL) -> Contribution:
        """Percentile intervals [low, high] per metric, over the replicates where it is defined."""
        tail = (1.0 - level) / 2.0
        intervals: dict[str, list[float]] = {}
        if self.replicates < MIN_INTERVAL_REPLICATES:
            # A 95 % percentile interval of a handful of replicates is one of them, not an interval: it can
            # miss the estimate itself, and compare would call noise a change.
            return Contribution(notes=[f"{self.replicates} bootstrap replicates are too few for 95 % intervals "
                                       f"(at least {MIN_INTERVAL_REPLICATES}); the report has none"])
        for key, values in self.replicate_metrics().items():
            # A replicate that drew weight 0 for every valid row has no value; an overflowed metric
            # (k3_kl) has none in most: without a majority of defined replicates there is no interval.
            values = values[np.isfinite(values)]
            if values.size == 0 or values.size < self.replicates / 2:
                continue
            low, high = np.quantile(values, [tail, 1.0 - tail])
            intervals[key] = [float(low), float(high)]
        return Contribution(intervals=intervals)


__all__ = [
    "DEFAULT_REPLICATES",
    "MIN_INTERVAL_REPLICATES",
    "BootstrapAccumulator",
    "mix64",
    "poisson_weights",
    "source_key",
]
