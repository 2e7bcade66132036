"""SkyRL 0.4.0's off-policy correction keys, replayed per micro-batch and averaged as SkyRL averages them.

Formulas: docs/skyrl-semantics.md; the settings come resolved as a `SkyrlSpec` (`settings.py`). SkyRL
runs its correction on each micro-batch of `micro_train_batch_size_per_gpu` rows (dump order here), logs one
value per key per micro-batch, then takes the mean over micro-batches (a key ending in `_max` / `_min`: Python's
max / min of the list). Every masked-in token is read whatever its value (`chunk.masked`), and the padding
positions of a row matter too: `ratio * mask` is 0 there (NaN for a NaN log-ratio), and a non-finite log-ratio
under a zero mask makes a sequence sum NaN. A micro-batch is padded to its longest stored row.

Each row is first reduced to a few numbers (`_row_stats`), a micro-batch's values come from its rows' numbers
(`_finalize`); micro-batches a chunk holds whole are folded into the `Reducer` at once, those cut by a chunk's
edge keep their rows' numbers (at most two micro-batches per chunk) until `compute`.
"""

from __future__ import annotations

import math

import torch

from mismatch_cli.engine.accumulators.microbatch import MicroBatchRows
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Reducer
from mismatch_cli.engine.kernels.ops import segment_count, segment_max, segment_sum
from mismatch_cli.trainers.skyrl.settings import SkyrlSpec

PREFIX = "policy/loss_metrics/"
CLAMP = 20.0  # safe_exp_delta's clip
# The per-row numbers, one column each.
COLUMNS = ("positions", "tokens", "mean", "m2", "max", "min", "nan", "over", "under", "outlier", "tm_valid",
           "tm_masked", "tis_capped", "tis_tokens", "seq_capped", "seq_over", "seq_under", "seq_masked")
C = {name: i for i, name in enumerate(COLUMNS)}


def safe_exp(delta: torch.Tensor) -> torch.Tensor:
    """SkyRL's safe_exp_delta: to float32, clamp to [-20, 20], exp, back to the input dtype."""
    return torch.clamp(delta.to(torch.float32), -CLAMP, CLAMP).exp().to(delta.dtype)


def skyrl_keys(spec: SkyrlSpec) -> tuple[str, ...]:
    """The keys SkyRL logs for these settings, without the prefix."""
    keys = ["is_ratio_mean", "is_ratio_std", "is_ratio_max", "is_ratio_min"]
    if spec.outlier:
        keys += ["outlier_seq_masked_ratio", "outlier_seq_over_high_ratio", "outlier_seq_under_low_ratio"]
    if spec.token_mask:
        keys.append("token_mask_ratio")
    if spec.tis_ratio_type == "token":
        keys.append("tis_token_clip_high_ratio")
    elif spec.tis_ratio_type == "sequence":
        keys.append("tis_seq_clip_high_ratio")
    if spec.sequence_mask_metric is not None:
        name = "geo" if spec.sequence_mask_metric == "geometric" else "product"
        keys += [f"{name}_sequence_mask_{part}_ratio" for part in ("masked", "over_high", "under_low")]
    return tuple(keys)


