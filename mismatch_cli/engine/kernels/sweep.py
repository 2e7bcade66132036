"""The fused CPU sweep: numba kernels that take in one pass what many numpy passes over a chunk took.

`layout` lays a chunk out (quality flags, valid tokens, rounds, compaction). `token_sums` takes every
per-token sum, count and histogram the diagnostics and the signatures need, on its own thread (`start`;
the kernels release the GIL) while the other accumulators fold the chunk. `segment_sums` takes the row
sums and totals most accumulators share, with the derived per-token tensors. `option_sums`, `is_weights`,
`round_sketches` and `candidates` serve RS, IS, the rounds and the what-if ladder. numba is imported only
for inputs that repay its start-up (`worth_it`), and each kernel is compiled the first time a run needs
it, once, into the user's cache folder, so `--help`, small dumps and the readers never import it. The
numpy passes stay the reference and the path everywhere else (a GPU, float64, numba missing, small
inputs). Counts, sketches and histograms are identical to theirs; float sums are float64 sums in another
order (vectorized), equal to float64 rounding. float32 only: differences, products and comparisons are
taken in float32, as numpy and torch take them.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.kernels import sweep_kernels
from mismatch_cli.engine.kernels.ops import numpy_kernels
from mismatch_cli.engine.kernels.sketch import NUM_BUCKETS
from mismatch_cli.engine.kernels.sweep_kernels import KERNELS, OCTAVE_SHIFT, OCTAVES, POSITION_BIN, SKETCH_SIZE

# A process pays ~0.4 s to import numba and load the cached kernel, which the sweep repays (about 9 ns a token) on
# inputs of this many bytes (~35M tokens of a float32 parquet dump); the decision is by input, never by chunk or
# by what the process ran before, so one input always gives the same numbers.
MIN_INPUT_BYTES = 1 << 28
_VERSION = 18  # bump with any change to a kernel, so that the first run after an upgrade says it compiles

# The sums of old, rollout, the log-ratio, its magnitude, the safe ratio and its square are not here: the row-sum
# kernel (SEGMENT_SUMS) takes them, and the accumulators read its totals (Chunk.total).
SUMS = ("negative", "sum_exp_abs",  # diagnostics
        "x", "d", "xx", "xd", "dd", "abs_d", "max_abs_d",  # diagnostics' probability-space pair
        "bitwise_equal", "zero_old", "repeat_old", "fill_old", "zero_rollout", "repeat_rollout", "fill_rollout",
        "old_sq", "rollout_sq", "old_rollout", "shift_aligned", "shift_forward", "shift_backward")  # signatures
_FORCED: list[bool | None] = [None]
_INLINE = [False]  # token_sums on the caller's thread (see `inline`)
_COMPILING = threading.Lock()


def cache_dir() -> Path:
    """Where the compiled kernel is kept: $MISMATCH_CACHE_DIR, else $XDG_CACHE_HOME/mismatch, else ~/.cache/mismatch."""
    base = os.environ.get("MISMATCH_CACHE_DIR")
    if base:
        return Path(base) / "numba"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mismatch" / "numba"


@contextmanager
def _holding(setting: list[Any], value: Any) -> Iterator[None]:
    """Hold a module setting (a one-element list) at `value` for the block, then restore it."""
    before = setting[0]
    setting[0] = value
    try:
        yield
    finally:
        setting[0] = before


def forced(on: bool) -> AbstractContextManager[None]:
    """Use the sweep for every float32 CPU chunk (on) or never (off), whatever its size (for tests and benches)."""
    return _holding(_FORCED, on)


def inline(on: bool) -> AbstractContextManager[None]:
    """While on, `start` runs the token sweep on the caller's thread: where processes already fill the cores
    (`--jobs N` with N the usable cores), a thread more per process only makes them take turns."""
    return _holding(_INLINE, on)


@cache
def _numba() -> Any | None:
    """numba, imported with its disk cache in ours, or None where it is missing or MISMATCH_FUSED=0."""
    if os.environ.get("MISMATCH_FUSED", "1") == "0":
        return None
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir()))
        import numba
    except (ImportError, OSError):
        return None
    return numba


def available() -> bool:
    """Whether the fused kernels can run here (numba is installed and not switched off)."""
    return _numba() is not None


@cache
def _compiled(name: str) -> Any:
    """One kernel, compiled the first time a caller that `wanted` sent here needs it (later runs: from the disk
    cache), so that a run compiles and loads only the kernels its configuration uses."""
    numba = _numba()
    assert numba is not None
    with _COMPILING:  # the sweep's thread and the main one may both compile: one at a time, one line said
        marker = cache_dir() / f"{name}-{numba.__version__}-{_VERSION}"
        if not marker.exists():
            _say_compiling()
        function, signature = KERNELS[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unwritable cache folder: compile in memory, every run
            # reassoc lets LLVM reorder the float64 sums only; each token's float32 arithmetic stays as written
            # (the bit-for-bit tests pin it). Not for STRICT_ORDER kernels (sweep_kernels.py says why).
            fastmath = False if name in sweep_kernels.STRICT_ORDER else {"reassoc"}
            kernel = numba.njit(signature(numba.types), cache=True, nogil=True, fastmath=fastmath)(function)
        try:
            marker.touch()
        except OSError:
            pass
    return kernel


# What every fused run calls; "option" (token-level RS) and "weights" (token-level IS) only when configured.
ALWAYS = ("layout", "segments", "sweep", "round_sketches", "candidates")


def kernels_for(rejection: bool, importance: bool) -> tuple[str, ...]:
    """The kernels a fused run calls: ALWAYS, "option" with an RS option, "weights" with token-level IS."""
    return (*ALWAYS, *(("option",) if rejection else ()), *(("weights",) if importance else ()))


def preload(names: tuple[str, ...] = tuple(KERNELS)) -> None:
    """Load those fused kernels already in the disk cache (none is compiled here), so that worker processes forked
    afterwards start with them: importing numba costs about 0.25 s of CPU a process, and each kernel's load 0.05 s."""
    numba = _numba()
    if numba is None:
        return
    for name in names:
        if (cache_dir() / f"{name}-{numba.__version__}-{_VERSION}").exists():
            _compiled(name)


