"""prime-rl's trainer-side mismatch keys: `mismatch_kl/all/*` over tokens and its loss's per-sample keys.

Formulas: docs/prime-rl-semantics.md; the settings come resolved as a `PrimeRlSpec` (`settings.py`).
prime-rl reads every loss-mask token whatever its value, so this accumulator works on the chunk's `masked` tokens
(NaN and sentinel log-probs included), trainer log-probs = old, inference log-probs = rollout. Each dump row is
one sample; one process and one step hold the whole dump.

The default loss masks by the sign of each token's advantage, so its keys need per-token advantages aligned with
the masked tokens (`chunk.masked_advantages`); without them those keys are None with a note. The `ipo` loss and
`mismatch_kl/all/*` need none.
"""

from __future__ import annotations

import math

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Moments, Reducer
from mismatch_cli.engine.kernels.ops import segment_sum
from mismatch_cli.trainers.prime_rl.settings import PrimeRlSpec

ALL = "mismatch_kl/all/"
KL_KEYS = ("masked_mismatch_kl", "unmasked_mismatch_kl")  # per-sample means of mismatch_kl, in the compute dtype
# Per-sample fractions: prime-rl divides a bool count by an integer count, a float32 value in either dtype.
FRACTION_KEYS = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive",
                 "masked_advantage_negative")
IPO_KEYS = ("masked_mismatch_kl", "unmasked_mismatch_kl", "is_masked")
DEFAULT_KEYS = (*KL_KEYS, *FRACTION_KEYS)
ADVANTAGES_NOTE = "needs per-token advantages (column `advantages`)"


