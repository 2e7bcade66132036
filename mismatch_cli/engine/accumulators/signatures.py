"""What the bug signatures and the causes of a failing check need, folded per chunk in fixed-size float64 state.

Per signed |delta| octave (bucket e holds 2^(e-127) <= |delta| < 2^(e-126), the float32 exponent; bucket 0
also holds 0; delta < 0 and delta >= 0 in separate buckets): tokens, the chi2_token terms
(formulas.chi2_token_terms), the clamped ratio and exp|delta|, so "N tokens with delta >= d carry y % of
chi2_token" (only delta > 0 adds to its excess, ratio^2 - 1) and "N tokens with |delta| >= d carry y % of
token_mult_prob_error - 1" are exact for every power of two d (per token k3 - k1 = ratio - 1); the k3 and k1
totals. Per side: exact-constant fills (a side exactly 0.0, or repeating the previous valid token's value of
its row, while the other side moves, on a token whose |delta| exceeds ln 2). The bitwise-equal count; the
moments of x = old, y = rollout for the least-squares slope of rollout on old (the temperature signature);
the residuals of the aligned and the one-token-shifted streams within rows (the off-by-one signature); and
the tokens with the largest |delta| and the largest delta, placed (worst_token.py).

Every per-token sum accumulates in float64 device tensors (no host round trip per chunk); the two tokens'
candidates are resolved on the host once every PENDING chunks and in `compute`.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.accumulators.worst_token import WorstTokens
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import DIAG_PREFIX, Accumulator, ChunkDecisions, Contribution, finite_or_none
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.engine.kernels import sweep, sweep_gpu
from mismatch_cli.engine.kernels.ops import bincount, numpy_kernels, scratch, total
from mismatch_cli.engine.kernels.sweep import TokenSums

# Octave buckets of |delta|: the float32 exponent field (a float64 one is mapped onto it, clamped), read from
# the bits, which is several times cheaper than comparing with edges.
NUM_BUCKETS = 256
EXPONENT_BIAS = 127
# A fill token: the filled side's value is off the other side's by more than a factor 2 of probability.
# bf16 rounding turns a log-prob of about -0.06 or above into exactly 0.0, never one below -ln 2.
FILL_LOG_RATIO = math.log(2.0)
# The ratio-mean test caps each token's ratio at e: under the rollout distribution E[ratio] = 1, so the capped
# mean is 1 minus the trainer's mass on tokens with ratio > e (tiny for precision noise), and a bounded summand
# keeps its standard error honest however heavy the upper tail is (findings/signatures.py, ratio_mean_test).
RATIO_CAP_LOG = 1.0
# The temperature estimate: rollout = old / T + c per position, with c >= 0 when T < 1 (c <= 0 when T > 1) and
# c -> 0 where one logit dominates, so rollout / old <= 1 / T on every token and reaches it on peaked positions
# (>= 1 / T when T > 1). A histogram of rollout / old over tokens with old < -TAIL_NATS (where precision noise is
# small against old) gives its extreme quantile; the least-squares slope is pulled toward 1 by c.
TAIL_NATS = 1.0
SLOPE_BINS, SLOPE_RANGE = 2048, 4.0
SIDES = ("old", "rollout")


def bucket_low(index: int) -> float:
    """The lowest |delta| of octave bucket `index` (0.0 for bucket 0, which also holds zeros and subnormals)."""
    return 0.0 if index == 0 else math.ldexp(1.0, index - EXPONENT_BIAS)


def bucket_high(index: int) -> float:
    """The bound |delta| stays below in octave bucket `index`."""
    return math.inf if index == NUM_BUCKETS - 1 else math.ldexp(1.0, index + 1 - EXPONENT_BIAS)


def signed_octaves(delta: torch.Tensor) -> torch.Tensor:
    """Bucket per value: the octave of |value| (its float32 exponent field; float64: the same octave, clamped),
    plus NUM_BUCKETS when the sign bit is set, so the two signs never share a bucket."""
    if delta.dtype == torch.float32:  # sign and exponent are the top 9 bits; the arithmetic shift sign-extends
        return torch.bitwise_right_shift(delta.view(torch.int32), 23).bitwise_and_(2 * NUM_BUCKETS - 1).long()
    bits = delta.view(torch.int64)
    exponent = torch.bitwise_right_shift(bits, 52).bitwise_and_(0x7FF) - (1023 - EXPONENT_BIAS)
    return exponent.clamp_(0, NUM_BUCKETS - 1).add_((bits < 0).long(), alpha=NUM_BUCKETS)


def _host_octaves(delta: np.ndarray, device: torch.device) -> np.ndarray:
    """`signed_octaves` of a host array as the int64 index numpy's bincount takes, shifted into a work buffer."""
    if delta.dtype != np.float32:
        return signed_octaves(torch.from_numpy(delta)).numpy()
    out = scratch("signatures_octave", delta.size, torch.int64, device).numpy()
    return np.right_shift(delta.view(np.uint32), 23, out=out)  # unsigned: the sign bit lands on NUM_BUCKETS


