"""The worst sequences of a dump: a mergeable top-k by |mean delta|, by max |delta| and by max delta per row.

Each chunk contributes at most k candidates per criterion (picked with one vectorized sort over
its rows); merging concatenates candidate lists and keeps the k best. Ties are broken by (file,
row), so the result does not depend on how the dump was chunked.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels.ops import segment_max

TOP_K = 10
CRITERIA = {
    "abs_mean_log_ratio": "|mean delta| over the row's valid tokens",
    "max_abs_log_ratio": "largest |delta| of any valid token in the row",
    # ratio^2 = exp(2 delta): the rows that hold chi2_token's and the IS weights' largest terms
    "max_log_ratio": "largest delta = old - rollout of any valid token in the row",
}


def row_max(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-row max of a token quantity (0 for an empty row), float64 [B]."""
    return segment_max(values, lengths)


@cache
def _empty_row_scores(device: torch.device) -> torch.Tensor:
    """float64 [3, 1]: the scores an empty row gets, on the device once per process."""
    return torch.tensor([[-1.0], [-1.0], [-math.inf]], dtype=F64, device=device)


def _python(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def _order(entry: dict[str, Any], criterion: str) -> tuple[float, str, int]:
    return (-entry[criterion], entry["file"], entry["row"])


class WorstSequences(Accumulator):
    """Top-k rows by |mean delta|, max |delta| and max delta, with file, row, id, step and token count."""

    def __init__(self, k: int = TOP_K) -> None:
        self.k = k
        self.best: dict[str, list[dict[str, Any]]] = {c: [] for c in CRITERIA}
        # Each chunk's picks, still on their way to the host, with the chunk's per-row metadata.
        self.pending: list[tuple[torch.Tensor, Any, tuple[str, np.ndarray, Any, Any]]] = []

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Pick the chunk's k best valid rows per criterion on the device; the host reads them a chunk later."""
        if chunk.num_rows == 0:
            return
        tokens = chunk.row_tokens
        mean = chunk.log_ratio_row_sum / tokens.clamp_min(1.0)
        scores = torch.stack([mean.abs(), row_max(chunk.abs_log_ratio, chunk.lengths),
                              row_max(chunk.log_ratio, chunk.lengths)])
        # The first two scores are >= 0 and the third finite: an empty row is never picked (nor kept, below).
        scores = torch.where(chunk.row_valid, scores, _empty_row_scores(scores.device))
        # Stable: among equal scores the earlier row (lower row number) wins, as in the merge.
        picked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, : self.k].flatten()
        payload = torch.stack([picked.to(F64), scores[0, picked], scores[1, picked], mean[picked], tokens[picked],
                               scores[2, picked]])
        event = None
        if payload.device.type == "cuda":
            stream = torch.cuda.current_stream(payload.device)  # the chunk's device, which need not be the current one
            payload = payload.to("cpu", non_blocking=True)  # into pinned memory, without waiting
            event = torch.cuda.Event()
            event.record(stream)
        self.pending.append((payload, event, (chunk.source, chunk.row_numbers, chunk.sequence_ids, chunk.steps)))
        self._drain(wait=False)

    def _drain(self, wait: bool = True) -> None:
        """Fold in the picks that have reached the host (all of them when `wait`)."""
        while self.pending:
            payload, event, (source, row_numbers, sequence_ids, steps) = self.pending[0]
            if event is not None and not event.query():
                if not wait:
                    return
                event.synchronize()
            self.pending.pop(0)
            columns = payload.numpy()
            candidates = []
            for i in sorted(set(np.flatnonzero(columns[1] >= 0).tolist()), key=lambda i: columns[0, i]):
                row = int(columns[0, i])
                if candidates and candidates[-1]["row"] == int(row_numbers[row]):
                    continue
                candidates.append({
                    "file": source,
                    "row": int(row_numbers[row]),
                    "id": None if sequence_ids is None else _python(sequence_ids[row]),
                    "step": None if steps is None else int(steps[row]),
                    "tokens": int(columns[4, i]),
                    "log_ratio_mean": float(columns[3, i]),
                    "abs_mean_log_ratio": float(columns[1, i]),
                    "max_abs_log_ratio": float(columns[2, i]),
                    "max_log_ratio": float(columns[5, i]),
                })
            self._fold(candidates)

    def __getstate__(self) -> dict[str, Any]:
        self._drain()
        return self.__dict__

    def _fold(self, candidates: list[dict[str, Any]]) -> None:
        for criterion in CRITERIA:
            pool = self.best[criterion] + candidates
            self.best[criterion] = sorted(pool, key=lambda e, c=criterion: _order(e, c))[: self.k]

    def merge(self, other: WorstSequences) -> None:
        """Fold another shard's candidates in."""
        self._drain()
        other._drain()
        for criterion in CRITERIA:
            pool = self.best[criterion] + other.best[criterion]
            self.best[criterion] = sorted(pool, key=lambda e, c=criterion: _order(e, c))[: self.k]

    def compute(self) -> Contribution:
        """One entry per (criterion, rank): the row's identity and every score."""
        self._drain()
        out = []
        for criterion in CRITERIA:
            for rank, entry in enumerate(self.best[criterion], start=1):
                out.append({"criterion": criterion, "rank": rank, **entry})
        return Contribution(worst_sequences=out)


__all__ = ["CRITERIA", "TOP_K", "WorstSequences", "row_max"]
