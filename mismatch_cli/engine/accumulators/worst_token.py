"""The single tokens a cause names: the largest |delta| and the largest delta = old - rollout, each placed in its dump.

Two tokens, because the metrics that fail are carried by different ones: NeMo-RL's token_mult_prob_error
sums exp|delta|, so its largest term is the largest |delta| on either side; chi2_token, the ESS and the IS
weights sum ratio^2 = exp(2 delta), so theirs is the largest positive delta (old >> rollout), and a token with
delta << 0 adds almost nothing (ratio^2 < 1). Per chunk each is one argmax on the device; the candidates are
read on the host once every PENDING chunks. Ties go to the lowest (file, row, position), so the result does
not depend on how the dump is chunked or sharded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels.ops import numpy_kernels

PENDING = 16  # chunks' candidates kept before one host read resolves them
PICK = 7  # per kind: token index, delta, old, rollout, and (a device's) row, position and round
# table key -> the score it maximizes (a key of the placed entry)
KINDS = {"worst_token": "abs_log_ratio", "max_log_ratio_token": "log_ratio"}


class WorstTokens:
    """The token with the largest |delta| and the one with the largest delta, with file, row, position and round."""

    def __init__(self) -> None:
        self.pending: list[tuple[torch.Tensor, dict[str, Any]]] = []
        self.best: dict[str, dict[str, Any] | None] = dict.fromkeys(KINDS)

    def update(self, chunk: Chunk) -> None:
        """Keep the chunk's two candidates (device scalars) and what places them; resolve every PENDING chunks."""
        on_host = numpy_kernels(chunk.log_ratio)
        values = self._host_picks(chunk) if on_host else self._device_picks(chunk)
        # On the host, the arrays that place a token at a resolve (CPU tensors); a device places its candidates.
        layout = chunk.layout if on_host else None
        meta = {"file": chunk.source, "rows": chunk.row_numbers, "offsets": chunk.offsets,
                "valid": layout.keep if layout is not None else None,
                "starts": layout.starts if layout is not None else None,
                "steps": chunk.steps, "ids": chunk.sequence_ids, "placed": not on_host,
                "lengths": chunk.lengths if on_host else None}
        self.pending.append((values, meta))
        if len(self.pending) >= PENDING:
            self.resolve()

    @staticmethod
    def _host_picks(chunk: Chunk) -> torch.Tensor:
        """Per kind: token index, delta, old, rollout and three -1s (placed at a resolve; float64 [2 * PICK]), with
        numpy's argmax (~20x torch's)."""
        delta = chunk.log_ratio
        picks = [int(chunk.worst_token[0]), int(np.argmax(delta.numpy()))]
        return torch.tensor([float(x) for token in picks for x in (token, delta[token], chunk.old[token],
                                                                   chunk.rollout[token], -1, -1, -1)], dtype=F64)

    @staticmethod
    def _device_picks(chunk: Chunk) -> torch.Tensor:
        """The same with torch's kernels, left on the device (the first of equal maxima, as numpy's), each with
        its row, position within the row and round (-1: none known), so that no layout waits for a resolve."""
        delta = chunk.log_ratio
        at = torch.cat([chunk.worst_token, torch.argmax(delta).reshape(1)])
        ends = torch.cumsum(chunk.lengths, 0)
        row = torch.searchsorted(ends, at, right=True)
        layout = chunk.layout
        if layout is None or chunk.offsets is None:
            position, round_index = at - (ends - chunk.lengths)[row], torch.full_like(at, -1)
        else:
            # The layout's compaction index and the run starts place a token with no pass over the positions.
            at_position = at if layout.valid_positions is None else layout.valid_positions.index_select(0, at)
            position = at_position - layout.offsets[row]
            runs = chunk.runs  # the run holding a valid token is the last one starting at or before it
            round_index = runs.index[torch.searchsorted(runs.start, at_position, right=True) - 1]
        columns = (at, delta.index_select(0, at), chunk.old.index_select(0, at), chunk.rollout.index_select(0, at),
                   row, position, round_index)
        return torch.stack([c.to(F64) for c in columns], dim=1).flatten()

    def resolve(self) -> None:
        """Read the pending candidates (one host sync) and keep the best token of each kind found so far."""
        if not self.pending:
            return
        device = self.pending[0][0].device  # one copy to the host for them all
        values = torch.stack([v.to(device) for v, _ in self.pending]).cpu().numpy().reshape(len(self.pending),
                                                                                             len(KINDS), PICK)
        for kind_index, (kind, score) in enumerate(KINDS.items()):
            picks = values[:, kind_index]
            scores = np.abs(picks[:, 1]) if score == "abs_log_ratio" else picks[:, 1]
            # Placing a token reads its chunk's layout on the host (O(positions)); only the candidates with the
            # best score can win (ties are settled by file, row and position), so only they are placed.
            best = scores.max()
            current = self.best[kind]
            if current is not None:
                best = max(best, current[score])
            for (token, delta, old, rollout, *where), value, (_, meta) in zip(picks, scores, self.pending,
                                                                                strict=True):
                if value < best:
                    continue
                entry = _placed(meta, *(int(w) for w in where)) if meta["placed"] else _place(meta, int(token))
                entry.update(abs_log_ratio=abs(float(delta)), log_ratio=float(delta), old_log_prob=float(old),
                             rollout_log_prob=float(rollout))
                self.offer(kind, entry)
        self.pending = []

    def offer(self, kind: str, entry: dict[str, Any]) -> None:
        """Keep `entry` as the `kind` token if it scores higher (or ties and comes first in the dump)."""
        score = KINDS[kind]

        def order(e: dict[str, Any]) -> tuple[float, str, int, int]:
            return (-e[score], e["file"], e["row"], e["position"])

        current = self.best[kind]
        if current is None or order(entry) < order(current):
            self.best[kind] = entry

    def merge(self, other: WorstTokens) -> None:
        """Fold another shard's tokens in. Candidates a device placed join ours unread (read every PENDING); the
        host's are read first, as they hold their chunk's layout (each --by step state would keep 15 of them)."""
        if any(not meta["placed"] for _, meta in other.pending):
            other.resolve()
        for kind, entry in other.best.items():
            if entry is not None:
                self.offer(kind, entry)
        self.pending += other.pending
        if len(self.pending) >= PENDING:
            self.resolve()

    def __getstate__(self) -> dict[str, Any]:
        """A pickled state (a --jobs or Ray shard's) carries the best tokens, not up to PENDING chunks' layouts."""
        self.resolve()
        return dict(self.__dict__)

    def compute(self) -> dict[str, dict[str, Any] | None]:
        """Each kind's token as a fresh dict (None before any token)."""
        self.resolve()
        return {kind: dict(entry) if entry is not None else None for kind, entry in self.best.items()}


