"""slime's train/rollout mismatch keys (624b824a): its loss hook (`SlimeSpec`) and its MIS helper (`SlimeMisSpec`).

Formulas: docs/slime-semantics.md. slime reads every loss-mask-1 token whatever its value, so both accumulators
work on the chunk's `masked` tokens. Every key is a per-token quantity (a per-sample one is spread over the
sample's tokens) put through slime's reducer: per sample the sum over its mask-1 tokens / max(tokens, 1), summed
over samples / samples in the step; with `calculate_per_token_loss`, the sum over all tokens / the sum over samples
of max(tokens, 1). Each sample is its own rollout (the dump carries no rollout id). Sums are float64 per row, so
the numbers do not depend on chunking; the MIS helper's batch normalization divides at compute time.
"""

from __future__ import annotations

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import Reducer
from mismatch_cli.engine.kernels.ops import F64, segment_max, segment_sum
from mismatch_cli.trainers.slime.settings import SlimeMisSpec, SlimeSpec

TRAIN = "train/"
MIS = "train/mis_"
ABS_DIFF = "train/train_rollout_logprob_abs_diff"
OIS = "train/ois"
OIS_NOTE = ("train/ois needs the policy's log-probs at the loss step (exp(current - old)); the dump holds the old "
            "ones only (it is 1.0 per token on the first optimizer step of a rollout)")
SAFETY_BOUND = 20.0  # mis.py clamps log-ratios to [-20, 20] before exp
NORMALIZE_FLOOR = 1e-8  # mis.py divides by the batch mean only above this


class _SlimeReducer:
    """slime's `sum_of_sample_mean` over a whole step: per-row sums in, the logged value out."""

    def __init__(self, per_token: bool, device: torch.device) -> None:
        self.per_token = per_token
        self.state = Reducer(device)
        self.keys: list[str] = []

    def rows(self, lengths: torch.Tensor) -> None:
        """Count one chunk's samples and their max(tokens, 1) denominators."""
        self.state.add("rows", float(lengths.numel()))
        self.state.add("denominators", lengths.clamp_min(1))
        self._denominator = lengths.clamp_min(1).to(F64)

    def add(self, key: str, row_sums: torch.Tensor) -> None:
        """Fold per-row sums (float64 [B]) of a per-token quantity into `key`."""
        if key not in self.keys:
            self.keys.append(key)
        self.state.add(key, row_sums if self.per_token else row_sums / self._denominator)

    def value(self, key: str, scale: float = 1.0) -> float:
        denominator = self.state.get("denominators" if self.per_token else "rows")
        return self.state.get(key) / scale / denominator if denominator else 0.0


