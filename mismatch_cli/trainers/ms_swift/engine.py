"""ms-swift 4.6.0's `rollout_correction/*` keys, replayed per micro-batch and averaged as its `log` averages them.

Formulas: docs/ms-swift-semantics.md; the settings come resolved as a `MsSwiftSpec` (`settings.py`). The
trainer computes its keys on each micro-batch of `per_device_train_batch_size` rows (dump order here), in the
compute dtype, and `log` takes the float64 mean of each key's per-micro-batch values (the `_max` / `_min` keys too;
a NaN in one micro-batch makes the key NaN). Every masked-in token is read whatever its value (`chunk.masked`);
padding positions never count (the trainer holds finite values there and multiplies each term by the mask).

Each row is first reduced to a few numbers (`_row_stats`), a micro-batch's values come from its rows' numbers
(`_finalize`); micro-batches a chunk holds whole are summed into the `Reducer` at once, those cut by a chunk's edge
keep their rows' numbers (at most two micro-batches per chunk) until `compute`.
"""

from __future__ import annotations

import numpy as np
import torch

from mismatch_cli.engine.accumulators.microbatch import MicroBatchRows
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.trainers.ms_swift.settings import MsSwiftSpec

PREFIX = "rollout_correction/"
CLAMP = 20.0  # SAFETY_BOUND
DIAGNOSTICS = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
               "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
CORRECTION = ("is_weight_mean", "ess", "clipped_frac")
# The per-row numbers, one column each.
COLUMNS = ("tokens", "neg_d", "k3", "rho2", "train_ppl", "train_log_ppl", "roll_ppl", "roll_log_ppl", "diff",
           "ppl_ratio", "geo2", "w", "wc", "wc2", "clipped", "seq_clipped")
C = {name: i for i, name in enumerate(COLUMNS)}


def ms_swift_keys(spec: MsSwiftSpec) -> tuple[str, ...]:
    """The keys ms-swift logs for these settings, without the prefix."""
    return DIAGNOSTICS + (CORRECTION if spec.mode is not None else ())


