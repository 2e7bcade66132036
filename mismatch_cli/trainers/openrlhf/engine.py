"""OpenRLHF 0.11.2's `vllm_kl` and `is_filter_ratio`, replayed per micro-batch and averaged as OpenRLHF averages them.

Formulas: docs/openrlhf-semantics.md; the settings come resolved as an `OpenrlhfSpec` (`settings.py`).
OpenRLHF computes both keys in its policy loss, once per micro-batch of `micro_train_batch_size` rows (dump order
here; a short last micro-batch is dropped, as its DataLoader's `drop_last` does), rounds each to float32, weights
it by the micro-batch's token count (the weighted value passes through a float32 all-reduce), and logs the
token-weighted mean over micro-batches. A micro-batch without a token makes OpenRLHF divide by zero: no value.

Only masked-in tokens are read (`chunk.masked`, whatever their value): OpenRLHF strips a row's right padding and
pads again with zeros, which every formula multiplies away. Each row is first reduced to a few numbers
(`_row_stats`); micro-batches a chunk holds whole are folded into the `Reducer` at once, those cut by a chunk's edge
keep their rows' numbers until `compute`.
"""

from __future__ import annotations

import torch

from mismatch_cli.engine.accumulators.microbatch import MicroBatchRows
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.engine.kernels.ops import segment_count, segment_sum
from mismatch_cli.trainers.openrlhf.settings import OpenrlhfSpec

KEYS = ("train/vllm_kl", "train/is_filter_ratio")
COLUMNS = ("tokens", "kl_sum", "filtered_tokens", "filtered_row")
C = {name: i for i, name in enumerate(COLUMNS)}
P_LOW, P_HIGH = 1e-6, 1 - 1e-6  # the probability clamp of the divergence gates


def _statistic(old: torch.Tensor, rollout: torch.Tensor, gating: str) -> torch.Tensor:
    """The per-token statistic the gate reads: the log-ratio (ratio gating, exp taken later) or a divergence."""
    if gating == "ratio":
        return old - rollout
    p = rollout.exp().clamp(P_LOW, P_HIGH)
    q = old.exp().clamp(P_LOW, P_HIGH)
    if gating == "binary_kl":
        return p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
    return (p - q).abs()


def _outside(stat: torch.Tensor, spec: OpenrlhfSpec) -> torch.Tensor:
    """Filtered units: clip counts those strictly outside the band (NaN is not), mask those not inside it (NaN is)."""
    if spec.mode == "clip":
        return (stat < spec.low) | (stat > spec.high)
    return ~((stat >= spec.low) & (stat <= spec.high))


def _row_stats(chunk: Chunk, spec: OpenrlhfSpec) -> torch.Tensor:
    """Per row [B, len(COLUMNS)] float64: token count, sum of rollout − old, filtered tokens, filtered row."""
    old, rollout, lengths = chunk.masked
    out = torch.zeros(lengths.numel(), len(COLUMNS), dtype=F64, device=old.device)
    out[:, C["tokens"]] = lengths.to(F64)
    out[:, C["kl_sum"]] = segment_sum(rollout - old, lengths).to(F64)  # summed in the compute dtype
    stat = _statistic(old, rollout, spec.gating)
    if spec.level == "token":
        token = stat.exp() if spec.gating == "ratio" else stat
        out[:, C["filtered_tokens"]] = segment_count(_outside(token, spec), lengths).to(F64)
    else:  # the row's masked mean of the statistic (0/0 = NaN for an empty row); a geometric mean for the ratio
        mean = segment_sum(stat, lengths) / lengths.to(stat.dtype)
        row = mean.exp() if spec.gating == "ratio" else mean
        out[:, C["filtered_row"]] = _outside(row, spec).to(F64)
    return out


