"""Turn a reader Batch into device tensors over its valid tokens, once per chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.correction import SAFETY_BOUND
from mismatch_cli.engine.core.formulas import chi2_seq_terms, chi2_token_terms
from mismatch_cli.engine.core.segments import Layout, Runs, lay_out
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels import sweep, sweep_gpu
from mismatch_cli.engine.kernels.ops import (
    MAX_CHUNK_POSITIONS,
    flag_indices,
    host_tensor,
    numpy_kernels,
    segment_count,
    segment_max,
    segment_sum,
    take,
    total,
)

# On a GPU a chunk costs more in kernel launches and Python than in kernels, so larger chunks go faster:
# with the host buffers of engine/core/staging.py, 2^24 positions measured 1.5-2.2x the throughput of 2^22 on an
# H200 (as fast as 2^25), with a peak of 1.9 GiB of GPU memory (bench/HISTORY.md).
DEVICE_CHUNK_POSITIONS = 1 << 24


@dataclass
class Chunk:
    """Valid tokens of a chunk, contiguous per row, with the per-row quantities every family shares.

    A token is valid when its mask is 1 and both log-probs are finite and above the sentinel
    bound; excluded tokens are counted in `quality` and then behave exactly like padding. Every
    tensor lives on the compute device; the host keeps only the reader's per-row metadata.
    """

    old: torch.Tensor  # [N_valid] compute dtype
    rollout: torch.Tensor  # [N_valid]
    lengths: torch.Tensor  # [B] int64 valid tokens per row
    quality: dict[str, int]
    offsets: np.ndarray | None = None  # [B+1] row offsets over positions (host, from the reader)
    source: str = ""  # the file the rows come from
    first_row: int = 0  # row index, within `source`, of the chunk's row 0
    # [B] int64 each row's index within `source` (Batch.row_numbers: scattered rows keep theirs)
    row_numbers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    sequence_ids: np.ndarray | None = None  # [B] id column values, when the dump has one
    steps: np.ndarray | None = None  # [B] training step per row, when known
    process_index: np.ndarray | None = None  # [B] rank of the trainer process that held each row, when known
    policy_versions: np.ndarray | None = None  # [B] float64 policy version (or lag) per row, NaN unknown
    version_kind: str = ""  # "version" or "lag", with policy_versions
    token_ids: np.ndarray | None = None  # [N_valid] int64 sampled token ids (host), when the dump has them
    layout: Layout | None = None  # where the valid tokens and rounds sit among the positions (chunk's device)
    # The raw positions (old, rollout, mask; device, input dtype) for a family that reads every masked-in
    # token whatever its value, as TRL does (a NaN rollout log-prob is a weight of 1 there, not an exclusion).
    positions: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    # The dump's per-token advantages (compute dtype) of the valid tokens, and of every position; None without.
    advantages: torch.Tensor | None = None
    position_advantages: torch.Tensor | None = field(default=None, repr=False)
    fused: bool = False  # take the per-token sums from the fused CPU sweep where it runs (engine/kernels/sweep.py)
    # Results several accumulators share, by name (e.g. the fused sweep's token sums, signatures.token_sums).
    shared: dict[str, Any] = field(default_factory=dict, repr=False)
    # Per-row sums already taken, by the id of the per-token tensor (kept alive with it).
    _row_sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    _totals: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    _run_sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    @cached_property
    def runs(self) -> Runs:
        """The chunk's rounds (maximal runs of 1s in each row's mask)."""
        assert self.layout is not None
        return self.layout.runs()

    @cached_property
    def masked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every masked-in token (mask 1, any value, sentinels and non-finite ones included), contiguous per row.

        (old, rollout) in the compute dtype, and the tokens per row (int64 [B]).
        """
        assert self.positions is not None and self.layout is not None
        old, rollout, mask = self.positions
        row_positions = self.layout.offsets[1:] - self.layout.offsets[:-1]
        lengths = segment_count(mask, row_positions)
        index = flag_indices(mask, self.quality["masked_tokens"])
        return take(old, index).to(self.old.dtype), take(rollout, index).to(self.old.dtype), lengths

    @cached_property
    def masked_advantages(self) -> torch.Tensor | None:
        """The advantages of every masked-in token, aligned with `masked` (None when the dump has none)."""
        if self.position_advantages is None:
            return None
        assert self.positions is not None
        index = flag_indices(self.positions[2], self.quality["masked_tokens"])
        return take(self.position_advantages, index).to(self.old.dtype)

    @property
    def num_rows(self) -> int:
        """Number of rows (sequences), empty ones included."""
        return int(self.lengths.numel())

    @property
    def num_tokens(self) -> int:
        """Number of valid tokens."""
        return int(self.old.numel())

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        """Unclamped token log-ratio log(pi_train / pi_rollout) = old - rollout."""
        return self.old - self.rollout

    @cached_property
    def ratio(self) -> torch.Tensor:
        """Unclamped token ratio exp(old - rollout) (may overflow to inf, as in verl's k3_kl)."""
        return torch.exp(self.log_ratio)

    @cached_property
    def abs_log_ratio(self) -> torch.Tensor:
        """|old - rollout| per token."""
        return self.log_ratio.abs()

    @cached_property
    def worst_token(self) -> torch.Tensor:
        """Index (a 1-element tensor) of the valid token with the largest |delta|, the first of equal maxima.

        One pass serves the diagnostics' max |delta| and the signatures' worst token. On the CPU numpy's
        argmax is ~20x torch's; on a device it stays there (no host read).
        """
        if numpy_kernels(self.abs_log_ratio):
            return torch.tensor([int(np.argmax(self.abs_log_ratio.numpy()))])
        return torch.argmax(self.abs_log_ratio).reshape(1)

    @cached_property
    def k3(self) -> torch.Tensor:
        """Per-token k3 estimator exp(d) - d - 1 with the unclamped d, as verl's `k3_kl` uses it."""
        return self.ratio - self.log_ratio - 1

    @cached_property
    def ratio_safe_sq(self) -> torch.Tensor:
        """Square of the safety-clamped ratio (verl's chi2_token summand)."""
        return chi2_token_terms(self.ratio_safe)

    @cached_property
    def row_ratio_safe_sq(self) -> torch.Tensor:
        """exp(2 clamp(S_i, -20, 20)) per row, float64 [B] (verl's chi2_seq summand; 1 for an empty row)."""
        return chi2_seq_terms(self.log_ratio_row_sum)

    @cached_property
    def log_ratio_safe(self) -> torch.Tensor:
        """Token log-ratio clamped to verl's safety bound [-20, 20]: on the host, `log_ratio` itself (its memos
        included) when no token reaches past the bound, as the clamp would then change nothing."""
        host = numpy_kernels(self.log_ratio)
        if host and (not self.num_tokens or bool(self.abs_log_ratio[self.worst_token] <= SAFETY_BOUND)):
            return self.log_ratio
        return self.log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)

    @cached_property
    def ratio_safe(self) -> torch.Tensor:
        """exp(clamp(log-ratio, -20, 20)), bit-identical to verl's, from the one exp of `ratio`."""
        low, high = _safe_ratio_bounds(self.old.dtype, self.old.device)
        return self.ratio.clamp(low, high)

    @cached_property
    def row_tokens(self) -> torch.Tensor:
        """Valid tokens per row, float64 [B] (0 for an empty row)."""
        return self.lengths.to(F64)

    @cached_property
    def row_valid(self) -> torch.Tensor:
        """Rows with at least one valid token, bool [B]."""
        return self.lengths > 0

    @cached_property
    def row_denominator(self) -> torch.Tensor:
        """verl's masked_mean denominator per row: count + 1e-8."""
        return self.row_tokens + 1e-8

    @cached_property
    def log_ratio_row_sum(self) -> torch.Tensor:
        """S_i: per-row sum of the unclamped log-ratio, float64 [B]."""
        return self.row_sum(self.log_ratio)

    def fuse_row_sums(self) -> None:
        """Take the row sums and totals of old, rollout, the log-ratio, its magnitude, the safe ratio, its square
        and k3 in one fused pass (engine/kernels/sweep.py, which on the CPU also yields the last four; on a GPU
        engine/kernels/sweep_gpu.py), for `row_sum` and `total`."""
        if sweep_gpu.wanted(self.old):
            inputs = (self.old, self.rollout, self.ratio_safe, self.ratio_safe_sq, self.k3)
            rows = sweep_gpu.segment_sums(*inputs, self.lengths)  # [columns, B] on the device
            by_run = None
        else:
            # Multi-turn: the sums per round, which the rounds read, then per row as sums of its rounds.
            # The host knows the most rounds a row holds (the layout's count): no rounds built to ask it.
            runs = self.runs if self.layout is not None and int(self.layout.max_rounds) > 1 else None
            low, high = (bound.item() for bound in _safe_ratio_bounds(self.old.dtype, self.old.device))
            segments = self.lengths if runs is None else runs.valid_tokens
            sums, derived = sweep.segment_sums(self.old.numpy(), self.rollout.numpy(), self.ratio.numpy(), low, high,
                                               segments.numpy())
            for name, values in derived.items():  # bit for bit torch's, so a tensor taken before stays as good
                self.__dict__.setdefault(name, torch.from_numpy(values))
            columns = torch.from_numpy(sums.T.copy())
            rows = columns if runs is None else torch.stack([segment_sum(c, runs.rounds_per_row) for c in columns])
            by_run = None if runs is None else columns
        tensors = (self.old, self.rollout, self.log_ratio, self.abs_log_ratio, self.ratio_safe, self.ratio_safe_sq,
                   self.k3)
        for values, row_sums, total_sum in zip(tensors, rows, rows.sum(1), strict=True):
            self.remember_row_sum(values, row_sums)
            self._totals[id(values)] = (values, total_sum)
        if by_run is not None:
            for values, run_sums in zip(tensors, by_run, strict=True):
                self._run_sums[id(values)] = (values, run_sums)

    def run_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-round (`runs`) float64 sum of per-token values, computed once per tensor."""
        def take() -> torch.Tensor:
            runs = self.runs
            if runs.max_per_row == 1:  # single-turn: a row's one round holds all its tokens
                return self.row_sum(values)[runs.row]
            # rounds are contiguous in the valid-token arrays, so a segment sum per round suffices
            return segment_sum(values, runs.valid_tokens, dtype=F64)

        return _memoized(self._run_sums, values, take)

    def remember_row_sum(self, values: torch.Tensor, row_sums: torch.Tensor) -> None:
        """Record per-row float64 sums of `values` taken elsewhere (a fused kernel), for `row_sum` and `row_mean`."""
        self._row_sums[id(values)] = (values, row_sums)

    def known_row_sum(self, values: torch.Tensor) -> torch.Tensor | None:
        """The per-row sums of `values` if some pass has taken them already, else None (nothing is computed)."""
        hit = self._row_sums.get(id(values))
        return hit[1] if hit is not None and hit[0] is values else None

    def row_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row float64 sum of per-token values (0 for an empty row), computed once per tensor."""
        def take() -> torch.Tensor:
            if self.num_rows == 0:
                return torch.zeros(0, dtype=F64, device=values.device)
            return segment_sum(values, self.lengths, dtype=F64)

        return _memoized(self._row_sums, values, take)

    def total(self, values: torch.Tensor) -> torch.Tensor:
        """ops.total of a per-token tensor, taken once per chunk however many accumulators sum it."""
        return _memoized(self._totals, values, lambda: total(values))

    def row_mean(self, values: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """verl's masked_mean along a row: sum / (count + 1e-8); 0 for an empty row.

        With `exact` (a bool or integer mask upstream) the 1e-8 vanishes in float32 unless the count is 0.
        """
        if exact:
            tokens = self.row_tokens
            return self.row_sum(values) / torch.where(tokens > 0, tokens, torch.full_like(tokens, 1e-8))
        return self.row_sum(values) / self.row_denominator

    def row_max(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row max over valid tokens (0 for an empty row, as verl's seq_max does)."""
        if self.num_rows == 0:
            return torch.zeros(0, dtype=F64, device=values.device)
        return segment_max(values, self.lengths)

    def row_count(self, flags: torch.Tensor) -> torch.Tensor:
        """Per-row number of valid tokens carrying the flag, float64 [B]."""
        return self.row_sum(flags)


def _memoized(memo: dict[int, tuple[torch.Tensor, torch.Tensor]], values: torch.Tensor,
              take: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A per-tensor result from `memo`, else `take()`'s, kept there (by the tensor's id, with the tensor)."""
    hit = memo.get(id(values))
    if hit is not None and hit[0] is values:  # the tensor is kept alive, so its id cannot be reused
        return hit[1]
    out = take()
    memo[id(values)] = (values, out)
    return out


def bounded(batch: Batch, max_positions: int = MAX_CHUNK_POSITIONS) -> Iterator[Batch]:
    """Split a batch into row-aligned views of at most `max_positions` positions (one long row stays whole)."""
    if batch.num_positions <= max_positions:
        yield batch
        return
    offsets = batch.offsets
    start = 0
    while start < batch.num_rows:
        limit = offsets[start] + max_positions
        stop = max(int(np.searchsorted(offsets, limit, side="right")) - 1, start + 1)
        yield batch.slice_rows(start, stop)
        start = stop


@cache
def _safe_ratio_bounds(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(-20) and exp(20) as the device computes them, copied there once per process (not once per chunk)."""
    bound = torch.tensor(SAFETY_BOUND, dtype=dtype, device=device)
    return torch.exp(-bound), torch.exp(bound)


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = host_tensor(array)
    if device.type == "cuda":
        # Pinned host memory lets the copy run asynchronously: the GPU computes on this chunk while the
        # CPU (and the read-ahead threads) prepare the next one. Joined chunks already are (engine/core/staging.py).
        return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)
    return tensor.to(device)


def make_chunk(batch: Batch, device: torch.device, dtype: torch.dtype, fused: bool = False) -> Chunk:
    """Move a batch's raw positions to the device once, and select its valid tokens there in the compute dtype.

    Data-quality flags, row lengths and round starts are computed on the device, and their counts come
    back to the host in one small transfer (the chunk's only wait for the device), which sizes the
    compaction and the rounds; on the fused CPU path one numba pass takes all of it (segments.lay_out).
    """
    old = _tensor(batch.old_log_probs, device)
    rollout = _tensor(batch.rollout_log_probs, device)
    mask_np = batch.response_mask.astype(bool, copy=False)
    mask = _tensor(mask_np, device)
    positions = (old, rollout, mask)
    offsets = _tensor(batch.offsets.astype(np.int64, copy=False), device)
    advantages = position_advantages = None
    token_ids = batch.token_ids
    if batch.advantages is not None:
        position_advantages = _tensor(batch.advantages, device)
        advantages = position_advantages
    one_pass = dtype == torch.float32 and sweep.wanted(old, fused) and sweep.wanted(rollout, fused)
    lengths, layout, quality, compacted = lay_out(batch, positions, offsets, one_pass)
    if compacted is not None:
        old, rollout = compacted
        index = layout.valid_positions
        if advantages is not None or batch.token_ids is not None:
            index = flag_indices(layout.keep, old.numel()) if index is None else index
        if advantages is not None:
            advantages = take(advantages, index)
        if batch.token_ids is not None:
            token_ids = batch.token_ids[index.cpu().numpy()]
    return Chunk(
        old=old.to(dtype),
        rollout=rollout.to(dtype),
        lengths=lengths,
        quality=quality,
        offsets=batch.offsets,
        source=batch.source,
        first_row=batch.first_row,
        row_numbers=batch.row_numbers(),
        sequence_ids=batch.sequence_ids,
        steps=batch.steps,
        process_index=batch.process_index,
        policy_versions=batch.policy_versions,
        version_kind=batch.version_kind,
        token_ids=token_ids,
        layout=layout,
        positions=positions,
        advantages=None if advantages is None else advantages.to(dtype),
        position_advantages=position_advantages,
        fused=fused,
    )


__all__ = ["Chunk", "bounded", "make_chunk"]
