"""Evidence that tells causes apart beyond the bug signatures: zero-filled row prefixes and the policy lag.

Zero-filled prefixes (a response mask covering the prompt): per row, the leading run of valid tokens whose
rollout log-prob is exactly 0.0 while the old one is not, counted exactly; the engine reports no log-prob for a
prompt token, so a dump whose mask covers the prompt leads each row with such a run. The rows whose run holds at
least two tokens are counted apart: one near-certain first token reports 0.0 in a real stream too.

Exact 0.0 rollout log-probs (with old != 0): their count and the sums of min(ratio, e) - 1 and its square, so the
findings can test the capped ratio mean without them: a truncation whose kept set holds one token reports 0.0
there, and the other tokens still show the truncation; a fill leaves the others at a mean of 1.

The tail's moments: over the tokens with |delta| >= 1, their count and the sums of old, rollout, old^2 and
old * rollout, so the findings can take the least-squares slope of rollout on old over the bulk (the whole
dump's moments minus these): a temperature rescales every token, a penalty or logit bias leaves the bulk on a
slope of 1 and moves a tail. The tail is rare on any usable dump, so on the host it is gathered first.

Repetition, when the dump holds the sampled token ids: per token, whether its id occurred earlier in its row's
valid tokens, and how many of the tokens with delta > 0 (the trainer rates them above the engine) are such
repeats. A repetition penalty pushes exactly those tokens down in the engine and not in the trainer.

Policy lag: when the dump stamps a policy version (or a lag) on each row (io.aliases.VERSION_COLUMNS), the
float64 sums of the valid tokens per (step, version): tokens, rows, |p_old - p_rollout| and its square,
exp|delta| and delta. A few keys per distinct version, never per token; `compute` lists them and the findings
derive each row's lag (answers/findings/lag.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.engine.kernels.ops import numpy_kernels

FILL_LOG_RATIO = float(np.log(2.0))  # as the signatures' fill rule: a 0.0 off the other side by a factor 2
BULK_LOG_RATIO = 1.0  # as the signatures' bulk (answers/findings/signatures.py)
RATIO_CAP_LOG = 1.0  # as the signatures' capped ratio mean (accumulators/signatures.py)
ZERO_SUMS = ("zero_tokens", "zero_excess", "zero_excess_sq")
TAIL_SUMS = ("tail_tokens", "tail_x", "tail_y", "tail_xx", "tail_xy")
LAG_SUMS = ("tokens", "rows", "abs_prob_sum", "abs_prob_sq_sum", "exp_abs_sum", "log_ratio_sum")


def prefix_flags(old: torch.Tensor, rollout: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """bool [N]: the valid token lies in its row's leading run of rollout == 0.0 (with old != 0)."""
    zero = (rollout == 0) & (old != 0)
    breaks = (~zero).to(torch.int64)
    count = torch.cumsum(breaks, 0)  # breaks up to and including each token
    starts = torch.cumsum(lengths, 0) - lengths
    before = (count - breaks)[starts.clamp(max=max(old.numel() - 1, 0))] if old.numel() else count[:0]
    return (count - torch.repeat_interleave(before, lengths)) == 0


