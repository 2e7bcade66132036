"""The fused CPU sweep: numba kernels that take in one pass what many numpy passes over a chunk took.

`token_sums` takes every per-token sum, count and histogram the diagnostics and the signatures need, on its
own thread (`start`; the kernels release the GIL) while the other accumulators fold the chunk.
`segment_sums` takes the row sums and totals most accumulators share. numba is imported only for inputs
that repay its start-up (`worth_it`), and the kernels are compiled once into the user's cache folder, so
`--help`, small dumps and the readers never import it. The numpy passes stay the reference and the path
everywhere else (a GPU, float64, numba missing, small inputs). Counts, sketches and histograms are
identical to theirs; float sums are float64 sums in another order (vectorized), equal to float64 rounding.
float32 only: differences, products and comparisons are taken in float32, as numpy and torch take them.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.ops import numpy_kernels
from mismatch_cli.engine.sketch import NUM_BUCKETS, SHIFT

# A process pays ~0.4 s to import numba and load the cached kernel, which the sweep repays (about 9 ns a token) on
# inputs of this many bytes (~35M tokens of a float32 parquet dump); the decision is by input, never by chunk or
# by what the process ran before, so one input always gives the same numbers.
MIN_INPUT_BYTES = 1 << 28
SKETCH_SIZE = 2 * NUM_BUCKETS  # the diagnostics' signed sketch of delta: the top bits of its float32 pattern
OCTAVE_SHIFT, OCTAVES = 23, 512  # the signatures' signed octaves: sign and exponent of a float32 (signatures.py)
POSITION_BIN = 32  # positions per bin of the diagnostics' position profile (diagnostics.POSITION_BIN)
_VERSION = 6  # bump with any change to a kernel, so that the first run after an upgrade says it compiles

# The sums of old, rollout, the log-ratio, its magnitude, the safe ratio and its square are not here: the row-sum
# kernel (SEGMENT_SUMS) takes them, and the accumulators read its totals (Chunk.total).
SUMS = ("negative", "sum_exp_abs",  # diagnostics
        "x", "d", "xx", "xd", "dd", "abs_d", "max_abs_d",  # diagnostics' probability-space pair
        "bitwise_equal", "zero_old", "repeat_old", "fill_old", "zero_rollout", "repeat_rollout", "fill_rollout",
        "old_sq", "rollout_sq", "old_rollout", "shift_aligned", "shift_forward", "shift_backward")  # signatures
_FORCED: list[bool | None] = [None]


def cache_dir() -> Path:
    """Where the compiled kernel is kept: $MISMATCH_CACHE_DIR, else $XDG_CACHE_HOME/mismatch, else ~/.cache/mismatch."""
    base = os.environ.get("MISMATCH_CACHE_DIR")
    if base:
        return Path(base) / "numba"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mismatch" / "numba"


@contextmanager
def forced(on: bool) -> Iterator[None]:
    """Use the sweep for every float32 CPU chunk (on) or never (off), whatever its size (for tests and benches)."""
    before = _FORCED[0]
    _FORCED[0] = on
    try:
        yield
    finally:
        _FORCED[0] = before


@cache
def _kernels() -> dict[str, Any] | None:
    """The compiled kernels (from the disk cache after the first run), or None where numba is missing or off."""
    if os.environ.get("MISMATCH_FUSED", "1") == "0":
        return None
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("NUMBA_CACHE_DIR", str(folder))
        import numba
    except (ImportError, OSError):
        return None
    marker = folder / f"sweep-{numba.__version__}-{_VERSION}"
    if not marker.exists():  # without a handler, logging's last resort prints this line on stderr
        logging.getLogger(__name__).warning(f"mismatch: compiling the fused CPU sweep once (cached in {folder})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unwritable cache folder: compile in memory, every run
        options = {"cache": True, "nogil": True, "fastmath": {"reassoc"}}
        kernels = {"sweep": numba.njit(_sweep_signature(numba.types), **options)(_sweep),
                   "segments": numba.njit(_segments_signature(numba.types), **options)(_segments)}
    try:
        marker.touch()
    except OSError:
        pass
    return kernels


def _kernel() -> Any:
    """The compiled sweep, or None."""
    kernels = _kernels()
    return None if kernels is None else kernels["sweep"]


def worth_it(input_bytes: int) -> bool:
    """Whether an input of this many bytes should take the sweep (MIN_INPUT_BYTES; MISMATCH_FUSED=always: any)."""
    return input_bytes >= MIN_INPUT_BYTES or os.environ.get("MISMATCH_FUSED") == "always"


def wanted(values: torch.Tensor, asked: bool) -> bool:
    """Whether a chunk's token sums come from the sweep: float32 on numpy's CPU path, when `asked` (or forced)."""
    use = asked if _FORCED[0] is None else _FORCED[0]
    return use and values.dtype == torch.float32 and numpy_kernels(values) and _kernel() is not None


@dataclass
class TokenSums:
    """One chunk's token sums (SUMS), sketch counts of delta, signed |delta| octaves, tail slopes, position bins."""

    sums: dict[str, float] | dict[str, torch.Tensor]  # floats, or 0-d float64 device tensors (engine/sweep_gpu.py)
    sketch: torch.Tensor  # int64 [SKETCH_SIZE]: the diagnostics' signed sketch counts of delta
    octaves: torch.Tensor  # float64 [4, OCTAVES]: tokens, sum ratio_safe^2, sum ratio_safe, sum exp|delta|
    slopes: torch.Tensor  # float64 [slope bins]: tokens with old < -tail per bin of rollout / old
    position_sums: torch.Tensor | None  # float64 [bins]: sum |delta| per POSITION_BIN positions within the row
    position_tokens: torch.Tensor | None  # int64 [bins] (both None: the profile is left to the diagnostics)


