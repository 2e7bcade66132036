"""A chunk's layout on the device: valid tokens, data-quality counts and rounds among its positions.

Round k of a row is its k-th maximal run of 1s in the response mask. By passes, everything is prefix
sums and gathers over the positions (`ops` primitives: numpy on the CPU, torch on a device), so no
loop over rows or tokens and no host round trip: the only host numbers (how many runs, the most per
row) come with the chunk's one combined count. On the fused CPU path one numba pass over the positions
finds the same (engine/kernels/sweep.py `layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.engine.core.quality import QUALITY_CATEGORIES, SENTINEL_LOGPROB, quality_flags
from mismatch_cli.engine.kernels import sweep
from mismatch_cli.engine.kernels.ops import count, flag_indices, numpy_kernels, segment_count, take


@dataclass(frozen=True)
class Runs:
    """The maximal runs of 1s of a chunk's mask: where they are and which round each one is (device tensors)."""

    start: torch.Tensor  # [G] the run's first position among the chunk's positions
    row: torch.Tensor  # [G] row index within the chunk
    index: torch.Tensor  # [G] round index within its row (0-based)
    index_from_end: torch.Tensor  # [G] 0 = the row's last round
    valid_tokens: torch.Tensor  # [G] valid tokens in the run (mask 1 and finite)
    rounds_per_row: torch.Tensor  # [B]
    count: int  # G, known on the host
    max_per_row: int  # the most rounds in one row (0 without a run)


@dataclass
class Layout:
    """Where a chunk's valid tokens and run starts sit among its positions (tensors on the chunk's device)."""

    offsets: torch.Tensor  # [B+1] int64 row offsets over positions
    keep: torch.Tensor  # [P] bool: a valid token
    starts: torch.Tensor  # [P] bool: a run of 1s starts here
    rounds_per_row: torch.Tensor  # [B] int64
    num_valid: torch.Tensor | int  # device counts until the chunk's combined count resolves them
    num_runs: torch.Tensor | int
    max_rounds: torch.Tensor | int
    # [N_valid] each valid token's position, which places a worst token on a device (None: every one is valid, or a
    # CPU chunk laid out in one pass, whose worst tokens are placed from `keep`)
    valid_positions: torch.Tensor | None = None
    found_runs: Runs | None = None  # the runs, when a fused pass found them with the rest (engine/kernels/sweep.py)

    @staticmethod
    def build(mask: torch.Tensor, offsets: torch.Tensor, keep: torch.Tensor, row_positions: torch.Tensor) -> Layout:
        """Run starts (a run never continues across a row boundary) and the counts the host will need."""
        positions = mask.numel()
        previous = torch.zeros(positions + 1, dtype=torch.bool, device=mask.device)
        previous[1:] = mask
        previous.index_fill_(0, offsets[:-1], False)  # a row's first position starts a run whatever precedes it
        starts = mask & ~previous[:positions]
        rounds_per_row = segment_count(starts, row_positions)
        empty = torch.zeros((), dtype=torch.int64, device=mask.device)
        most = rounds_per_row.max() if rounds_per_row.numel() else empty
        return Layout(offsets, keep, starts, rounds_per_row, count(keep), count(starts),
                      most)

    def resolve(self, num_valid: int, num_runs: int, max_rounds: int) -> None:
        """Take the host's copy of the counts (from the chunk's one combined transfer)."""
        self.num_valid, self.num_runs, self.max_rounds = num_valid, num_runs, max_rounds

    def valid_from(self, bounds: torch.Tensor) -> torch.Tensor:
        """int64 [K]: valid tokens from each of the increasing positions `bounds` up to the next (the last: to P)."""
        positions = self.keep.numel()
        lengths = torch.diff(bounds, prepend=bounds.new_zeros(1), append=bounds.new_full((1,), positions))
        if int(self.num_valid) == positions:
            return lengths[1:]
        # One segment count over the pieces (a reduceat on the CPU), not a prefix count over every position.
        return segment_count(self.keep, lengths)[1:]

    def runs(self) -> Runs:
        """Each run's row, round index from either end and valid tokens (sizes from the resolved counts)."""
        if self.found_runs is not None:
            return self.found_runs
        count, most = int(self.num_runs), int(self.max_rounds)
        device = self.offsets.device
        start = flag_indices(self.starts, count).to(device)
        row = torch.searchsorted(self.offsets, start, right=True) - 1
        first_run = torch.cumsum(self.rounds_per_row, 0) - self.rounds_per_row
        index = torch.arange(count, dtype=torch.int64, device=device) - first_run[row]
        # Between a run's end and the next start every position is masked, so the next start bounds its tokens.
        valid = self.valid_from(start)
        return Runs(start=start, row=row, index=index, index_from_end=self.rounds_per_row[row] - 1 - index,
                    valid_tokens=valid, rounds_per_row=self.rounds_per_row, count=count, max_per_row=most)


