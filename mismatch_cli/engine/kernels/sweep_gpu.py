"""The fused GPU sweep: Triton kernels that take in a few launches what many torch kernels over a chunk took.

The same sums as the fused CPU sweep (engine/kernels/sweep.py), on the device and with no host read: `token_sums`
takes every per-token sum, count and histogram the diagnostics and the signatures need (one kernel; the
float sums as float64 partials per block of tokens, reduced in one more kernel, so they never depend on the
order blocks run in; the histograms by atomic adds, whose float64 octave sums may differ in their last bits
from run to run); `segment_sums` takes the row sums and totals most accumulators share (one kernel, a
program per row). Triton ships with CUDA builds of torch and is imported
only when a float32 chunk is on a GPU. Exponentials and divisions go through libdevice (correctly rounded
division, the exp torch's CUDA kernels use), never Triton's fast approximations. `MISMATCH_FUSED=0` turns it
off; `interpreted()` runs the kernels in Triton's interpreter on the CPU (tests: CI has no GPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch

from mismatch_cli.engine.kernels.ops import F64, numpy_kernels
from mismatch_cli.engine.kernels.sketch import SHIFT
from mismatch_cli.engine.kernels.sweep import SEGMENT_SUMS, SUMS, TokenSums
from mismatch_cli.engine.kernels.sweep_kernels import OCTAVE_SHIFT, OCTAVES, SKETCH_SIZE

BLOCK = 1024  # tokens per program of the token kernel
ROW_BLOCK = 512  # tokens per step of a row's program in the segment kernel
_INTERPRET: list[bool] = [False]
_FAILED: list[Exception] = []  # the launch error that turned the sweep off for this process, if any
_MAX = SUMS.index("max_abs_d")
# Triton's language modules and the kernels' helpers, set by `_kernels`: Triton is imported only there, after
# TRITON_INTERPRET is set where asked (its own jitted functions read it at import), and a kernel calls only
# jitted functions.
tl: Any = None
constexpr: Any = None  # Triton's mark of a compile-time parameter, named bare: its interpreter reads the name
libdevice: Any = None
_exp: Any = None
_div: Any = None
_sum64: Any = None
_count: Any = None
_row_sums: Any = None


@contextmanager
def interpreted() -> Iterator[None]:
    """Run the kernels in Triton's interpreter, on CPU tensors too (for tests; slow)."""
    before = _INTERPRET[0]
    _INTERPRET[0] = True
    try:
        yield
    finally:
        _INTERPRET[0] = before


def wanted(values: torch.Tensor) -> bool:
    """Whether a chunk's token sums come from the GPU sweep: float32 on a GPU (or interpreted), Triton present,
    and no earlier launch failed in this process."""
    if values.dtype != torch.float32 or os.environ.get("MISMATCH_FUSED", "1") == "0" or _FAILED:
        return False
    if not (values.is_cuda or (_INTERPRET[0] and not numpy_kernels(values))):
        return False
    return _kernels(_INTERPRET[0]) is not None


def give_up(error: Exception) -> None:
    """Stop using the GPU sweep for the rest of the process after `error` (a GPU or Triton it cannot compile
    for, say), and say so once on stderr; torch's passes give the same numbers."""
    if not _FAILED:
        _FAILED.append(error)
        logging.getLogger(__name__).warning(
            f"mismatch: the fused GPU sweep is unavailable ({type(error).__name__}: {str(error).splitlines()[0]}); "
            "using torch's kernels")


@cache
def _kernels(interpret: bool) -> dict[str, Any] | None:
    """The jitted kernels (compiled by Triton on first launch, cached on disk by Triton), or None without it."""
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language
        from triton.language.extra import libdevice as device_library
    except ImportError:  # CPU builds of torch come without Triton
        return None
    globals()["tl"], globals()["libdevice"] = triton.language, device_library
    globals()["constexpr"] = triton.language.constexpr
    helpers = (_exp_interpreted, _div_interpreted) if interpret else (_exp_libdevice, _div_libdevice)
    named = zip(("_exp", "_div", "_sum64", "_count", "_row_sums"), (*helpers, _sum64_of, _count_of, _row_sums_of),
                strict=True)
    for name, function in named:
        globals()[name] = triton.jit(function)
    # Sizes are not specialized on (Triton would compile a variant per divisibility of n by 16).
    return {"tokens": triton.jit(_token_kernel, do_not_specialize=["n"]),
            "segments": triton.jit(_segment_kernel, do_not_specialize=["rows"]),
            "segments_interpreted": triton.jit(_segment_kernel_interpreted), "cdiv": triton.cdiv}


