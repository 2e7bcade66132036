"""A chunk's layout on the device: valid tokens and rounds among its positions, found without a loop.

Round k of a row is its k-th maximal run of 1s in the response mask. Everything is prefix sums and
gathers over the positions (`ops` primitives: numpy on the CPU, torch on a device), so no loop over
rows or tokens and no host round trip: the only host numbers (how many runs, the most per row) come
with the chunk's one combined count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mismatch_cli.engine.ops import count, flag_indices, segment_count


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
    """Where a chunk's valid tokens and run starts sit among its positions (device tensors)."""

    offsets: torch.Tensor  # [B+1] int64 row offsets over positions
    keep: torch.Tensor  # [P] bool: a valid token
    starts: torch.Tensor  # [P] bool: a run of 1s starts here
    rounds_per_row: torch.Tensor  # [B] int64
    num_valid: torch.Tensor | int  # device counts until the chunk's combined count resolves them
    num_runs: torch.Tensor | int
    max_rounds: torch.Tensor | int
    valid_positions: torch.Tensor | None = None  # [N_valid] each valid token's position (None: every one is valid)

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


__all__ = ["Layout", "Runs", "find_runs"]
