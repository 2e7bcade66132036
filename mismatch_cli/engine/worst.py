"""The worst sequences of a dump: a mergeable top-k by |mean delta| and by max |delta| per row.

Each chunk contributes at most k candidates per criterion (picked with one vectorized sort over
its rows); merging concatenates candidate lists and keeps the k best. Ties are broken by (file,
row), so the result does not depend on how the dump was chunked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.state import F64

TOP_K = 10
CRITERIA = {
    "abs_mean_log_ratio": "|mean delta| over the row's valid tokens",
    "max_abs_log_ratio": "largest |delta| of any valid token in the row",
}


def row_max(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-row max of a token quantity (0 for an empty row), float64 [B]."""
    if values.device.type != "cpu":
        out = torch.segment_reduce(values.to(F64), "max", lengths=lengths, unsafe=True)
        return torch.where(lengths > 0, out, torch.zeros_like(out))
    counts = lengths.numpy()
    out = np.zeros(counts.size, dtype=np.float64)
    nonempty = counts > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(counts[:-1])))[nonempty]
        out[nonempty] = np.maximum.reduceat(values.numpy(), starts)
    return torch.from_numpy(out)


def _python(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def _order(entry: dict[str, Any], criterion: str) -> tuple[float, str, int]:
    return (-entry[criterion], entry["file"], entry["row"])


class WorstSequences(Accumulator):
    """Top-k rows by |mean delta| and by max |delta|, with file, row, id, step and token count."""

    def __init__(self, k: int = TOP_K) -> None:
        self.k = k
        self.best: dict[str, list[dict[str, Any]]] = {c: [] for c in CRITERIA}

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Pick the chunk's k best valid rows per criterion and fold them in."""
        valid = chunk.row_valid
        if not bool(valid.any()):
            return
        tokens = chunk.row_tokens
        mean = chunk.log_ratio_row_sum / tokens.clamp_min(1.0)
        scores = {
            "abs_mean_log_ratio": mean.abs(),
            "max_abs_log_ratio": row_max(chunk.abs_log_ratio, chunk.lengths),
        }
        rows = np.flatnonzero(valid.cpu().numpy())
        columns = {name: values.cpu().numpy()[rows] for name, values in scores.items()}
        mean_np, tokens_np = mean.cpu().numpy()[rows], tokens.cpu().numpy()[rows]
        picked: set[int] = set()
        for values in columns.values():
            # Stable sort: among equal scores the earlier row (lower row number) wins, as in the merge.
            picked.update(rows[np.argsort(-values, kind="stable")[: self.k]].tolist())
        position = {row: i for i, row in enumerate(rows.tolist())}
        candidates = []
        for row in sorted(picked):
            i = position[row]
            entry: dict[str, Any] = {
                "file": chunk.source,
                "row": chunk.first_row + row,
                "id": None if chunk.sequence_ids is None else _python(chunk.sequence_ids[row]),
                "step": None if chunk.steps is None else int(chunk.steps[row]),
                "tokens": int(tokens_np[i]),
                "log_ratio_mean": float(mean_np[i]),
            }
            for criterion, values in columns.items():
                entry[criterion] = float(values[i])
            candidates.append(entry)
        self._fold(candidates)

    def _fold(self, candidates: list[dict[str, Any]]) -> None:
        for criterion in CRITERIA:
            pool = self.best[criterion] + candidates
            self.best[criterion] = sorted(pool, key=lambda e, c=criterion: _order(e, c))[: self.k]

    def merge(self, other: WorstSequences) -> None:
        """Fold another shard's candidates in."""
        for criterion in CRITERIA:
            pool = self.best[criterion] + other.best[criterion]
            self.best[criterion] = sorted(pool, key=lambda e, c=criterion: _order(e, c))[: self.k]

    def compute(self) -> Contribution:
        """One entry per (criterion, rank): the row's identity and both scores."""
        out = []
        for criterion in CRITERIA:
            for rank, entry in enumerate(self.best[criterion], start=1):
                out.append({"criterion": criterion, "rank": rank, **entry})
        return Contribution(worst_sequences=out)


__all__ = ["CRITERIA", "TOP_K", "WorstSequences", "row_max"]