def token_sums(old: torch.Tensor, rollout: torch.Tensor, ratio: torch.Tensor, ratio_sq: torch.Tensor,
               lengths: torch.Tensor, fill_log_ratio: float, tail: float, slope_scale: float,
               slope_bins: int) -> TokenSums:
    """Every sum of TokenSums but the position profile, on the device, without a host read (float32 valid
    tokens, `lengths` of them per row)."""
    kernels = _kernels(_INTERPRET[0])
    assert kernels is not None and old.dtype == torch.float32
    n, device = old.numel(), old.device
    programs = max(kernels["cdiv"](n, BLOCK), 1)
    starts = torch.zeros(n + 1, dtype=torch.int8, device=device)
    starts.index_fill_(0, torch.cumsum(lengths, 0) - lengths, 1)  # an empty row's start is the next row's (or n)
    partials = torch.zeros((programs, len(SUMS)), dtype=F64, device=device)
    sketch = torch.zeros(SKETCH_SIZE, dtype=torch.int32, device=device)
    octaves = torch.zeros((4, OCTAVES), dtype=F64, device=device)
    slopes = torch.zeros(slope_bins, dtype=torch.int32, device=device)
    kernels["tokens"][(programs,)](old, rollout, ratio, ratio_sq, starts, partials, sketch, octaves, slopes, n,
                                   float(fill_log_ratio), float(-tail), float(slope_scale), float(slope_bins - 1),
                                   len(SUMS), SHIFT, SKETCH_SIZE - 1, OCTAVE_SHIFT, OCTAVES, _MAX, BLOCK=BLOCK)
    sums = partials.sum(0)
    largest = partials[:, _MAX].max()
    # numpy's max propagates NaN (exp overflowing on both sides), as the sum of |d| then does.
    sums[_MAX] = torch.where(torch.isnan(sums[SUMS.index("abs_d")]), sums[SUMS.index("abs_d")], largest)
    return TokenSums(sums=dict(zip(SUMS, sums.unbind(), strict=True)), sketch=sketch.to(torch.int64),
                     octaves=octaves, slopes=slopes.to(F64), position_sums=None, position_tokens=None)