def _row_stats(chunk: Chunk, spec: SkyrlSpec) -> torch.Tensor:
    """Per row [B, len(COLUMNS)] float64: the numbers its micro-batch's keys are built from."""
    old, rollout, lengths = chunk.masked
    delta = old - rollout
    dtype = delta.dtype
    ratio = safe_exp(delta)
    rows = lengths.numel()
    row = torch.repeat_interleave(torch.arange(rows, device=delta.device), lengths)
    out = torch.zeros(rows, len(COLUMNS), dtype=F64, device=delta.device)
    # The stored positions: a masked-out one still counts through `ratio * mask` and `delta * mask`.
    p_old, p_rollout, p_mask = chunk.positions
    per_row = chunk.layout.offsets[1:] - chunk.layout.offsets[:-1]
    p_delta = p_old.to(dtype) - p_rollout.to(dtype)
    outside = ~p_mask.bool()
    pad_nan = segment_count(torch.isnan(p_delta) & outside, per_row) > 0
    pad_bad = segment_count(~torch.isfinite(p_delta) & outside, per_row) > 0
    out[:, C["positions"]] = per_row.to(F64)
    out[:, C["tokens"]] = lengths.to(F64)
    # The raw ratio's token statistics (NaN ratios left out here and flagged).
    nan = torch.isnan(ratio)
    clean = torch.where(nan, torch.zeros_like(ratio), ratio).to(F64)
    mean = segment_sum(clean, lengths) / lengths.clamp(min=1).to(F64)
    out[:, C["mean"]] = mean
    out[:, C["m2"]] = segment_sum((clean - mean[row]) ** 2, lengths)
    out[:, C["max"]] = torch.where(lengths > 0, segment_max(torch.where(nan, -math.inf, clean), lengths), -math.inf)
    out[:, C["min"]] = torch.where(lengths > 0, -segment_max(torch.where(nan, -math.inf, -clean), lengths), math.inf)
    out[:, C["nan"]] = ((segment_count(nan, lengths) > 0) | pad_nan).to(F64)
    # Outlier-token mask: a row with a token outside the bounds is dropped.
    over = ratio > spec.outlier_high if spec.outlier_high is not None else torch.zeros_like(nan)
    under = ratio < spec.outlier_low if spec.outlier_low is not None else torch.zeros_like(nan)
    row_over, row_under = segment_count(over, lengths) > 0, segment_count(under, lengths) > 0
    keep_row = ~(row_over | row_under) if spec.outlier else torch.ones_like(row_over)
    out[:, C["over"]], out[:, C["under"]] = row_over.to(F64), row_under.to(F64)
    out[:, C["outlier"]] = (~keep_row).to(F64)
    kept = keep_row[row]
    # Per-token mask, on what the outlier mask left.
    if spec.token_mask:
        inside = (ratio >= spec.token_mask_low) & (ratio <= spec.token_mask_high)
        out[:, C["tm_valid"]] = segment_count(kept, lengths).to(F64)
        out[:, C["tm_masked"]] = segment_count(kept & ~inside, lengths).to(F64)
        kept = kept & inside
    # Token TIS: share of the remaining tokens above the cap.
    out[:, C["tis_capped"]] = segment_count(kept & (ratio > spec.token_tis_ratio_clip_high), lengths).to(F64)
    out[:, C["tis_tokens"]] = segment_count(kept, lengths).to(F64)
    # Sequence sums over the remaining tokens, in the compute dtype; delta * 0 is NaN for a non-finite delta.
    total = segment_sum(torch.where(kept, delta, torch.zeros_like(delta)), lengths)
    dropped_bad = segment_count(~kept & ~torch.isfinite(delta), lengths) > 0
    total = torch.where(pad_bad | dropped_bad, torch.full_like(total, math.nan), total)
    out[:, C["seq_capped"]] = (safe_exp(total) > spec.sequence_tis_ratio_clip_high).to(F64)
    if spec.sequence_mask_metric is not None:
        if spec.sequence_mask_metric == "geometric":
            count = segment_count(kept, lengths).to(dtype).clamp(min=1.0)
            value, low, high = safe_exp(total / count), spec.geo_mask_low, spec.geo_mask_high
        else:
            value, low, high = safe_exp(total), spec.product_mask_low, spec.product_mask_high
        seq_over, seq_under = value > high, value < low
        out[:, C["seq_over"]], out[:, C["seq_under"]] = seq_over.to(F64), seq_under.to(F64)
        out[:, C["seq_masked"]] = (seq_over | seq_under).to(F64)
    return out