class EvidenceAccumulator(Accumulator):
    """Zero-filled row prefixes and the per-(step, version) gap sums."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.state = Reducer(device)
        self.lags: dict[tuple[int, float], np.ndarray] = {}
        self.version_kind = ""

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk in."""
        if chunk.num_tokens == 0:
            return
        self._prefixes(chunk)
        self._tail(chunk)
        self._zeros(chunk)
        if chunk.token_ids is not None:
            self._repeats(chunk)
        if chunk.policy_versions is not None and chunk.version_kind:
            self._lags(chunk)

    def _prefixes(self, chunk: Chunk) -> None:
        old, rollout, lengths = chunk.old, chunk.rollout, chunk.lengths
        if numpy_kernels(old):  # on the host: only a row whose first valid token is a 0.0 can hold a prefix
            starts = (np.cumsum(lengths.numpy()) - lengths.numpy())[lengths.numpy() > 0]
            if not np.any((rollout.numpy()[starts] == 0) & (old.numpy()[starts] != 0)):
                return
        flags = prefix_flags(old, rollout, lengths)
        per_row = chunk.row_count(flags)
        s = self.state
        s.add("prefix_zero_tokens", flags)
        s.add("prefix_zero_rows", per_row >= 2)
        s.add("prefix_zero_fills", flags & (chunk.abs_log_ratio > FILL_LOG_RATIO))

    def _tail(self, chunk: Chunk) -> None:
        s = self.state
        if numpy_kernels(chunk.old):
            where = np.flatnonzero(chunk.abs_log_ratio.numpy() >= BULK_LOG_RATIO)
            x = chunk.old.numpy()[where].astype(np.float64)
            y = chunk.rollout.numpy()[where].astype(np.float64)
            for name, value in zip(TAIL_SUMS, (float(where.size), x.sum(), y.sum(), x @ x, x @ y), strict=True):
                s.add(name, float(value))
            return
        tail = chunk.abs_log_ratio >= BULK_LOG_RATIO
        x = torch.where(tail, chunk.old.to(F64), 0.0)
        y = torch.where(tail, chunk.rollout.to(F64), 0.0)
        for name, value in zip(TAIL_SUMS, (tail, x, y, x * x, x * y), strict=True):
            s.add(name, value)

    def _zeros(self, chunk: Chunk) -> None:
        s = self.state
        if numpy_kernels(chunk.old):
            rollout, old = chunk.rollout.numpy(), chunk.old.numpy()
            where = np.flatnonzero(rollout == 0)
            where = where[old[where] != 0]
            excess = np.expm1(np.minimum(chunk.log_ratio.numpy()[where].astype(np.float64), RATIO_CAP_LOG))
            for name, value in zip(ZERO_SUMS, (float(where.size), excess.sum(), excess @ excess), strict=True):
                s.add(name, float(value))
            return
        zero = (chunk.rollout == 0) & (chunk.old != 0)
        excess = torch.where(zero, chunk.log_ratio.to(F64).clamp(max=RATIO_CAP_LOG).expm1(), 0.0)
        for name, value in zip(ZERO_SUMS, (zero, excess, excess * excess), strict=True):
            s.add(name, value)

    def _repeats(self, chunk: Chunk) -> None:
        ids = np.asarray(chunk.token_ids)
        lengths = chunk.lengths.cpu().numpy()
        row = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        low = int(ids.min()) if ids.size else 0
        if ids.size and int(ids.max()) - low < 1 << 32:  # one int64 key: a stable sort is 5x numpy's lexsort
            key = (row << 32) | (ids.astype(np.int64) - low)
            order = np.argsort(key, kind="stable")  # by row, then id, then position
            same = key[order][1:] == key[order][:-1]
        else:
            order = np.lexsort((np.arange(ids.size), ids, row))
            same = (row[order][1:] == row[order][:-1]) & (ids[order][1:] == ids[order][:-1])
        repeated = np.zeros(ids.size, dtype=bool)
        repeated[order[1:][same]] = True  # every occurrence after a row's first
        up = chunk.log_ratio.cpu().numpy() > 0
        s = self.state
        s.add("id_tokens", float(ids.size))
        s.add("repeated_tokens", float(np.count_nonzero(repeated)))
        s.add("id_tail_tokens", float(np.count_nonzero(up)))
        s.add("repeated_tail_tokens", float(np.count_nonzero(up & repeated)))

    def _lags(self, chunk: Chunk) -> None:
        gap = (torch.exp(chunk.old) - torch.exp(chunk.rollout)).abs_()
        sums = torch.stack([chunk.row_tokens, chunk.row_valid.to(F64), chunk.row_sum(gap), chunk.row_sum(gap * gap),
                            chunk.row_sum(torch.exp(chunk.abs_log_ratio)), chunk.log_ratio_row_sum]).cpu().numpy()
        versions = np.asarray(chunk.policy_versions, dtype=np.float64)
        steps = np.zeros(len(versions), dtype=np.int64) if chunk.steps is None else np.asarray(chunk.steps)
        known = np.isfinite(versions) & (chunk.lengths.cpu().numpy() > 0)
        if not known.any():
            return
        keys = np.stack([steps[known].astype(np.float64), versions[known]], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        folded = np.zeros((len(unique), len(LAG_SUMS)))
        np.add.at(folded, inverse.reshape(-1), sums[:, known].T)
        for (step, version), picked in zip(unique.tolist(), folded, strict=True):  # one per distinct version
            key = (int(step), float(version))
            self.lags[key] = self.lags.get(key, 0) + picked
        self.version_kind = chunk.version_kind

    def merge(self, other: EvidenceAccumulator) -> None:
        """Fold another shard's state in."""
        self.state.merge(other.state)
        for key, sums in other.lags.items():
            self.lags[key] = self.lags.get(key, 0) + sums
        self.version_kind = self.version_kind or other.version_kind

    def compute(self) -> Contribution:
        """The prefix counts and the per-(step, version) sums, for the findings' table."""
        table: dict[str, Any] = {name: int(self.state.get(name)) for name in
                                 ("prefix_zero_tokens", "prefix_zero_rows", "prefix_zero_fills", "tail_tokens",
                                  "zero_tokens", "id_tokens", "repeated_tokens", "id_tail_tokens",
                                  "repeated_tail_tokens")}
        table.update({name: self.state.get(name) for name in (*TAIL_SUMS[1:], *ZERO_SUMS[1:])})
        table["policy_versions"] = [{"step": step, "version": version,
                                     **{name: float(v) for name, v in zip(LAG_SUMS, sums, strict=True)}}
                                    for (step, version), sums in sorted(self.lags.items())]
        table["version_kind"] = self.version_kind if self.lags else None
        return Contribution(signatures=table)


__all__ = ["EvidenceAccumulator", "prefix_flags"]