def _segment(values: torch.Tensor, row: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-row float64 sums of token values (NaN and inf propagate as in a sum)."""
    return torch.zeros(rows, dtype=F64, device=values.device).index_add_(0, row, values.to(F64))


def _row_stats(chunk: Chunk, spec: MsSwiftSpec) -> torch.Tensor:
    """Per row [B, len(COLUMNS)] float64: the numbers its micro-batch's keys are built from."""
    old, rollout, lengths = chunk.masked
    dtype = old.dtype
    rows = lengths.numel()
    row = torch.repeat_interleave(torch.arange(rows, device=old.device), lengths)
    out = torch.zeros(rows, len(COLUMNS), dtype=F64, device=old.device)
    count = lengths.to(F64).clamp(min=1.0)
    d = old - rollout
    safe = d.clamp(-CLAMP, CLAMP)
    rho = safe.exp()
    out[:, C["tokens"]] = lengths.to(F64)
    out[:, C["neg_d"]] = _segment(-d, row, rows)
    out[:, C["k3"]] = _segment((rho - safe - 1).clamp(-10.0, 10.0), row, rows)
    out[:, C["rho2"]] = _segment(rho.square(), row, rows)
    # Per-row means in float64, then each exp in the compute dtype (float32 overflows where the trainer's does).
    mean_old = _segment(old, row, rows) / count
    mean_rollout = _segment(rollout, row, rows) / count
    mean_d = _segment(d, row, rows) / count

    def exp(values: torch.Tensor) -> torch.Tensor:
        return values.to(dtype).exp().to(F64)

    out[:, C["train_ppl"]], out[:, C["train_log_ppl"]] = exp(-mean_old), -mean_old
    out[:, C["roll_ppl"]], out[:, C["roll_log_ppl"]] = exp(-mean_rollout), -mean_rollout
    diff = mean_rollout - mean_old
    out[:, C["diff"]], out[:, C["ppl_ratio"]] = diff, exp(diff)
    out[:, C["geo2"]] = mean_d.clamp(-CLAMP, CLAMP).to(dtype).exp().square().to(F64)
    if spec.mode is None:
        return out
    threshold = spec.threshold
    # The sequence ratio: geometric mean of the clamped token ratios (each floored at 1e-10 before the log).
    seq = exp(_segment(rho.clamp(min=1e-10).log(), row, rows) / count)
    if spec.mode == "token_truncate":
        w = rho.clamp(max=threshold)
    elif spec.mode == "token_mask":
        w = torch.where(rho <= threshold, rho, torch.zeros_like(rho))
    elif spec.mode == "sequence_truncate":
        w = seq.clamp(max=threshold).to(dtype)[row]
    else:
        w = rho * (seq <= threshold).to(dtype)[row]
    wc = w.clamp(min=1.0 / threshold, max=threshold)  # torch.clamp: max wins where min > max
    out[:, C["w"]], out[:, C["wc"]] = _segment(w, row, rows), _segment(wc, row, rows)
    out[:, C["wc2"]] = _segment(wc.to(F64).square(), row, rows)
    if spec.mode == "token_truncate":
        out[:, C["clipped"]] = _segment((rho > threshold).to(F64), row, rows)
    elif spec.mode == "token_mask":
        out[:, C["clipped"]] = _segment((w == 0).to(F64), row, rows)
    out[:, C["seq_clipped"]] = (seq > threshold).to(F64)
    return out


def _finalize(stats: torch.Tensor, mb: torch.Tensor, spec: MsSwiftSpec, dtype: torch.dtype
              ) -> dict[str, torch.Tensor]:
    """Each micro-batch's key values (float64 [K], rounded to the compute dtype as the trainer's stack keeps them)."""
    ids, inverse = torch.unique(mb, sorted=True, return_inverse=True)
    k = ids.numel()

    def sums(column: str) -> torch.Tensor:
        return torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, stats[:, C[column]])

    def extreme(how: str) -> torch.Tensor:
        # torch.max / min over the rows: NaN wins.
        fill = -np.inf if how == "amax" else np.inf
        values = stats[:, C["diff"]]
        base = torch.full((k,), fill, dtype=F64, device=stats.device)
        out = base.scatter_reduce(0, inverse, torch.nan_to_num(values, nan=fill, posinf=np.inf, neginf=-np.inf),
                                  how, include_self=True)
        nan = torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, torch.isnan(values).to(F64))
        return torch.where(nan > 0, torch.full_like(out, np.nan), out)

    rows = torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, torch.ones_like(stats[:, 0]))
    tokens = sums("tokens").clamp(min=1.0)
    values = {
        "training_ppl": sums("train_ppl") / rows, "training_log_ppl": sums("train_log_ppl") / rows,
        "kl": sums("neg_d") / tokens, "k3_kl": sums("k3") / tokens,
        "rollout_ppl": sums("roll_ppl") / rows, "rollout_log_ppl": sums("roll_log_ppl") / rows,
        "log_ppl_diff": sums("diff") / rows,
        "log_ppl_abs_diff": torch.zeros(k, dtype=F64, device=stats.device).index_add_(
            0, inverse, stats[:, C["diff"]].abs()) / rows,
        "log_ppl_diff_max": extreme("amax"), "log_ppl_diff_min": extreme("amin"),
        "ppl_ratio": sums("ppl_ratio") / rows,
        "chi2_token": sums("rho2") / tokens - 1.0, "chi2_seq": sums("geo2") / rows - 1.0,
    }
    if spec.mode is not None:
        mean = sums("wc") / tokens
        second = sums("wc2") / (mean + 1e-8).square() / tokens
        values["is_weight_mean"] = sums("w") / tokens
        values["ess"] = 1.0 / second.clamp(min=1e-10)
        token_level = spec.mode.startswith("token")
        share = sums("clipped") / tokens if token_level else sums("seq_clipped") / rows
        values["clipped_frac"] = share.to(torch.float32).to(F64)  # `.float()` of the flags: float32 in any dtype
    return {key: values[key].to(dtype).to(F64) for key in ms_swift_keys(spec)}


class MsSwiftAccumulator(Accumulator):
    """ms-swift's `rollout_correction/*` keys: per micro-batch values, then their mean over micro-batches."""

    def __init__(self, spec: MsSwiftSpec, device: torch.device) -> None:
        self.spec = spec
        self.keys = ms_swift_keys(spec)
        self.state = Reducer(device)
        self.dtype = torch.float64
        self.rows = MicroBatchRows(spec.micro_batch_size)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: whole micro-batches at once, the rows of the cut ones kept for `compute`."""
        self.dtype = chunk.old.dtype
        whole = self.rows.whole(chunk.source, chunk.first_row, _row_stats(chunk, self.spec))
        if whole is not None:
            self._fold(self.state, _finalize(*whole, self.spec, self.dtype))

    @staticmethod
    def _fold(state: Reducer, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            state.add(key, value)
        state.add("micro_batches", float(next(iter(values.values())).numel()))

    def merge(self, other: MsSwiftAccumulator) -> None:
        """Fold another shard of the same dump in."""
        self.state.merge(other.state)
        self.dtype = other.dtype if other.state.values or other.rows.edges else self.dtype
        self.rows.merge(other.rows)

    def compute(self) -> Contribution:
        """The keys as ms-swift's `log` writes them for one logging window on one process."""
        state = Reducer(self.state.device)
        state.merge(self.state)
        for stats, mb in self.rows.joined():
            self._fold(state, _finalize(stats, mb, self.spec, self.dtype))
        count = state.get("micro_batches")
        family: dict[str, float | None] = {
            PREFIX + key: (state.get(key) / count if count else None) for key in self.keys}
        notes = [] if count else ["no row: ms-swift logs nothing for an empty batch"]
        return Contribution(family=family, notes=notes)


__all__ = ["MsSwiftAccumulator", "PREFIX", "ms_swift_keys"]