@cache
def _say_compiling() -> None:
    """One line on stderr, once a process (without a handler, logging's last resort prints it; -q silences it)."""
    logging.getLogger(__name__).warning(f"mismatch: compiling the fused CPU sweep once (cached in {cache_dir()})")


def worth_it(input_bytes: int) -> bool:
    """Whether an input of this many bytes should take the sweep (MIN_INPUT_BYTES; MISMATCH_FUSED=always: any)."""
    return input_bytes >= MIN_INPUT_BYTES or os.environ.get("MISMATCH_FUSED") == "always"


def wanted(values: torch.Tensor, asked: bool) -> bool:
    """Whether a chunk takes the fused kernels (layout, sums, IS, RS, rounds, what-if): float32 on numpy's CPU
    path, when `asked` (or forced)."""
    use = asked if _FORCED[0] is None else _FORCED[0]
    return use and values.dtype == torch.float32 and numpy_kernels(values) and available()


@dataclass
class TokenSums:
    """One chunk's token sums (SUMS), sketch counts of delta, signed |delta| octaves, tail slopes, position bins."""

    sums: dict[str, float] | dict[str, torch.Tensor]  # floats, or 0-d float64 device tensors (sweep_gpu.py)
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
    kernel = _compiled("sweep")
    assert old.dtype == np.float32
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


DERIVED = ("abs_log_ratio", "ratio_safe", "ratio_safe_sq", "k3")