def find_runs(mask: np.ndarray | torch.Tensor, offsets: np.ndarray | torch.Tensor,
              keep: np.ndarray | torch.Tensor | None = None) -> Runs:
    """Segment each row's mask into runs of 1s; `keep` (valid tokens) defaults to the mask itself."""
    mask_t = torch.as_tensor(mask).to(torch.bool)
    offsets_t = torch.as_tensor(offsets).to(mask_t.device, torch.int64)
    keep_t = mask_t if keep is None else torch.as_tensor(keep).to(torch.bool)
    layout = Layout.build(mask_t, offsets_t, keep_t, offsets_t[1:] - offsets_t[:-1])
    layout.resolve(int(layout.num_valid), int(layout.num_runs), int(layout.max_rounds))
    return layout.runs()


Positions = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # a chunk's old, rollout and mask, every position
Laid = tuple[torch.Tensor, Layout, dict[str, int], tuple[torch.Tensor, torch.Tensor] | None]


def lay_out(batch: Batch, positions: Positions, offsets: torch.Tensor, one_pass: bool) -> Laid:
    """A chunk's valid tokens per row, layout, quality counts and valid tokens' old and rollout values (None: every
    position is one): in one fused pass over float32 CPU positions (`one_pass`, engine/kernels/sweep.py), else by passes
    on the positions' device."""
    return _layout_in_one_pass(batch, positions, offsets) if one_pass else _layout_by_passes(batch, positions, offsets)


def _layout_by_passes(batch: Batch, positions: Positions, offsets: torch.Tensor) -> Laid:
    """Valid tokens per row, the layout, the quality counts and the valid tokens' old and rollout values (None:
    every position is one), by passes over the positions on their device."""
    old, rollout, mask = positions
    if numpy_kernels(old.device):  # the same expressions, on numpy's faster CPU kernels
        keep_np, flags_np = quality_flags(batch.old_log_probs, batch.rollout_log_probs, mask.numpy())
        keep, flags = torch.from_numpy(keep_np), {c: torch.from_numpy(f) for c, f in flags_np.items()}
    else:
        keep, flags = quality_flags(old, rollout, mask)
    row_positions = offsets[1:] - offsets[:-1]
    lengths = segment_count(keep, row_positions)
    layout = Layout.build(mask, offsets, keep, row_positions)
    counted = [layout.num_valid, layout.num_runs, layout.max_rounds, count(mask),
               *(count(flags[c]) for c in QUALITY_CATEGORIES)]
    num_valid, num_runs, max_rounds, masked, *found = torch.stack(counted).tolist()  # the one host round trip
    layout.resolve(num_valid, num_runs, max_rounds)
    quality = {"positions": batch.num_positions, "masked_tokens": masked,
               **dict(zip(QUALITY_CATEGORIES, found, strict=True))}
    if num_valid == keep.numel():
        return lengths, layout, quality, None
    index = flag_indices(keep, num_valid)
    layout.valid_positions = index  # where each valid token sits: placing a worst token on a device reads it
    return lengths, layout, quality, (take(old, index), take(rollout, index))


def _layout_in_one_pass(batch: Batch, positions: Positions, offsets: torch.Tensor) -> Laid:
    """The same from the fused CPU pass over float32 positions (kernels/sweep.py), runs and compaction included."""
    old, rollout, mask = positions
    found = sweep.layout(old.numpy(), rollout.numpy(), mask.numpy(), batch.offsets, SENTINEL_LOGPROB)
    counts = found.counts
    rounds_per_row = torch.from_numpy(found.rounds_per_row)
    run_row, run_index = torch.from_numpy(found.run_row), torch.from_numpy(found.run_index)
    runs = Runs(start=torch.from_numpy(found.run_start), row=run_row, index=run_index,
                index_from_end=rounds_per_row[run_row] - 1 - run_index, valid_tokens=torch.from_numpy(found.run_tokens),
                rounds_per_row=rounds_per_row, count=counts["num_runs"], max_per_row=counts["max_rounds"])
    layout = Layout(offsets, torch.from_numpy(found.keep), torch.from_numpy(found.starts), rounds_per_row,
                    counts["num_valid"], counts["num_runs"], counts["max_rounds"], found_runs=runs)
    quality = {"positions": batch.num_positions, "masked_tokens": counts["masked_tokens"],
               **{c: counts[c] for c in QUALITY_CATEGORIES}}
    lengths = torch.from_numpy(found.lengths)
    compacted = None if counts["num_valid"] == batch.num_positions else (torch.from_numpy(found.old),
                                                                         torch.from_numpy(found.rollout))
    return lengths, layout, quality, compacted


__all__ = ["Layout", "Runs", "find_runs", "lay_out"]