def _placed(meta: dict[str, Any], row: int, position: int, round_index: int) -> dict[str, Any]:
    """The entry of a token a device placed (row and position within the chunk's rows; round -1: not known)."""
    return _entry(meta, row, position, None if round_index < 0 else round_index)


def _place(meta: dict[str, Any], token: int) -> dict[str, Any]:
    """File, row, position within the row, round, step and id of a chunk's `token`-th valid token (host)."""
    lengths = meta["lengths"].numpy()
    ends = np.cumsum(lengths)
    row = int(np.searchsorted(ends, token, side="right"))
    within = token - int(ends[row] - lengths[row])  # the row's within-th valid token
    if meta["valid"] is None or meta["offsets"] is None:  # no layout: positions are the valid tokens'
        return _entry(meta, row, within, None)
    # Only the token's own row of the layout is read: a prefix count over the chunk cost ~2 ms a placement.
    start, stop = int(meta["offsets"][row]), int(meta["offsets"][row + 1])
    position = int(np.flatnonzero(meta["valid"][start:stop].numpy())[within])
    round_index = int(np.count_nonzero(meta["starts"][start:start + position + 1].numpy())) - 1
    return _entry(meta, row, position, round_index)


def _entry(meta: dict[str, Any], row: int, position: int, round_index: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": meta["file"], "row": int(meta["rows"][row]), "position": position,
                             "round": round_index, "step": None if meta["steps"] is None else int(meta["steps"][row])}
    if meta["ids"] is not None:
        value = meta["ids"][row]
        entry["id"] = value.item() if isinstance(value, np.generic) else value
    return entry


__all__ = ["KINDS", "WorstTokens"]