def segment_sums(old: torch.Tensor, rollout: torch.Tensor, ratio: torch.Tensor, ratio_sq: torch.Tensor,
                 k3: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """float64 [SEGMENT_SUMS, rows]: per row (`lengths` consecutive float32 tokens) the sums of old, rollout,
    old - rollout, its magnitude, the safe ratio, its square and k3, one program per row."""
    kernels = _kernels(_INTERPRET[0])
    assert kernels is not None
    rows = lengths.numel()
    out = torch.zeros((len(SEGMENT_SUMS), rows), dtype=F64, device=old.device)
    if rows:
        starts = torch.cumsum(lengths, 0) - lengths
        arguments = (old, rollout, ratio, ratio_sq, k3, starts, lengths, out, rows)
        if _INTERPRET[0]:
            most = -(-int(lengths.max()) // ROW_BLOCK)
            kernels["segments_interpreted"][(rows,)](*arguments, BLOCK=ROW_BLOCK, MOST=most)
        else:
            kernels["segments"][(rows,)](*arguments, BLOCK=ROW_BLOCK)
    return out


def _exp_libdevice(x):  # noqa: ANN001, ANN202
    return libdevice.exp(x)


def _div_libdevice(a, b):  # noqa: ANN001, ANN202
    return libdevice.div_rn(a, b)


def _exp_interpreted(x):  # noqa: ANN001, ANN202
    return tl.exp(x)


def _div_interpreted(a, b):  # noqa: ANN001, ANN202
    return a / b


def _sum64_of(values, mask):  # noqa: ANN001, ANN202
    return tl.sum(tl.where(mask, values, 0.0).to(tl.float64), axis=0)


def _count_of(flags):  # noqa: ANN001, ANN202
    return tl.sum(flags.to(tl.int32), axis=0).to(tl.float64)


def _token_kernel(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, start_ptr, partial_ptr, sketch_ptr,  # noqa: ANN001, ANN202, PLR0913
                  octave_ptr, slope_ptr, n, fill, below, scale, top, K: constexpr, SHIFT: constexpr,
                  SKETCH_MASK: constexpr, OCTAVE_SHIFT: constexpr, OCTAVES: constexpr,
                  MAX: constexpr, BLOCK: constexpr):
    # Token t's pair is (t - 1, t) when both are in one row (start[t] == 0); products and differences are
    # float32, as the torch and numpy passes take them, and summed in float64.
    pid = tl.program_id(0)
    t = pid * BLOCK + tl.arange(0, BLOCK)
    m = t < n
    o = tl.load(old_ptr + t, mask=m, other=0.0)
    r = tl.load(rollout_ptr + t, mask=m, other=0.0)
    q = tl.load(ratio_ptr + t, mask=m, other=0.0)
    q2 = tl.load(ratio_sq_ptr + t, mask=m, other=0.0)
    d = o - r
    ea = _exp(tl.abs(d))
    x = _exp(o)
    p = x - _exp(r)
    out = partial_ptr + pid * K  # in sweep.SUMS's order (a test compares them with the CPU sweep by name)
    tl.store(out + 0, _count(m & (d < 0)))
    tl.store(out + 1, _sum64(ea, m))
    tl.store(out + 2, _sum64(x, m))
    tl.store(out + 3, _sum64(p, m))
    tl.store(out + 4, _sum64(x * x, m))
    tl.store(out + 5, _sum64(x * p, m))
    tl.store(out + 6, _sum64(p * p, m))
    tl.store(out + 7, _sum64(tl.abs(p), m))
    tl.store(out + MAX, tl.max(tl.where(m, tl.abs(p), 0.0), axis=0).to(tl.float64))
    tl.store(out + 9, _count(m & (o == r)))
    zero_o = m & (o == 0) & (r != 0)
    zero_r = m & (r == 0) & (o != 0)
    has_pair = m & (t > 0)
    po = tl.load(old_ptr + t - 1, mask=has_pair, other=0.0)
    pr = tl.load(rollout_ptr + t - 1, mask=has_pair, other=0.0)
    pair = has_pair & (tl.load(start_ptr + t, mask=m, other=1) == 0)
    rep_o = pair & (o == po)
    rep_r = pair & (r == pr)
    fill_o = rep_o & (rep_r == 0)
    fill_r = rep_r & (rep_o == 0)
    far = tl.abs(d) > fill
    tl.store(out + 10, _count(zero_o))
    tl.store(out + 11, _count(fill_o))
    tl.store(out + 12, _count((zero_o | fill_o) & far))
    tl.store(out + 13, _count(zero_r))
    tl.store(out + 14, _count(fill_r))
    tl.store(out + 15, _count((zero_r | fill_r) & far))
    tl.store(out + 16, _sum64(o * o, m))
    tl.store(out + 17, _sum64(r * r, m))
    tl.store(out + 18, _sum64(o * r, m))
    e = po - pr
    tl.store(out + 19, _sum64(e * e, pair))
    e = po - r
    tl.store(out + 20, _sum64(e * e, pair))
    e = o - pr
    tl.store(out + 21, _sum64(e * e, pair))
    bits = d.to(tl.uint32, bitcast=True)
    tl.atomic_add(sketch_ptr + ((bits >> SHIFT) & SKETCH_MASK).to(tl.int32), 1, mask=m)
    k = (bits >> OCTAVE_SHIFT).to(tl.int32)
    tl.atomic_add(octave_ptr + k, tl.full([BLOCK], 1.0, tl.float64), mask=m)
    tl.atomic_add(octave_ptr + OCTAVES + k, q2.to(tl.float64), mask=m)
    tl.atomic_add(octave_ptr + 2 * OCTAVES + k, q.to(tl.float64), mask=m)
    tl.atomic_add(octave_ptr + 3 * OCTAVES + k, ea.to(tl.float64), mask=m)
    tail = m & (o < below)
    slope = _div(r, tl.where(tail, o, below)) * scale  # the stand-in divisor off the tail keeps it finite
    at = tl.minimum(tl.maximum(slope, 0.0), top).to(tl.int32)
    tl.atomic_add(slope_ptr + at, 1, mask=tail)


def _segment_kernel(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, k3_ptr, start_ptr, length_ptr, out_ptr,  # noqa: ANN001, ANN202
                    rows, BLOCK: constexpr):
    # Each row's program loops over its own tokens.
    row = tl.program_id(0)
    start = tl.load(start_ptr + row)
    length = tl.load(length_ptr + row)
    _row_sums(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, k3_ptr, out_ptr, rows, row, start, start + length,
              tl.cdiv(length, BLOCK), BLOCK)


def _segment_kernel_interpreted(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, k3_ptr, start_ptr, length_ptr,  # noqa: ANN001, ANN202
                                out_ptr, rows, BLOCK: constexpr, MOST: constexpr):
    # Triton's interpreter (on numpy 2) cannot loop to a bound it loaded: every row loops over MOST blocks.
    row = tl.program_id(0)
    start = tl.load(start_ptr + row)
    _row_sums(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, k3_ptr, out_ptr, rows, row, start,
              start + tl.load(length_ptr + row), MOST, BLOCK)


def _row_sums_of(old_ptr, rollout_ptr, ratio_ptr, ratio_sq_ptr, k3_ptr, out_ptr, rows, row, start, end, blocks,  # noqa: ANN001, ANN202
                 BLOCK: constexpr):
    s_o = tl.zeros([BLOCK], dtype=tl.float64)
    s_r = tl.zeros([BLOCK], dtype=tl.float64)
    s_d = tl.zeros([BLOCK], dtype=tl.float64)
    s_a = tl.zeros([BLOCK], dtype=tl.float64)
    s_q = tl.zeros([BLOCK], dtype=tl.float64)
    s_q2 = tl.zeros([BLOCK], dtype=tl.float64)
    s_k = tl.zeros([BLOCK], dtype=tl.float64)
    for block in range(0, blocks):
        t = start + block * BLOCK + tl.arange(0, BLOCK)
        m = t < end
        o = tl.load(old_ptr + t, mask=m, other=0.0)
        r = tl.load(rollout_ptr + t, mask=m, other=0.0)
        d = o - r
        s_o += o.to(tl.float64)
        s_r += r.to(tl.float64)
        s_d += d.to(tl.float64)
        s_a += tl.abs(d).to(tl.float64)
        s_q += tl.load(ratio_ptr + t, mask=m, other=0.0).to(tl.float64)
        s_q2 += tl.load(ratio_sq_ptr + t, mask=m, other=0.0).to(tl.float64)
        s_k += tl.load(k3_ptr + t, mask=m, other=0.0).to(tl.float64)
    tl.store(out_ptr + row, tl.sum(s_o, axis=0))
    tl.store(out_ptr + rows + row, tl.sum(s_r, axis=0))
    tl.store(out_ptr + 2 * rows + row, tl.sum(s_d, axis=0))
    tl.store(out_ptr + 3 * rows + row, tl.sum(s_a, axis=0))
    tl.store(out_ptr + 4 * rows + row, tl.sum(s_q, axis=0))
    tl.store(out_ptr + 5 * rows + row, tl.sum(s_q2, axis=0))
    tl.store(out_ptr + 6 * rows + row, tl.sum(s_k, axis=0))


__all__ = ["give_up", "interpreted", "segment_sums", "token_sums", "wanted"]