def token_sums(old: np.ndarray, rollout: np.ndarray, log_ratio: np.ndarray, abs_log_ratio: np.ndarray,
               ratio: np.ndarray, ratio_sq: np.ndarray, lengths: np.ndarray, keep: np.ndarray, offsets: np.ndarray,
               fill_log_ratio: float, tail: float, slope_scale: float, slope_bins: int) -> TokenSums:
    """Every sum of TokenSums in one sweep of the chunk (float32 valid tokens, `lengths` of them per row; `keep`
    flags the valid positions, `offsets` the rows' position offsets)."""
    kernel = _kernel()
    assert kernel is not None and old.dtype == np.float32
    with np.errstate(over="ignore"):  # numpy's SIMD exp, several times numba's scalar one; inf past float32
        exp_abs, exp_old, exp_rollout = np.exp(abs_log_ratio), np.exp(old), np.exp(rollout)
    widths = offsets[1:] - offsets[:-1]
    bins = -(-int(widths.max()) // POSITION_BIN) if widths.size else 0
    sketch = np.zeros(SKETCH_SIZE, dtype=np.int64)
    octaves = np.zeros((4, OCTAVES), dtype=np.float64)
    slopes = np.zeros(slope_bins, dtype=np.int64)
    position_sums = np.zeros(bins, dtype=np.float64)
    position_tokens = np.zeros(bins, dtype=np.int64)
    sums = np.zeros(len(SUMS), dtype=np.float64)
    continues = np.ones(old.size, dtype=bool)
    continues[(np.cumsum(lengths) - lengths)[lengths > 0]] = False  # each row's first valid token
    f32 = np.float32
    kernel(old, rollout, log_ratio, log_ratio.view(np.uint32), ratio, ratio_sq, exp_abs, exp_old, exp_rollout,
           continues, keep, offsets.astype(np.int64, copy=False), abs_log_ratio, f32(fill_log_ratio), f32(-tail),
           f32(slope_scale), f32(slope_bins - 1), sketch, octaves, slopes, position_sums, position_tokens, sums)
    if math.isnan(sums[SUMS.index("abs_d")]):  # numpy's max propagates NaN (exp overflowing on both sides)
        sums[SUMS.index("max_abs_d")] = math.nan
    return TokenSums(sums=dict(zip(SUMS, sums.tolist(), strict=True)), sketch=torch.from_numpy(sketch),
                     octaves=torch.from_numpy(octaves), slopes=torch.from_numpy(slopes.astype(np.float64)),
                     position_sums=torch.from_numpy(position_sums), position_tokens=torch.from_numpy(position_tokens))


SEGMENT_SUMS = ("old", "rollout", "log_ratio", "abs_log_ratio", "ratio_safe", "ratio_safe_sq", "k3")


def segment_sums(old: np.ndarray, rollout: np.ndarray, ratio_safe: np.ndarray, ratio_safe_sq: np.ndarray,
                 k3: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float64 [rows, SEGMENT_SUMS]: per row (`lengths` consecutive float32 tokens) the sums of old, rollout,
    old - rollout, its magnitude, the safe ratio, its square and k3, in one pass."""
    kernels = _kernels()
    assert kernels is not None
    out = np.zeros((lengths.size, len(SEGMENT_SUMS)), dtype=np.float64)
    kernels["segments"](old, rollout, ratio_safe, ratio_safe_sq, k3, lengths.astype(np.int64, copy=False), out)
    return out


@cache
def _thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="mismatch-sweep")


def start(*arguments: Any) -> Future[TokenSums]:
    """`token_sums(*arguments)` on the sweep's own thread (the kernel releases the GIL), as a future."""
    return _thread().submit(token_sums, *arguments)


def _sweep_signature(types: Any) -> Any:
    vector = types.Array
    f32, i64, f64 = vector(types.float32, 1, "C"), vector(types.int64, 1, "C"), vector(types.float64, 1, "C")
    return types.void(f32, f32, f32, vector(types.uint32, 1, "C"), f32, f32, f32, f32, f32,
                      vector(types.boolean, 1, "C"), vector(types.boolean, 1, "C"), i64, f32, types.float32,
                      types.float32, types.float32, types.float32, i64, vector(types.float64, 2, "C"), i64, f64, i64,
                      f64)


def _segments_signature(types: Any) -> Any:
    f32 = types.Array(types.float32, 1, "C")
    return types.void(f32, f32, f32, f32, f32, types.Array(types.int64, 1, "C"), types.Array(types.float64, 2, "C"))


def _segments(old, rollout, ratio, ratio_sq, k3, lengths, out) -> None:  # noqa: ANN001
    # Each row's inner loop is a plain reduction that LLVM vectorizes (reassociated float64 sums of float32
    # terms); old - rollout is taken in float32, as the chunk's log_ratio is.
    start = 0
    for row in range(lengths.shape[0]):
        end = start + lengths[row]
        s_o = s_r = s_d = s_a = s_q = s_q2 = s_k = 0.0
        for t in range(start, end):
            o = old[t]
            r = rollout[t]
            d = o - r
            s_o += o
            s_r += r
            s_d += d
            s_a += abs(d)
            s_q += ratio[t]
            s_q2 += ratio_sq[t]
            s_k += k3[t]
        out[row, 0] = s_o
        out[row, 1] = s_r
        out[row, 2] = s_d
        out[row, 3] = s_a
        out[row, 4] = s_q
        out[row, 5] = s_q2
        out[row, 6] = s_k
        start = end


def _sweep(old, rollout, log_ratio, bits, ratio, ratio_sq, exp_abs, exp_old, exp_rollout, continues, keep,  # noqa: ANN001, PLR0913, PLR0915
           offsets, abs_log_ratio, fill, below, scale, top, sketch, octaves, slopes, position_sums,
           position_tokens, sums) -> None:
    # Three loops: the token sums (branch-free, so that LLVM vectorizes them: float64 sums of float32 terms,
    # reassociated), the histograms in token order, the position profile over positions. Token t is the t-th
    # valid position; continues[t]: token t - 1 is in t's row (the pair the fills and shift residuals read).
    n = old.shape[0]
    s_exp = 0.0
    s_x = s_p = s_xx = s_xp = s_pp = s_abs_p = 0.0
    oo = rr = o_r = 0.0
    negative = equal = zero_o_n = zero_r_n = 0
    max_abs_p = 0.0
    for t in range(n):
        o = old[t]
        r = rollout[t]
        negative += log_ratio[t] < 0
        s_exp += exp_abs[t]
        x = exp_old[t]
        p = x - exp_rollout[t]
        s_x += x
        s_p += p
        s_xx += x * x
        s_xp += x * p
        s_pp += p * p
        s_abs_p += abs(p)
        equal += o == r
        zero_o_n += (o == 0) & (r != 0)
        zero_r_n += (r == 0) & (o != 0)
        oo += o * o
        rr += r * r
        o_r += o * r
    rep_o_n = rep_r_n = fill_o_n = fill_r_n = 0
    aligned = forward = backward = 0.0
    if n:  # token 0 starts its row: a zero fill at most
        far = abs(log_ratio[0]) > fill
        fill_o_n += (old[0] == 0) & (rollout[0] != 0) & far
        fill_r_n += (rollout[0] == 0) & (old[0] != 0) & far
    for t in range(1, n):
        o = old[t]
        r = rollout[t]
        po = old[t - 1]
        pr = rollout[t - 1]
        pair = continues[t]
        rep_o = pair & (o == po)
        rep_r = pair & (r == pr)
        fill_o = rep_o & ~rep_r
        fill_r = rep_r & ~rep_o
        far = abs(log_ratio[t]) > fill
        rep_o_n += fill_o
        rep_r_n += fill_r
        fill_o_n += (((o == 0) & (r != 0)) | fill_o) & far
        fill_r_n += (((r == 0) & (o != 0)) | fill_r) & far
        e = log_ratio[t - 1]
        aligned += e * e if pair else 0.0
        e = po - r
        forward += e * e if pair else 0.0
        e = o - pr
        backward += e * e if pair else 0.0
    for t in range(n):
        b = bits[t]
        sketch[(b >> SHIFT) & (SKETCH_SIZE - 1)] += 1
        k = b >> OCTAVE_SHIFT
        octaves[0, k] += 1.0
        octaves[1, k] += ratio_sq[t]
        octaves[2, k] += ratio[t]
        octaves[3, k] += exp_abs[t]
        max_abs_p = max(max_abs_p, abs(exp_old[t] - exp_rollout[t]))  # here: a max would stop the vectorizing
        o = old[t]
        tail = o < below  # a stand-in divisor off the tail keeps the index finite (valid tokens are finite)
        slope = rollout[t] / (o if tail else below) * scale
        slopes[int(min(max(slope, np.float32(0.0)), top))] += tail
    t = 0
    for row in range(offsets.shape[0] - 1):
        begin = offsets[row]
        for piece in range(begin, offsets[row + 1], POSITION_BIN):
            piece_sum = 0.0
            piece_tokens = 0
            for position in range(piece, min(piece + POSITION_BIN, offsets[row + 1])):
                if keep[position]:
                    piece_sum += abs_log_ratio[t]
                    piece_tokens += 1
                    t += 1
            at = (piece - begin) // POSITION_BIN
            position_sums[at] += piece_sum
            position_tokens[at] += piece_tokens
    values = (float(negative), s_exp, s_x, s_p, s_xx, s_xp, s_pp, s_abs_p, max_abs_p, float(equal),
              float(zero_o_n), float(rep_o_n), float(fill_o_n), float(zero_r_n), float(rep_r_n), float(fill_r_n),
              oo, rr, o_r, aligned, forward, backward)
    for i in range(len(values)):
        sums[i] = values[i]


__all__ = ["SEGMENT_SUMS", "SUMS", "TokenSums", "cache_dir", "forced", "segment_sums", "start", "token_sums", "wanted",
           "worth_it"]
