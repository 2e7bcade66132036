"""Micro-batches of consecutive rows, as a trainer that reduces per micro-batch cuts a dump (SkyRL, ms-swift, OpenRLHF).

Micro-batch k of a file holds its rows k·size … (k+1)·size − 1, so the cut never depends on chunking: rows of
micro-batches that a chunk holds whole are folded at once; rows of the ones a chunk's edge cuts wait, per
(file, k), until `compute` joins them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


class MicroBatchRows:
    """Per-row statistics ([rows, C] tensors) grouped into micro-batches of `size` consecutive rows of a file."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.edges: dict[tuple[str, int], list[torch.Tensor]] = {}  # rows of micro-batches cut by a chunk's edge

    def whole(self, source: str, first_row: int, stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows of the micro-batches this chunk holds whole and their micro-batch index; keep the cut ones."""
        rows, size = stats.shape[0], self.size
        if not rows:
            return None
        index = (first_row + np.arange(rows)) // size
        cut = np.zeros(rows, dtype=bool)
        if first_row % size:
            cut |= index == index[0]
        if (first_row + rows) % size:
            cut |= index == index[-1]
        for key in np.unique(index[cut]):  # at most two: one per edge
            self.edges.setdefault((source, int(key)), []).append(stats[torch.as_tensor(index == key)])
        if cut.all():
            return None
        whole = torch.as_tensor(~cut, device=stats.device)
        return stats[whole], torch.as_tensor(index, device=stats.device)[whole]

    def merge(self, other: MicroBatchRows) -> None:
        """Take another shard's waiting rows."""
        for key, parts in other.edges.items():
            self.edges.setdefault(key, []).extend(parts)

    def joined(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each cut micro-batch's rows, joined, with its index repeated per row, in file and index order."""
        for (_, key), parts in sorted(self.edges.items()):
            stats = torch.cat(parts)
            yield stats, torch.full((stats.shape[0],), key, dtype=torch.int64, device=stats.device)


__all__ = ["MicroBatchRows"]