def mismatch_kl(old: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """exp(d) - d - 1 with d = old - rollout, unclamped, in the compute dtype (inf on overflow, NaN for d = +inf)."""
    log_ratio = old - rollout
    return torch.exp(log_ratio) - log_ratio - 1


def trust_region(old: torch.Tensor, rollout: torch.Tensor, advantages: torch.Tensor | None,
                 spec: PrimeRlSpec) -> dict[str, torch.Tensor]:
    """Per token, the masks of the loss: `is_masked` (dropped from the policy gradient) and, for the default loss,
    `is_masked_high` / `is_masked_low` and the advantage's sign. Δp = exp(old) - exp(rollout); a NaN is never masked.
    """
    probs_diff = torch.exp(old) - torch.exp(rollout)
    if spec.loss_type == "ipo":
        return {"is_masked": probs_diff.abs() > spec.ipo_threshold}
    assert advantages is not None
    high = probs_diff > spec.dppo_mask_high
    low = probs_diff < -spec.dppo_mask_low
    positive, negative = advantages > 0, advantages < 0
    # An advantage of 0 (or NaN) takes the low side's mask, as prime-rl's torch.where does.
    return {"is_masked": torch.where(positive, high, low), "is_masked_high": positive & high,
            "is_masked_low": negative & low, "positive": positive, "negative": negative}


def _f32(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32).to(F64)


class PrimeRlAccumulator(Accumulator):
    """The keys prime-rl logs: token sums and moments for `mismatch_kl/all`, per-sample values summed and maxed."""

    def __init__(self, spec: PrimeRlSpec, device: torch.device) -> None:
        self.spec = spec
        self.state = Reducer(device)
        self.moments = Moments(device)
        self.missing_advantages = False

    def _sample_keys(self) -> tuple[str, ...]:
        return IPO_KEYS if self.spec.loss_type == "ipo" else DEFAULT_KEYS

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: mismatch_kl of its masked tokens, and each row's per-sample values."""
        old, rollout, lengths = chunk.masked
        state = self.state
        kl = mismatch_kl(old, rollout)
        state.add("tokens", float(kl.numel()))
        state.add("rows", float(lengths.numel()))
        if kl.numel():
            state.add("kl_sum", kl)
            state.max("kl_max", kl)
            self.moments.update(kl)
        advantages = chunk.masked_advantages
        if self.spec.loss_type != "ipo" and advantages is None:
            self.missing_advantages = True
            return
        if not lengths.numel():
            return
        if advantages is not None:
            advantages = advantages.to(device=old.device, dtype=old.dtype)
            if self.spec.loss_type != "ipo":  # a null advantage (NaN) takes the low side's mask: counted, warned
                state.add("null_advantages", torch.isnan(advantages).sum().to(F64))
        masks = trust_region(old, rollout, advantages, self.spec)
        dropped = masks["is_masked"]

        def rows(values: torch.Tensor) -> torch.Tensor:
            return segment_sum(values, lengths, dtype=F64)

        tokens, n_dropped = lengths.to(F64), rows(dropped)
        zero = torch.zeros_like(kl)
        values = {
            "masked_mismatch_kl": rows(torch.where(dropped, kl, zero)) / n_dropped.clamp_min(1),
            "unmasked_mismatch_kl": rows(torch.where(dropped, zero, kl)) / (tokens - n_dropped).clamp_min(1),
            "is_masked": _f32(n_dropped / tokens.clamp_min(1)),
        }
        if self.spec.loss_type != "ipo":
            values["is_masked_low"] = _f32(rows(masks["is_masked_low"]) / tokens.clamp_min(1))
            values["is_masked_high"] = _f32(rows(masks["is_masked_high"]) / tokens.clamp_min(1))
            values["masked_advantage_positive"] = _f32(rows(dropped & masks["positive"]) / n_dropped.clamp_min(1))
            values["masked_advantage_negative"] = _f32(rows(dropped & masks["negative"]) / n_dropped.clamp_min(1))
        for key, per_row in values.items():
            state.add(key + "_sum", per_row)
            state.max(key + "_max", per_row)

    def merge(self, other: PrimeRlAccumulator) -> None:
        """Fold another shard of the same step in."""
        self.state.merge(other.state)
        self.moments.merge(other.moments)
        self.missing_advantages |= other.missing_advantages

    def compute(self) -> Contribution:
        """The keys as prime-rl logs them (after its W&B filter); NaN where prime-rl's statistics of nothing are."""
        get = self.state.get
        tokens, rows = get("tokens"), get("rows")
        values: dict[str, float | None] = {ALL + "mean": math.nan, ALL + "std": math.nan, ALL + "max": math.nan}
        if tokens:
            values[ALL + "mean"] = get("kl_sum") / tokens
            values[ALL + "max"] = get("kl_max")
            if tokens > 1:  # torch's unbiased std: NaN for one value
                values[ALL + "std"] = math.sqrt(max(float(self.moments.m2.item()), 0.0) / (tokens - 1)) \
                    if math.isfinite(float(self.moments.m2.item())) else math.nan
        notes = []
        for key in self._sample_keys():
            if self.missing_advantages:
                values[key + "/mean"] = values[key + "/max"] = None
                continue
            mean = get(key + "_sum") / rows if rows else math.nan
            if key in FRACTION_KEYS:  # the float32 mean of float32 values
                mean = float(torch.tensor(mean, dtype=torch.float32))
            values[key + "/mean"] = mean
            values[key + "/max"] = get(key + "_max") if rows else math.nan
        if self.missing_advantages:
            notes.append(f"{', '.join(k + '/*' for k in self._sample_keys())}: {ADVANTAGES_NOTE}")
        nulls = int(get("null_advantages") or 0)
        if nulls:
            notes.append(f"{nulls} valid {'token has' if nulls == 1 else 'tokens have'} a null advantage: prime-rl's "
                         "mask reads it as a non-positive "
                         "one (torch.where on a NaN), so is_masked and its kin count them on the low side; write an "
                         "advantage for every loss-mask token")
        return Contribution(family=values, notes=notes)


__all__ = ["ADVANTAGES_NOTE", "PrimeRlAccumulator", "mismatch_kl", "trust_region"]