def fused_row_sums(chunk: Chunk) -> str:
    """Take the chunk's per-row sums in the fused pass where one runs: "gpu" (its kernels launched), "cpu" (the CPU
    sweep's row-sum kernel), or "" where none runs (each sum is then taken when first asked for)."""
    if not chunk.num_tokens or chunk.layout is None or chunk.offsets is None:
        return ""
    if sweep_gpu.wanted(chunk.old):  # on a GPU: launched here, asynchronous like every device kernel
        try:
            chunk.fuse_row_sums()
        except Exception as error:  # noqa: BLE001 - an optional accelerator: torch's passes take over
            sweep_gpu.give_up(error)
            return ""
        return "gpu"
    if not sweep.wanted(chunk.old, chunk.fused):
        return ""
    chunk.fuse_row_sums()
    return "cpu"


def start_token_sums(chunk: Chunk) -> None:
    """Start the chunk's fused sweep: on a GPU its kernels, else on the sweep's thread, where it runs (the
    accumulators before the diagnostics overlap with it); `token_sums` waits for it."""
    if "token_sums" in chunk.shared:
        return
    where = fused_row_sums(chunk)
    if where == "gpu":
        try:
            chunk.shared["token_sums"] = sweep_gpu.token_sums(
                chunk.old, chunk.rollout, chunk.ratio_safe, chunk.ratio_safe_sq, chunk.lengths, FILL_LOG_RATIO,
                TAIL_NATS, SLOPE_BINS / SLOPE_RANGE, SLOPE_BINS)
        except Exception as error:  # noqa: BLE001 - an optional accelerator: torch's passes take over
            sweep_gpu.give_up(error)
    elif where == "cpu":
        assert chunk.layout is not None
        chunk.shared["token_sums"] = sweep.start(
            chunk.old.numpy(), chunk.rollout.numpy(), chunk.log_ratio.numpy(), chunk.abs_log_ratio.numpy(),
            chunk.ratio_safe.numpy(), chunk.ratio_safe_sq.numpy(), chunk.lengths.numpy(), chunk.layout.keep.numpy(),
            chunk.offsets, FILL_LOG_RATIO, TAIL_NATS, SLOPE_BINS / SLOPE_RANGE, SLOPE_BINS)


def token_sums(chunk: Chunk) -> TokenSums | None:
    """The chunk's fused sweep, taken once for the diagnostics and the signatures (None: they take numpy's or
    torch's passes)."""
    start_token_sums(chunk)
    found = chunk.shared.setdefault("token_sums", None)
    if isinstance(found, Future):
        found = chunk.shared["token_sums"] = found.result()
    return found


def _row_starts(chunk: Chunk) -> torch.Tensor:
    """Bool [N + 1]: True at each row's first valid token (and at N), so pair (t, t+1) is in one row iff not [t+1]."""
    n = chunk.num_tokens
    flags = torch.zeros(n + 1, dtype=torch.bool, device=chunk.old.device)
    starts = torch.cumsum(chunk.lengths, 0) - chunk.lengths  # an empty row's start is the next row's (or N)
    flags[starts] = True
    flags[n] = True
    return flags


