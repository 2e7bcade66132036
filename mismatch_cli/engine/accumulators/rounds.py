"""Multi-turn rounds: round k of a row is its k-th maximal run of 1s in the response mask.

Segmentation works on whole chunks with vectorized numpy (run starts and ends from shifted
masks, rows and round indices from searchsorted over the offsets), so no loop over rows or
tokens; every per-round statistic is a mergeable sum, count or sketch.
"""

from __future__ import annotations

import math

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.formulas import chi2
from mismatch_cli.engine.core.protocol import DIAG_PREFIX, Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64
from mismatch_cli.engine.kernels import sweep
from mismatch_cli.engine.kernels.ops import bincount, count_in_segments, repeat_segments
from mismatch_cli.engine.kernels.sketch import DENSE_GROUPS, NUM_BUCKETS, GroupedSketch, LogSketch

CATASTROPHIC_LOG_RATIO = math.log(1e4)  # a token ratio outside [1e-4, 1e4]
P99 = 0.99


# Per-round sums kept in the state, in this column order.
FEATURES = ("tokens", "abs_sum", "neg_log_ratio_sum", "k3_sum", "rho_sq_sum", "ratio_sum", "catastrophic",
            "is_weight_sum", "rs_rejected")


class RoundTable:
    """Sums per round index, growing with the largest round index seen."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros((0, len(FEATURES)), dtype=F64, device=device)
        self.rows = torch.zeros(0, dtype=F64, device=device)
        self.sketch = GroupedSketch(device)

    def _grow(self, size: int) -> None:
        if size > self.sums.shape[0]:
            pad = size - self.sums.shape[0]
            self.sums = torch.cat([self.sums, self.sums.new_zeros((pad, self.sums.shape[1]))])
            self.rows = torch.cat([self.rows, self.rows.new_zeros(pad)])

    def add(self, index: torch.Tensor, run_sums: torch.Tensor, token_index: torch.Tensor | None,
            buckets: torch.Tensor | None, size: int, counts: torch.Tensor | None = None) -> None:
        """Fold per-run sums into their rounds and per-token |delta| buckets into the round sketches.

        With `counts` ([groups, buckets], or every run in round 0) the bucket counts were already taken.
        """
        if index.numel() == 0:
            return
        self._grow(size)
        self.sums.index_add_(0, index, run_sums)
        self.rows[:size] += bincount(index, size).to(F64)
        if counts is not None:
            self.sketch.add_counts(counts)
        else:
            self.sketch.add_buckets(buckets, token_index, size)

    def merge(self, other: RoundTable) -> None:
        """Add another table's sums."""
        self._grow(other.sums.shape[0])
        size = other.sums.shape[0]
        self.sums[:size] += other.sums.to(self.sums.device)
        self.rows[:size] += other.rows.to(self.rows.device)
        self.sketch.merge(other.sketch)

    def pack(self) -> None:
        """Keep the round sketch's counts as their occupied buckets while nothing updates them."""
        self.sketch.pack()

    def compute(self, total_abs: float, has_is: bool, has_rs: bool, label: str) -> list[dict[str, float | None]]:
        """One mapping per round index; means are null for a round with no valid token."""
        sums = self.sums.cpu().tolist()
        rows = self.rows.cpu().tolist()
        p99 = self.sketch.quantile(P99, len(rows))  # every round at once: no per-round pass over the buckets
        table = []
        for k, (row_sums, reached) in enumerate(zip(sums, rows, strict=True)):
            f = dict(zip(FEATURES, row_sums, strict=True))
            tokens = f["tokens"]

            def mean(name: str, f: dict = f, tokens: float = tokens) -> float | None:
                return f[name] / tokens if tokens else None

            entry: dict[str, float | None] = {
                label: k,
                "rows": reached,
                "tokens": tokens,
                "abs_diff_mean": mean("abs_sum"),
                "abs_diff_p99": p99[k],
                "kl": mean("neg_log_ratio_sum"),
                "k3_kl": mean("k3_sum"),
                "chi2_token": chi2(f["rho_sq_sum"], tokens) if tokens else None,
                "ratio_mean": mean("ratio_sum"),
                "catastrophic_fraction": mean("catastrophic"),
                "abs_diff_share": f["abs_sum"] / total_abs if total_abs > 0 else None,
            }
            if has_is:
                entry["is_weight_mean"] = mean("is_weight_sum")
            if has_rs:
                entry["rs_masked_fraction"] = mean("rs_rejected")
            table.append(entry)
        return table