def _finalize(stats: torch.Tensor, mb: torch.Tensor, spec: OpenrlhfSpec, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per micro-batch (sorted ids): its token count and each key's value as the loss returns it, as float64."""
    _, inverse = torch.unique(mb, sorted=True, return_inverse=True)
    k = int(inverse.max().item()) + 1

    def sums(column: str, kind: torch.dtype) -> torch.Tensor:
        return torch.zeros(k, dtype=kind, device=stats.device).index_add_(0, inverse, stats[:, C[column]].to(kind))

    f32 = torch.float32
    tokens = sums("tokens", F64)
    rows = torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, torch.ones_like(stats[:, 0]))
    kl = sums("kl_sum", dtype) / tokens.to(dtype)  # masked_mean over the micro-batch, in the compute dtype
    if spec.level == "token":  # masked_mean of the float32 flags
        share = sums("filtered_tokens", f32) / tokens.to(f32)
    else:  # mean of the float32 row flags over every row
        share = sums("filtered_row", f32) / rows.to(f32)
    return {"tokens": tokens, KEYS[0]: kl.to(F64), KEYS[1]: share.to(F64)}


def _fold(state: Reducer, values: dict[str, torch.Tensor]) -> None:
    """Fold whole micro-batches: OpenRLHF's float32 rounding and token weighting (ppo_actor.py: ppo_train)."""
    tokens = values["tokens"]
    empty = tokens == 0
    state.add("micro_batches", float(tokens.numel()))
    state.add("empty_micro_batches", empty.to(F64))
    state.add("tokens", tokens)
    safe = torch.where(empty, torch.ones_like(tokens), tokens)
    for key in KEYS:
        value = values[key].to(torch.float32).to(F64)  # value.float().mean().item()
        reduced = (value * tokens).to(torch.float32).to(F64)  # strategy.all_reduce: a float32 tensor
        merged = torch.where(empty, torch.zeros_like(value), reduced / safe)
        state.add(key, merged * tokens)


class OpenrlhfAccumulator(Accumulator):
    """OpenRLHF's `train/vllm_kl` and `train/is_filter_ratio`: per micro-batch values, then a token-weighted mean."""

    def __init__(self, spec: OpenrlhfSpec, device: torch.device) -> None:
        self.spec = spec
        self.state = Reducer(device)
        self.dtype = torch.float64
        self.rows = MicroBatchRows(spec.micro_batch_size)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: whole micro-batches at once, the rows of the cut ones kept for `compute`."""
        self.dtype = chunk.masked[0].dtype
        whole = self.rows.whole(chunk.source, chunk.first_row, _row_stats(chunk, self.spec))
        if whole is not None:
            _fold(self.state, _finalize(*whole, self.spec, self.dtype))

    def merge(self, other: OpenrlhfAccumulator) -> None:
        """Fold another shard of the same dump in."""
        self.state.merge(other.state)
        self.dtype = other.dtype
        self.rows.merge(other.rows)

    def compute(self) -> Contribution:
        """The keys as OpenRLHF logs them for one training step on one process."""
        state = Reducer(self.state.device)
        state.merge(self.state)
        dropped = 0
        for stats, mb in self.rows.joined():
            if stats.shape[0] < self.spec.micro_batch_size:  # the DataLoader's drop_last
                dropped += stats.shape[0]
                continue
            _fold(state, _finalize(stats, mb, self.spec, self.dtype))
        notes = []
        if dropped:
            notes.append(f"{dropped} row(s) after the last whole micro-batch of micro_train_batch_size="
                         f"{self.spec.micro_batch_size} left out, as OpenRLHF's DataLoader(drop_last=True) does")
        if not state.get("micro_batches"):
            notes.append(f"no whole micro-batch of micro_train_batch_size={self.spec.micro_batch_size} rows: "
                         "OpenRLHF logs nothing")
            return Contribution(family=dict.fromkeys(KEYS), notes=notes)
        if state.get("empty_micro_batches"):
            notes.append(f"{state.get('empty_micro_batches'):.0f} micro-batch(es) without a masked-in token: "
                         "OpenRLHF's ppo_train divides by their token count (ZeroDivisionError), so "
                         "train/vllm_kl and train/is_filter_ratio have no value")
            return Contribution(family=dict.fromkeys(KEYS), notes=notes)
        tokens = state.get("tokens")
        family: dict[str, float | None] = {key: state.get(key) / tokens for key in KEYS}
        return Contribution(family=family, notes=notes)


__all__ = ["KEYS", "OpenrlhfAccumulator"]