def _row_sums(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return segment_sum(values, lengths, dtype=F64)


def _per_row(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A per-sample quantity spread over its tokens: its row sum, value × tokens (float64 [B])."""
    return values.to(F64) * lengths.to(F64)


class _LossKeys:
    """The policy loss's own |old - rollout| key; a trainer derived from slime overrides `_loss_keys` to add its own."""

    reduce: _SlimeReducer

    def _loss_keys(self, old: torch.Tensor, rollout: torch.Tensor, keep: torch.Tensor | None,
                   lengths: torch.Tensor) -> None:
        """Fold the loss's keys reduced over the kept tokens (`keep`: the helper's modified loss mask, or None)."""
        diff = (old - rollout).abs()
        self.reduce.add(ABS_DIFF, _row_sums(diff if keep is None else diff * keep, lengths))


class SlimeAccumulator(_LossKeys, Accumulator):
    """The policy loss's keys: |old - rollout|, and vanilla_tis_function's or icepop_function's three."""

    def __init__(self, spec: SlimeSpec, device: torch.device) -> None:
        self.spec = spec
        self.reduce = _SlimeReducer(spec.per_token, device)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole rows."""
        old, rollout, lengths = chunk.masked
        reduce, spec = self.reduce, self.spec
        reduce.rows(lengths)
        self._loss_keys(old, rollout, None, lengths)
        if spec.function is None:
            return
        ratio = torch.exp(old - rollout)  # no clamp: may overflow to inf
        if spec.function == "icepop":
            inside = (ratio >= spec.clip_low) & (ratio <= spec.clip)
            weights = torch.where(inside, ratio, torch.zeros_like(ratio))
        else:
            weights = torch.clamp(ratio, min=spec.clip_low, max=spec.clip)
        reduce.add(TRAIN + "tis", _row_sums(ratio, lengths))
        reduce.add(TRAIN + "tis_clipfrac", _row_sums((weights != ratio).to(ratio.dtype), lengths))
        reduce.add(TRAIN + "tis_abs", _row_sums((ratio - 1).abs(), lengths))

    def merge(self, other: SlimeAccumulator) -> None:
        """Fold another shard of the same step in."""
        self.reduce.state.merge(other.reduce.state)
        self.reduce.keys += [k for k in other.reduce.keys if k not in self.reduce.keys]

    def compute(self) -> Contribution:
        """The keys as slime logs them; train/ois is None (it needs the current policy's log-probs)."""
        values: dict[str, float | None] = {key: self.reduce.value(key) for key in self.reduce.keys}
        values.setdefault(ABS_DIFF, 0.0)
        notes = []
        if self.spec.function is not None:
            values[OIS] = None
            notes.append(OIS_NOTE)
        return Contribution(family=values, notes=notes)  # type: ignore[arg-type]


def _log_ratio(d: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor, level: str) -> torch.Tensor:
    """mis.py's compute_log_ratio: per token, or the row's sum / mean of d spread over its tokens."""
    if level == "token":
        return d
    total = segment_sum(d, lengths)  # in the compute dtype, as mis.py's masked_sum
    if level == "geometric":
        total = total / lengths.clamp_min(1).to(d.dtype)
    return total[rows]


class SlimeMisAccumulator(_LossKeys, Accumulator):
    """The MIS helper's `train/mis_*` keys, with the loss's |old - rollout| over the tokens it keeps."""

    def __init__(self, spec: SlimeMisSpec, device: torch.device) -> None:
        self.spec = spec
        self.reduce = _SlimeReducer(spec.per_token, device)
        self.norm = Reducer(device)  # the batch-normalization mean's sums

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole rows."""
        old, rollout, lengths = chunk.masked
        spec, reduce = self.spec, self.reduce
        reduce.rows(lengths)
        rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
        count = lengths.clamp_min(1).to(old.dtype)
        d = old - rollout
        # add_ppl_metrics: per-sample means, spread over the sample's tokens.
        mean_old, mean_rollout = segment_sum(old, lengths) / count, segment_sum(rollout, lengths) / count
        row = {
            "training_log_ppl": -mean_old, "training_ppl": torch.exp(-mean_old),
            "rollout_log_ppl": -mean_rollout, "rollout_ppl": torch.exp(-mean_rollout),
        }
        token = {"kl": rollout - old, "k3_kl": torch.exp(d) - d - 1}
        diff = mean_rollout - mean_old
        row.update(log_ppl_diff=diff, log_ppl_abs_diff=diff.abs(), ppl_ratio=torch.exp(diff))
        rho_sq = torch.exp(d.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square()
        row["chi2_token"] = segment_sum(rho_sq, lengths) / count - 1.0
        row["chi2_seq"] = torch.exp(2.0 * segment_sum(d, lengths).clamp(-SAFETY_BOUND, SAFETY_BOUND)) - 1.0
        keep = torch.ones_like(d)  # the modified loss mask (mask mode, rejection, veto)
        if spec.tis_level is not None:
            self._weights(d, lengths, rows, keep, token, row)
        self._loss_keys(old, rollout, keep, lengths)  # the loss's reducer rebuilt on the kept tokens
        for name, values in token.items():
            reduce.add(MIS + name, _row_sums(values, lengths))
        for name, values in row.items():
            reduce.add(MIS + name, _per_row(values, lengths))

    def _weights(self, d, lengths, rows, keep, token, row) -> None:
        """compute_mis_weights' IS weights, rejection and veto (the keys go into `token` / `row`; `keep` in place)."""
        spec = self.spec
        log_ratio = _log_ratio(d, lengths, rows, spec.tis_level)
        weights = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        token["tis_weight_before_bound"] = weights
        flag = weights.dtype
        if spec.tis_mode == "truncate":
            token["tis_truncate_fraction"] = (weights > spec.tis_upper).to(flag)
            weights = weights.clamp(0, spec.tis_upper)
        else:
            token[f"tis_{spec.tis_mode}_fraction_low"] = (weights < spec.tis_lower).to(flag)
            token[f"tis_{spec.tis_mode}_fraction_high"] = (weights > spec.tis_upper).to(flag)
            if spec.tis_mode == "clip":
                weights = weights.clamp(spec.tis_lower, spec.tis_upper)
            else:
                keep *= ((weights >= spec.tis_lower) & (weights <= spec.tis_upper)).to(flag)
        token["tis_weight_after_bound"] = weights
        if spec.rs_level is not None:
            rs_log = log_ratio if spec.rs_level == spec.tis_level else _log_ratio(d, lengths, rows, spec.rs_level)
            rs = torch.exp(rs_log.clamp(-SAFETY_BOUND, SAFETY_BOUND))
            token["rs_mask_fraction_low"] = (rs < spec.rs_lower).to(flag)
            token["rs_mask_fraction_high"] = (rs > spec.rs_upper).to(flag)
            keep *= ((rs >= spec.rs_lower) & (rs <= spec.rs_upper)).to(flag)
            if spec.veto is not None:
                threshold = torch.log(torch.tensor(spec.veto))  # float32, as mis.py builds it
                catastrophic = d < threshold
                token["rs_catastrophic_token_fraction"] = catastrophic.to(flag)
                vetoed = segment_sum(catastrophic, lengths) > 0
                row["rs_catastrophic_seq_fraction"] = vetoed.to(flag)
                keep *= (~vetoed).to(flag)[rows]
        token["is_ratio_mean_after_tis_rs"] = weights
        # The final weights' per-sample mean / min / max, before the batch normalization divides them.
        count = lengths.clamp_min(1).to(weights.dtype)
        self.reduce.add("final_mean", _per_row(segment_sum(weights, lengths) / count, lengths))
        self.reduce.add("final_min", _per_row(-segment_max(-weights, lengths), lengths))
        self.reduce.add("final_max", _per_row(segment_max(weights, lengths), lengths))
        self.reduce.add("final_factor", _per_row(torch.ones_like(count), lengths))
        if spec.batch_normalize:
            self.norm.add("weights", weights)
            self.norm.add("tokens", lengths)
            self.norm.add("row_means", segment_sum(weights, lengths, dtype=F64) / count.to(F64))
            self.norm.add("rows", float(lengths.numel()))

    def merge(self, other: SlimeMisAccumulator) -> None:
        """Fold another shard of the same step in."""
        self.reduce.state.merge(other.reduce.state)
        self.reduce.keys += [k for k in other.reduce.keys if k not in self.reduce.keys]
        self.norm.merge(other.norm)

    def _batch_mean(self) -> float | None:
        """The batch normalization's mean weight (None: not normalized)."""
        if not self.spec.batch_normalize:
            return None
        get = self.norm.get
        if self.spec.tis_level == "token":
            return get("weights") / max(get("tokens"), 1.0)
        return get("row_means") / get("rows") if get("rows") else float("nan")

    def compute(self) -> Contribution:
        """The keys as slime logs them (`train/mis_*`); train/ois is None."""
        reduce = self.reduce
        values: dict[str, float | None] = {k: reduce.value(k) for k in reduce.keys if not k.startswith("final_")}
        values.setdefault(ABS_DIFF, 0.0)
        if self.spec.tis_level is not None:
            mean = self._batch_mean()
            if mean is not None:
                scale = mean if mean > NORMALIZE_FLOOR else 1.0  # NaN is not above the floor
                values[MIS + "batch_norm_factor"] = reduce.value("final_factor") * scale
            else:
                scale = 1.0
            for name in ("mean", "min", "max"):
                values[f"{MIS}is_ratio_{name}_final"] = reduce.value(f"final_{name}", scale)
        values[OIS] = None
        return Contribution(family=values, notes=[OIS_NOTE])  # type: ignore[arg-type]


def slime_accumulator(settings: SlimeSpec | SlimeMisSpec, device: torch.device) -> Accumulator:
    """The accumulator of the settings slime or slime-mis resolved (slime-mis with its helper off is plain slime)."""
    return (SlimeMisAccumulator if isinstance(settings, SlimeMisSpec) else SlimeAccumulator)(settings, device)


__all__ = ["ABS_DIFF", "OIS", "SlimeAccumulator", "SlimeMisAccumulator", "slime_accumulator"]