class SignaturesAccumulator(Accumulator):
    """Bucketed chi2 / k3 / k1, constant fills, bitwise equality, temperature moments, shift residuals, worst token."""

    late = True  # reads the fused sweep (signatures.token_sums)

    def __init__(self, device: torch.device, tables: bool = True) -> None:
        self.device = device
        self.tables = tables  # False (a step or group): no bucket table, which only the overall findings read
        self.state = Reducer(device)
        # tokens, sum ratio^2, sum ratio, sum exp|delta| (NeMo-RL's token_mult_prob_error summand), per signed
        # octave: [0, NUM_BUCKETS) hold delta >= 0, the rest delta < 0 (only delta > 0 adds to chi2's excess)
        self.buckets = torch.zeros((4, 2 * NUM_BUCKETS), dtype=F64, device=device)
        self.tail_slopes = torch.zeros(SLOPE_BINS, dtype=F64, device=device)  # histogram of rollout / old, tail
        self.tokens = WorstTokens()

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences in (device work only, but one host read per PENDING chunks)."""
        n = chunk.num_tokens
        s = self.state
        s.add("tokens", float(n))
        if n == 0:
            return
        s.add("k3", chunk.total(chunk.k3))
        s.add("k1", -chunk.total(chunk.log_ratio))  # k1 = rollout - old; negation is exact, so is the negated sum
        s.add("pairs", float(n) - total(chunk.row_valid))  # pairs (t, t+1) in one row: N minus non-empty rows
        excess = chunk.log_ratio.clamp(max=RATIO_CAP_LOG).expm1_()  # min(ratio, e) - 1, exact near 0
        s.add("ratio_excess", excess)
        s.add("ratio_excess_sq", excess.mul_(excess))
        fused = token_sums(chunk)
        self.tail_slopes += fused.slopes if fused is not None else _tail_slopes(chunk.old, chunk.rollout)
        if fused is not None:
            self._fused_sums(chunk, fused)
        elif numpy_kernels(chunk.old):
            self._host_sums(chunk)
        else:
            self._device_sums(chunk)
        self.tokens.update(chunk)

    def _fused_sums(self, chunk: Chunk, fused: TokenSums) -> None:
        """The same sums, from the chunk's fused sweep."""
        s, sums = self.state, fused.sums
        self.buckets += fused.octaves
        for name in ("bitwise_equal", "zero_old", "repeat_old", "fill_old", "zero_rollout", "repeat_rollout",
                     "fill_rollout"):
            s.add(name, sums[name])
        s.add("x", chunk.total(chunk.old))  # the row-sum kernel's totals (Chunk.fuse_row_sums)
        s.add("y", chunk.total(chunk.rollout))
        for name, key in (("xx", "old_sq"), ("yy", "rollout_sq"), ("xy", "old_rollout"),
                          ("shift_aligned", "shift_aligned"), ("shift_forward", "shift_forward"),
                          ("shift_backward", "shift_backward")):
            s.add(name, sums[key])

    def _host_sums(self, chunk: Chunk) -> None:
        """Buckets, fills, equality, moments and shift residuals on numpy's kernels, in reused work buffers.

        Pair (t, t+1) lives at index t + 1 of an N + 1 buffer whose row starts are then cleared: a start s
        breaks pair s - 1, and starts 0 and N land on the two pads, so no per-pair row mask is built.
        """
        s, n, cpu = self.state, chunk.num_tokens, chunk.old.device
        old, rollout = chunk.old.numpy(), chunk.rollout.numpy()
        magnitude = chunk.abs_log_ratio.numpy()
        lengths = chunk.lengths.numpy()
        starts = np.cumsum(lengths) - lengths  # an empty row's start is the next row's (or N)
        index = _host_octaves(chunk.log_ratio.numpy(), cpu)
        sums = self.buckets
        exp_abs = scratch("signatures_exp_abs", n, chunk.old.dtype, cpu).numpy()
        with np.errstate(over="ignore"):  # inf past the dtype's range, as NeMo-RL's float32 metric gives
            np.exp(magnitude, out=exp_abs)
        for row, weights in enumerate((None, chunk.ratio_safe_sq.numpy(), chunk.ratio_safe.numpy(), exp_abs)):
            found = np.bincount(index, weights=weights, minlength=2 * NUM_BUCKETS)
            sums[row] += torch.from_numpy(found.astype(np.float64, copy=False))

        def flags(name: str, size: int = n) -> np.ndarray:
            return scratch(f"signatures_{name}", size, torch.bool, cpu).numpy()

        s.add("bitwise_equal", np.count_nonzero(np.equal(old, rollout, out=flags("equal"))))
        far = np.greater(magnitude, magnitude.dtype.type(FILL_LOG_RATIO), out=flags("far"))
        zeros, repeats = [], []
        for side, values in enumerate((old, rollout)):
            zeros.append(np.equal(values, 0, out=flags(f"zero{side}")))
            repeat = flags(f"repeat{side}", n + 1)  # [t]: token t repeats token t - 1 of its row
            repeat[0] = False
            np.equal(values[1:], values[:-1], out=repeat[1:n])
            repeat[starts] = False
            repeats.append(repeat[:n])
        own, filled = flags("own"), flags("filled")
        for side, name in enumerate(SIDES):
            other = 1 - side
            np.greater(zeros[side], zeros[other], out=own)  # this side exactly 0.0, the other not
            np.greater(repeats[side], repeats[other], out=filled)  # this side repeats, the other moves
            s.add(f"zero_{name}", np.count_nonzero(own))
            s.add(f"repeat_{name}", np.count_nonzero(filled))
            np.logical_or(own, filled, out=own)
            s.add(f"fill_{name}", np.count_nonzero(np.logical_and(own, far, out=own)))
        work = scratch("signatures_values", n + 1, chunk.old.dtype, cpu)
        values = work.numpy()
        s.add("x", chunk.total(chunk.old))
        s.add("y", chunk.total(chunk.rollout))
        for name, left, right in (("xx", old, old), ("yy", rollout, rollout), ("xy", old, rollout)):
            s.add(name, torch.from_numpy(np.multiply(left, right, out=values[:n])))
        delta = chunk.log_ratio.numpy()
        for name, left, right in (("aligned", delta[:-1], None), ("forward", old[:-1], rollout[1:]),
                                  ("backward", old[1:], rollout[:-1])):
            pair = values[1:n]
            if right is None:
                np.multiply(left, left, out=pair)
            else:
                np.multiply(np.subtract(left, right, out=pair), pair, out=pair)
            values[starts] = 0
            s.add(f"shift_{name}", work[1:n])

    def _device_sums(self, chunk: Chunk) -> None:
        """The same sums with torch's kernels (any device, no host round trip)."""
        s = self.state
        old, rollout = chunk.old, chunk.rollout
        index, size = signed_octaves(chunk.log_ratio), 2 * NUM_BUCKETS
        self.buckets[0] += bincount(index, size).to(F64)
        self.buckets[1] += bincount(index, size, chunk.ratio_safe_sq)
        self.buckets[2] += bincount(index, size, chunk.ratio_safe)
        self.buckets[3] += bincount(index, size, torch.exp(chunk.abs_log_ratio))
        s.add("bitwise_equal", old == rollout)
        continues = ~_row_starts(chunk)[1:-1]  # [N - 1]: token t + 1 continues token t's row
        far = chunk.abs_log_ratio > FILL_LOG_RATIO
        repeats = []
        for side in (old, rollout):
            repeat = torch.zeros_like(far)
            repeat[1:] = (side[1:] == side[:-1]) & continues
            repeats.append(repeat)
        for name, side, other, mine, theirs in (("old", old, rollout, *repeats), ("rollout", rollout, old,
                                                                                  *repeats[::-1])):
            zero = (side == 0) & (other != 0)
            repeat = mine & ~theirs
            s.add(f"zero_{name}", zero)
            s.add(f"repeat_{name}", repeat)
            s.add(f"fill_{name}", (zero | repeat) & far)
        s.add("x", old)
        s.add("y", rollout)
        s.add("xx", old * old)
        s.add("yy", rollout * rollout)
        s.add("xy", old * rollout)
        # Squared residuals of pairs (t, t+1) inside a row: aligned, rollout one token late, one token early.
        for name, residual in (("aligned", chunk.log_ratio[:-1]), ("forward", old[:-1] - rollout[1:]),
                               ("backward", old[1:] - rollout[:-1])):
            s.add(f"shift_{name}", torch.where(continues, residual * residual, 0.0))

    def merge(self, other: SignaturesAccumulator) -> None:
        """Fold another shard's state in."""
        self.state.merge(other.state)
        self.buckets += other.buckets.to(self.device)
        self.tail_slopes += other.tail_slopes.to(self.device)
        self.tokens.merge(other.tokens)

    def compute(self) -> Contribution:
        """The `diag/` signature keys and the tables the findings read."""
        table = self.table()
        slopes = self.tail_slopes.cpu().numpy()
        metrics = {DIAG_PREFIX + k: finite_or_none(v) for k, v in values(table, slopes).items()}
        return Contribution(metrics=metrics, signatures=table)

    def table(self) -> dict[str, Any]:
        """Every sum as Python numbers: buckets (an overall batch's only), fills, moments, shift residuals, the two
        placed tokens."""
        s = self.state
        sums = self.buckets.cpu().numpy()
        # Only the occupied octaves, in ascending |delta|; in one octave delta < 0 (sign -1) before delta >= 0.
        occupied = sorted(np.flatnonzero(sums[0]).tolist(), key=lambda i: (i % NUM_BUCKETS, -i)) if self.tables else []
        buckets = [{"low": bucket_low(i % NUM_BUCKETS), "high": bucket_high(i % NUM_BUCKETS),
                    "sign": -1 if i >= NUM_BUCKETS else 1, "tokens": int(sums[0, i]), "chi2_terms": float(sums[1, i]),
                    "ratio_sum": float(sums[2, i]), "exp_abs_sum": float(sums[3, i])} for i in occupied]
        keys = ("tokens", "k3", "k1", "ratio_excess", "ratio_excess_sq", "bitwise_equal", "x", "y", "xx", "yy", "xy",
                "pairs", "shift_aligned",
                "shift_forward", "shift_backward", *(f"{kind}_{side}" for kind in ("zero", "repeat", "fill")
                                                    for side in SIDES))
        out: dict[str, Any] = {key: s.get(key) for key in keys}
        for key in ("tokens", "bitwise_equal", "pairs", *(k for k in keys if k.startswith(("zero", "repeat", "fill")))):
            out[key] = int(out[key])
        out["chi2_terms"] = float(sums[1].sum())
        out["buckets"] = buckets
        if self.tables:  # the occupied tail-slope bins, as [bin, tokens] pairs
            slopes = self.tail_slopes.cpu().numpy()
            occupied_slopes = np.flatnonzero(slopes)
            out["tail_slopes"] = np.stack([occupied_slopes, slopes[occupied_slopes].astype(np.int64)], 1).tolist()
        out.update(self.tokens.compute())
        return out