def segment_sums(old: np.ndarray, rollout: np.ndarray, ratio: np.ndarray, low: float, high: float,
                 lengths: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """float64 [segments, SEGMENT_SUMS] sums per segment (`lengths` consecutive float32 tokens) of old, rollout,
    old - rollout, its magnitude, the ratio clamped to [low, high], its square and k3 = ratio - (old - rollout) - 1,
    with those per-token float32 tensors (DERIVED) as torch computes them, in one pass."""
    out = np.zeros((lengths.size, len(SEGMENT_SUMS)), dtype=np.float64)
    derived = {name: np.empty(old.size, dtype=np.float32) for name in DERIVED}
    kernel = _compiled("segments")
    kernel(old, rollout, ratio, np.float32(low), np.float32(high), lengths.astype(np.int64, copy=False),
           *derived.values(), out)
    return out, derived


OPTION_SUMS = ("sum", "sum_c", "sum_c_sq", "count_high", "count_low", "rejected_tokens", "max", "min")


@dataclass(frozen=True)
class OptionSums:
    """A token-level RS option over a chunk: its totals (OPTION_SUMS) and what RS needs per row and token."""

    sums: dict[str, float]
    row_sums: torch.Tensor  # float64 [B]: the statistic summed over each row's tokens
    row_rejects: torch.Tensor  # int64 [B]: tokens the option rejects in each row
    reject: torch.Tensor  # bool [N]: the option rejects the token


def option_sums(stat: torch.Tensor, lengths: torch.Tensor, low: float, high: float, two_sided: bool) -> OptionSums:
    """A token-level RS option's sums in one pass over its float32 statistic (`lengths` tokens per row).

    A token is rejected above `high` (and below `low` when `two_sided`); the clamp is to [low, high].
    """
    rows = lengths.numel()
    row_sums, row_rejects = np.zeros(rows, dtype=np.float64), np.zeros(rows, dtype=np.int64)
    reject = np.empty(stat.numel(), dtype=bool)
    sums = np.zeros(len(OPTION_SUMS), dtype=np.float64)
    kernel = _compiled("option")
    kernel(stat.numpy(), lengths.numpy().astype(np.int64, copy=False), np.float32(low), np.float32(high), two_sided,
           reject, row_sums, row_rejects, sums)
    return OptionSums(sums=dict(zip(OPTION_SUMS, sums.tolist(), strict=True)), row_sums=torch.from_numpy(row_sums),
                      row_rejects=torch.from_numpy(row_rejects), reject=torch.from_numpy(reject))


WEIGHT_SUMS = ("sum_w", "sum_w_sq", "count_high", "count_low", "count_oob", "max_w", "min_w")


def is_weights(raw: torch.Tensor, lengths: torch.Tensor, upper: float, lower: float | None, metric_lower: float,
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Token-level IS in one pass over the float32 raw ratios: the applied weights (TIS clamps at `upper`; with
    `lower`, IcePop zeroes those outside [lower, upper]), their float64 per-row sums and their totals (WEIGHT_SUMS)."""
    weight = np.empty(raw.numel(), dtype=np.float32)
    row_sums = np.zeros(lengths.numel(), dtype=np.float64)
    sums = np.zeros(len(WEIGHT_SUMS), dtype=np.float64)
    kernel = _compiled("weights")
    kernel(raw.numpy(), lengths.numpy().astype(np.int64, copy=False), np.float32(upper),
           np.float32(-np.inf if lower is None else lower), np.float32(metric_lower), lower is not None, weight,
           row_sums, sums)
    return torch.from_numpy(weight), torch.from_numpy(row_sums), dict(zip(WEIGHT_SUMS, sums.tolist(), strict=True))


def round_sketches(abs_log_ratio: torch.Tensor, run_tokens: torch.Tensor, run_index: torch.Tensor,
                   run_index_from_end: torch.Tensor, rounds: int, above: float,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int64 [rounds, NUM_BUCKETS] sketch counts of |delta| per round from the start and from the end, and each
    run's tokens with |delta| above the float32 `above` (int64 [runs]), in one pass."""
    from_start = np.zeros((rounds, NUM_BUCKETS), dtype=np.int64)
    from_end = np.zeros((rounds, NUM_BUCKETS), dtype=np.int64)
    over = np.empty(run_tokens.numel(), dtype=np.int64)
    kernel = _compiled("round_sketches")
    kernel(abs_log_ratio.numpy().view(np.int32), run_tokens.numpy().astype(np.int64, copy=False), run_index.numpy(),
           run_index_from_end.numpy(), np.array([above], dtype=np.float32).view(np.int32)[0], from_start, from_end,
           over)
    return torch.from_numpy(from_start), torch.from_numpy(from_end), torch.from_numpy(over)


# The data-quality categories (engine/core/quality.py says what each means), in the order the layout kernel writes
# their counts (sweep_kernels._layout's last lines).
QUALITY_CATEGORIES = ("nonfinite_tokens", "sentinel_tokens", "positive_logprob_tokens", "one_side_zero_tokens")
LAYOUT_COUNTS = ("num_valid", "num_runs", "max_rounds", "masked_tokens", *QUALITY_CATEGORIES)


@dataclass(frozen=True)
class FoundLayout:
    """A chunk's valid tokens, quality counts (LAYOUT_COUNTS) and rounds, found in one pass over its positions."""

    counts: dict[str, int]
    keep: np.ndarray  # bool [P]: a valid token
    starts: np.ndarray  # bool [P]: a run of 1s starts here
    lengths: np.ndarray  # int64 [B]: valid tokens per row
    rounds_per_row: np.ndarray  # int64 [B]
    run_start: np.ndarray  # int64 [G]: each run's first position
    run_row: np.ndarray  # int64 [G]
    run_index: np.ndarray  # int64 [G]: the run's round within its row
    run_tokens: np.ndarray  # int64 [G]: valid tokens in the run
    old: np.ndarray  # float32 [N]: the valid tokens' values, in order
    rollout: np.ndarray


def layout(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, offsets: np.ndarray, sentinel: float) -> FoundLayout:
    """A chunk's quality flags, valid tokens per row, rounds and compaction, from float32 positions, in one pass
    (for segments.lay_out); the counts come in LAYOUT_COUNTS' order, which the kernel's last lines follow."""
    positions, rows = mask.size, offsets.size - 1
    keep, starts = np.empty(positions, dtype=bool), np.empty(positions, dtype=bool)
    lengths, rounds = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)
    most_runs = (positions + 1) // 2 + rows  # never touched past the runs found, so never paid for
    run_start, run_row, run_index, run_tokens = (np.empty(most_runs, dtype=np.int64) for _ in range(4))
    old_out, rollout_out = np.empty(positions, dtype=np.float32), np.empty(positions, dtype=np.float32)
    counts = np.zeros(len(LAYOUT_COUNTS), dtype=np.int64)
    kernel = _compiled("layout")
    kernel(old, rollout, mask, offsets.astype(np.int64, copy=False), np.float32(sentinel), keep, starts, lengths,
           rounds, run_start, run_row, run_index, run_tokens, old_out, rollout_out, counts)
    found = dict(zip(LAYOUT_COUNTS, counts.tolist(), strict=True))
    runs, valid = found["num_runs"], found["num_valid"]
    return FoundLayout(found, keep, starts, lengths, rounds, run_start[:runs], run_row[:runs], run_index[:runs],
                       run_tokens[:runs], old_out[:valid], rollout_out[:valid])


def candidates(abs_log_ratio: torch.Tensor, ratio_safe: torch.Tensor, bound: float,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float32 tokens with |delta| above `bound` (int64 indices), and the float64 sums of the others' safe ratios
    and of their float32 squares (0-d tensors), in one pass."""
    index = np.empty(abs_log_ratio.numel(), dtype=np.int64)  # pages past the candidates are never touched
    rest = np.zeros(2, dtype=np.float64)
    found = _compiled("candidates")(abs_log_ratio.numpy(), ratio_safe.numpy(), np.float32(bound), index, rest)
    return torch.from_numpy(index[:found]), torch.tensor(rest[0]), torch.tensor(rest[1])


def start(*arguments: Any) -> Future[TokenSums]:
    """`token_sums(*arguments)` on a thread of its own (the kernel releases the GIL), as a future (done already
    under `inline`).

    A thread per chunk (about 0.1 ms), not a cached pool: a process forked by --jobs inherits a pool without its
    thread, and its futures would never complete.
    """
    future: Future[TokenSums] = Future()
    if _INLINE[0]:
        future.set_result(token_sums(*arguments))
        return future

    def run() -> None:
        try:
            future.set_result(token_sums(*arguments))
        except BaseException as error:  # noqa: BLE001 - handed to the waiting caller, which re-raises it
            future.set_exception(error)

    threading.Thread(target=run, daemon=True, name="mismatch-sweep").start()
    return future


__all__ = ["ALWAYS", "DERIVED", "LAYOUT_COUNTS", "OCTAVES", "OCTAVE_SHIFT", "POSITION_BIN", "SEGMENT_SUMS",
           "SKETCH_SIZE", "SUMS", "FoundLayout", "OptionSums", "TokenSums", "available", "cache_dir", "candidates",
           "forced", "inline", "is_weights", "kernels_for", "layout", "option_sums", "round_sketches", "segment_sums",
           "start", "token_sums", "wanted", "worth_it"]