def _fraction(count: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """count / total as SkyRL's integer-tensor division gives it: rounded to float32."""
    return (count.to(torch.float32) / total.to(torch.float32)).to(F64)


def _finalize(stats: torch.Tensor, mb: torch.Tensor, spec: SkyrlSpec) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each micro-batch's key values (float64 [K]) from its rows' numbers; the micro-batch ids, sorted."""
    ids, inverse = torch.unique(mb, sorted=True, return_inverse=True)
    k = ids.numel()

    def sums(column: str) -> torch.Tensor:
        return torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, stats[:, C[column]])

    def reduce(column: str, how: str, start: float) -> torch.Tensor:
        base = torch.full((k,), start, dtype=F64, device=stats.device)
        return base.scatter_reduce(0, inverse, stats[:, C[column]], how, include_self=True)

    rows = torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, torch.ones_like(stats[:, 0]))
    width = reduce("positions", "amax", 0.0)
    tokens = sums("tokens")
    mean = torch.where(tokens > 0, sums_weighted(stats, inverse, k) / tokens.clamp(min=1.0), torch.zeros_like(tokens))
    m2 = sums("m2") + torch.zeros(k, dtype=F64, device=stats.device).index_add_(
        0, inverse, stats[:, C["tokens"]] * (stats[:, C["mean"]] - mean[inverse]) ** 2)
    elements = rows * width
    zeros = elements - tokens
    m2_all = m2 + torch.where(elements > 0, tokens * zeros / elements.clamp(min=1.0) * mean**2, torch.zeros_like(m2))
    nan = reduce("nan", "amax", 0.0) > 0
    nan_value = torch.full_like(mean, math.nan)
    std = torch.where(elements > 1, torch.sqrt(m2_all / (elements - 1).clamp(min=1.0)), nan_value)
    high = torch.maximum(reduce("max", "amax", -math.inf), torch.where(zeros > 0, 0.0, -math.inf))
    low = torch.minimum(reduce("min", "amin", math.inf), torch.where(zeros > 0, 0.0, math.inf))
    values = {
        "is_ratio_mean": mean * tokens / tokens.clamp(min=1.0),
        "is_ratio_std": std, "is_ratio_max": high, "is_ratio_min": low,
    }
    values = {key: torch.where(nan, nan_value, value) for key, value in values.items()}
    values.update({
        "outlier_seq_masked_ratio": _fraction(sums("outlier"), rows),
        "outlier_seq_over_high_ratio": _fraction(sums("over"), rows),
        "outlier_seq_under_low_ratio": _fraction(sums("under"), rows),
        "token_mask_ratio": _fraction(sums("tm_masked"), sums("tm_valid").clamp(min=1.0)),
        "tis_token_clip_high_ratio": _fraction(sums("tis_capped"), sums("tis_tokens").clamp(min=1.0)),
        "tis_seq_clip_high_ratio": _fraction(sums("seq_capped"), rows),
    })
    name = "geo" if spec.sequence_mask_metric == "geometric" else "product"
    for part, column in (("masked", "seq_masked"), ("over_high", "seq_over"), ("under_low", "seq_under")):
        values[f"{name}_sequence_mask_{part}_ratio"] = _fraction(sums(column), rows)
    return ids, {key: values[key] for key in skyrl_keys(spec)}


def sums_weighted(stats: torch.Tensor, inverse: torch.Tensor, k: int) -> torch.Tensor:
    """Per micro-batch: the sum of the ratios of its tokens (each row's mean times its token count)."""
    weighted = stats[:, C["mean"]] * stats[:, C["tokens"]]
    return torch.zeros(k, dtype=F64, device=stats.device).index_add_(0, inverse, weighted)


def _fold(state: Reducer, ids: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
    """Fold whole micro-batches' values into the running sums (mean keys) and extrema (_max / _min keys)."""
    state.add("micro_batches", float(ids.numel()))
    first = ids == 0
    for key, value in values.items():
        if key.endswith(("_max", "_min")):
            # Python's max / min over the list: NaN only when the first micro-batch's value is NaN.
            nan = torch.isnan(value)
            state.add(key + ":first_nan", (nan & first).to(F64))
            fill = -math.inf if key.endswith("_max") else math.inf
            clean = torch.where(nan, torch.full_like(value, fill), value)
            (state.max if key.endswith("_max") else state.min)(key, clean)
        else:
            state.add(key, value)


class SkyrlAccumulator(Accumulator):
    """SkyRL's `policy/loss_metrics/*` keys: per micro-batch values, then their mean (max / min for _max / _min)."""

    def __init__(self, spec: SkyrlSpec, device: torch.device) -> None:
        self.spec = spec
        self.keys = skyrl_keys(spec)
        self.state = Reducer(device)
        self.rows = MicroBatchRows(spec.micro_batch_size)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: whole micro-batches at once, the rows of the cut ones kept for `compute`."""
        whole = self.rows.whole(chunk.source, chunk.first_row, _row_stats(chunk, self.spec))
        if whole is not None:
            _fold(self.state, *_finalize(*whole, self.spec))

    def merge(self, other: SkyrlAccumulator) -> None:
        """Fold another shard of the same dump in."""
        self.state.merge(other.state)
        self.rows.merge(other.rows)

    def compute(self) -> Contribution:
        """The keys as SkyRL logs them for one mini-batch on one process."""
        state = Reducer(self.state.device)
        state.merge(self.state)
        for stats, mb in self.rows.joined():
            _fold(state, *_finalize(stats, mb, self.spec))
        count = state.get("micro_batches")
        family: dict[str, float | None] = {}
        for key in self.keys:
            if not count:
                family[PREFIX + key] = None
            elif key.endswith(("_max", "_min")):
                family[PREFIX + key] = math.nan if state.get(key + ":first_nan") else state.get(key)
            else:
                family[PREFIX + key] = state.get(key) / count
        notes = [] if count else ["no row: SkyRL logs nothing for an empty batch"]
        return Contribution(family=family, notes=notes)


__all__ = ["PREFIX", "SkyrlAccumulator", "safe_exp", "skyrl_keys"]