def values(table: dict[str, Any], slopes: np.ndarray) -> dict[str, float]:
    """The `diag/` keys (unprefixed) from the table and the tail-slope counts per bin: NaN where undefined."""
    n = table["tokens"] or math.nan
    x, y = table["x"], table["y"]
    sxx = table["xx"] - x * x / n
    sxy = table["xy"] - x * y / n
    slope = sxy / sxx if sxx > 0 else math.nan
    k1, k3 = table["k1"], table["k3"]
    mean, error = ratio_mean_test(table)
    aligned = table["shift_aligned"]
    shifted = min(table["shift_forward"], table["shift_backward"])
    return {
        "bitwise_equal_fraction": table["bitwise_equal"] / n,
        "temperature_slope": slope,
        "best_fit_temperature": 1.0 / slope if slope > 0 else math.nan,
        "temperature_estimate": temperature_estimate(slopes, slope),
        "shift_residual_ratio": shifted / aligned if table["pairs"] and aligned > 0 else math.nan,
        "constant_fill_fraction_old": table["fill_old"] / n,
        "constant_fill_fraction_rollout": table["fill_rollout"] / n,
        "k3_k1_ratio": k3 / k1 if k1 != 0 else math.nan,
        "ratio_mean": mean,
        "ratio_mean_se": error,
    }