class RoundsAccumulator(Accumulator):
    """Per-round divergence from the start and from the end of each trajectory."""

    reads = frozenset({"is_token_weight", "is_row_weight", "rs_row_reject", "rs_token_reject"})

    def __init__(self, device: torch.device, tables: bool = True) -> None:
        self.device = device
        self.tables = tables  # the table indexed from the end (the overall batch's; a step reports its rounds only)
        self.from_start = RoundTable(device)
        self.from_end = RoundTable(device)
        self.total_rounds = 0
        self.max_rounds = 0
        self.has_is = False
        self.has_rs = False

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Segment the chunk into rounds and fold its per-round sums in (after IS / RS have run)."""
        runs = chunk.runs
        if runs.count == 0:
            return
        run_tokens = runs.valid_tokens
        run_tokens_f = run_tokens.to(F64)
        run_row = runs.row

        size = runs.max_per_row
        sketches = None
        if 1 < size <= DENSE_GROUPS and sweep.wanted(chunk.abs_log_ratio, chunk.fused):
            # Both tables' per-round sketches and the catastrophic tokens in one pass (engine/kernels/sweep.py), without
            # per-token round indices.
            sketches = sweep.round_sketches(chunk.abs_log_ratio, runs.valid_tokens, runs.index, runs.index_from_end,
                                            size, CATASTROPHIC_LOG_RATIO)
            catastrophic = sketches[2].to(F64)
        else:
            catastrophic = count_in_segments(chunk.abs_log_ratio > CATASTROPHIC_LOG_RATIO, run_tokens)
        run_sum = chunk.run_sum  # shared and cached (the fused CPU sweep takes several at once)
        log_ratio_sum = run_sum(chunk.log_ratio)
        columns = [
            run_tokens_f,
            run_sum(chunk.abs_log_ratio),
            -log_ratio_sum,
            run_sum(chunk.k3),
            run_sum(chunk.ratio_safe_sq),
            run_sum(chunk.ratio_safe),
            catastrophic,
        ]
        zeros = torch.zeros_like(run_tokens_f)
        if decisions.is_token_weight is not None:
            columns.append(run_sum(decisions.is_token_weight))
        elif decisions.is_row_weight is not None:
            columns.append(decisions.is_row_weight[run_row] * run_tokens_f)
        else:
            columns.append(zeros)
        self.has_is |= decisions.is_token_weight is not None or decisions.is_row_weight is not None
        if decisions.rs_row_reject is not None:
            self.has_rs = True
            token_reject = decisions.rs_token_reject
            from_tokens = run_sum(token_reject) if token_reject is not None else zeros  # float64 counts
            columns.append(torch.where(decisions.rs_row_reject[run_row], run_tokens_f, from_tokens))
        else:
            columns.append(zeros)
        table = torch.stack(columns, dim=1)
        tokens = chunk.num_tokens
        if size == 1:  # single-turn: every token is round 0 from both ends
            counts = bincount(LogSketch.buckets(chunk.abs_log_ratio), NUM_BUCKETS)
            self.from_start.add(runs.index, table, None, None, 1, counts)
            self.from_end.add(runs.index_from_end, table, None, None, 1, counts)
        elif sketches is not None:
            from_start, from_end, _ = sketches
            self.from_start.add(runs.index, table, None, None, size, from_start)
            self.from_end.add(runs.index_from_end, table, None, None, size, from_end)
        else:
            buckets = LogSketch.buckets(chunk.abs_log_ratio)
            self.from_start.add(runs.index, table, repeat_segments(runs.index, run_tokens, tokens), buckets, size)
            self.from_end.add(runs.index_from_end, table, repeat_segments(runs.index_from_end, run_tokens, tokens),
                              buckets, size)
        self.total_rounds += runs.count
        self.max_rounds = max(self.max_rounds, size)

    def merge(self, other: RoundsAccumulator) -> None:
        """Fold another shard's rounds in."""
        self.from_start.merge(other.from_start)
        self.from_end.merge(other.from_end)
        self.total_rounds += other.total_rounds
        self.max_rounds = max(self.max_rounds, other.max_rounds)
        self.has_is |= other.has_is
        self.has_rs |= other.has_rs

    def pack(self) -> None:
        """Keep both tables' sketch counts as their occupied buckets while nothing updates them."""
        self.from_start.pack()
        self.from_end.pack()

    def compute(self) -> Contribution:
        """`diag/rounds`, verl PR #5229's `per_round/` keys, the per-round table and the one indexed from the end."""
        total_abs = float(self.from_start.sums[:, 1].sum().item()) if self.from_start.sums.numel() else 0.0
        rounds = self.from_start.compute(total_abs, self.has_is, self.has_rs, "round")
        from_end = self.from_end.compute(total_abs, self.has_is, self.has_rs, "round_from_end") if self.tables else []
        metrics: dict[str, float | None] = {DIAG_PREFIX + "rounds": float(self.total_rounds),
                                            "per_round/total_rounds": float(self.max_rounds)}
        best_k, best_value = -1, 0.0
        for entry in rounds:
            k = int(entry["round"])
            metrics[f"per_round/round_{k}_abs_diff_mean"] = entry["abs_diff_mean"]
            metrics[f"per_round/round_{k}_token_count"] = entry["tokens"]
            value = entry["abs_diff_mean"]
            if value is not None and (best_k < 0 or value > best_value):
                best_k, best_value = k, value
        metrics["per_round/max_round_diff"] = float(best_k)
        metrics["per_round/max_diff_value"] = best_value
        return Contribution(metrics=metrics, rounds=rounds, rounds_from_end=from_end)
