"""A chunk's rounds: the maximal runs of 1s in each row's response mask, found without a loop over rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Runs:
    """The maximal runs of 1s of a chunk's mask: where they are and which round each one is."""

    row: np.ndarray  # [G] row index within the chunk
    index: np.ndarray  # [G] round index within its row (0-based)
    index_from_end: np.ndarray  # [G] 0 = the row's last round
    valid_tokens: np.ndarray  # [G] valid tokens in the run (mask 1 and finite)
    rounds_per_row: np.ndarray  # [B]


def find_runs(mask: np.ndarray, offsets: np.ndarray, keep: np.ndarray | None = None) -> Runs:
    """Segment each row's mask into runs of 1s; `keep` (valid tokens) defaults to the mask itself."""
    positions = mask.size
    row_starts, row_ends = offsets[:-1], offsets[1:]
    nonempty = row_ends > row_starts
    previous = np.zeros(positions, dtype=bool)
    previous[1:] = mask[:-1]
    previous[row_starts[nonempty]] = False  # a run never continues across a row boundary
    following = np.zeros(positions, dtype=bool)
    following[:-1] = mask[1:]
    following[row_ends[nonempty] - 1] = False
    starts = np.flatnonzero(mask & ~previous)
    ends = np.flatnonzero(mask & ~following)
    row = np.searchsorted(offsets, starts, side="right") - 1
    first_run = np.searchsorted(starts, row_starts, side="left")
    rounds_per_row = np.searchsorted(starts, row_ends, side="left") - first_run
    index = np.arange(starts.size, dtype=np.int64) - first_run[row]
    if keep is None or keep is mask:
        valid_tokens = ends - starts + 1
    else:
        kept_before = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
        valid_tokens = kept_before[ends + 1] - kept_before[starts]
    return Runs(
        row=row.astype(np.int64),
        index=index,
        index_from_end=rounds_per_row[row] - 1 - index,
        valid_tokens=valid_tokens.astype(np.int64),
        rounds_per_row=rounds_per_row.astype(np.int64),
    )


__all__ = ["Runs", "find_runs"]