def _tail_slopes(old: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """Histogram (float64, SLOPE_BINS) of rollout / old over the tokens with old < -TAIL_NATS."""
    scale = SLOPE_BINS / SLOPE_RANGE
    if numpy_kernels(old):  # numpy's index gather: ~4x torch's boolean mask on one thread
        o, r = old.numpy(), rollout.numpy()
        where = np.flatnonzero(o < -TAIL_NATS)
        ratio = np.divide(r[where], o[where])
        np.clip(np.multiply(ratio, ratio.dtype.type(scale), out=ratio), 0, SLOPE_BINS - 1, out=ratio)
        return torch.from_numpy(np.bincount(ratio.astype(np.int64), minlength=SLOPE_BINS).astype(np.float64))
    # Every token, those off the tail weighted 0 (a selection would wait for the device to size it); their
    # stand-in divisor keeps the index finite.
    tail = old < -TAIL_NATS
    ratio = (rollout / torch.where(tail, old, -TAIL_NATS)).mul_(scale).clamp_(0, SLOPE_BINS - 1)
    return bincount(ratio.to(torch.int64), SLOPE_BINS, tail)


def temperature_estimate(counts: np.ndarray, slope: float, quantile: float = 0.999) -> float:
    """1 / the extreme quantile of rollout / old over tail tokens (`counts` per slope bin), on the side the slope
    points (NaN if < 100)."""
    total = counts.sum()
    if total < 100 or not math.isfinite(slope) or slope == 1:
        return math.nan
    rank = quantile * total if slope > 1 else (1 - quantile) * total
    index = int(np.searchsorted(np.cumsum(counts), rank))
    value = (index + 0.5) * SLOPE_RANGE / SLOPE_BINS
    return 1.0 / value


def ratio_mean_test(table: dict[str, Any]) -> tuple[float, float]:
    """Token-mean of min(ratio, e) and its standard error (NaN with fewer than 2 tokens)."""
    n = table["tokens"]
    if n < 2:
        return math.nan, math.nan
    excess = table["ratio_excess"] / n  # sums of min(ratio, e) - 1: no cancellation when the ratios sit near 1
    variance = max(table["ratio_excess_sq"] / n - excess * excess, 0.0) * n / (n - 1)
    return 1.0 + excess, math.sqrt(variance / n)


__all__ = ["FILL_LOG_RATIO", "NUM_BUCKETS", "SignaturesAccumulator", "bucket_high", "bucket_low", "signed_octaves",
           "values"]
