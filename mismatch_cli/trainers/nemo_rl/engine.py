"""NeMo-RL's mismatch metrics of `ClippedPGLossFn`: its error metrics, its importance weights and their truncation.

Formulas: docs/nemo-rl-semantics.md (sections 3 and 4); the settings come resolved as a `NemoRlSpec`
(`settings.py`). NeMo-RL reads every masked-in token whatever its value, so this accumulator works
on the chunk's `masked` tokens: a NaN or infinite log-prob reaches its sums (the error metrics turn NaN or
inf) while its importance weight is set to 0. One global batch holding one micro-batch: every key is a sum
over the dump divided by the dump's token (or row) count.
"""

from __future__ import annotations

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import Reducer, float32_fraction
from mismatch_cli.engine.kernels.ops import segment_sum
from mismatch_cli.trainers.nemo_rl.settings import NemoRlSpec


def kl_terms(log_ratio: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Schulman's estimators of a log-ratio r: k1 = -r, k2 = r^2 / 2, k3 = exp(r) - 1 - r (no clamps)."""
    if kl_type == "k1":
        return -log_ratio
    if kl_type == "k2":
        return torch.square(log_ratio) / 2
    return torch.exp(log_ratio) - 1 - log_ratio


def js_terms(old: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """Per-token Jensen-Shannon term: half the k3 of each side against the mixture's log-prob."""
    log_mixture = torch.log(0.5 * torch.exp(old) + 0.5 * torch.exp(rollout))
    to_old = torch.exp(old - log_mixture) - (old - log_mixture) - 1
    to_rollout = torch.exp(rollout - log_mixture) - (rollout - log_mixture) - 1
    return 0.5 * to_old + 0.5 * to_rollout


def finite_or_zero(values: torch.Tensor) -> torch.Tensor:
    """NaN and +-inf replaced by 0 (NeMo's nan_to_num(nan=0, posinf=0, neginf=0))."""
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


def nemo_weights(old: torch.Tensor, rollout: torch.Tensor, lengths: torch.Tensor,
                 spec: NemoRlSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The importance weights after truncation (per token, or per row at sequence level) and the out-of-bound flags.

    Flags: per token (tis / icepop at token level), per row (tis / icepop at sequence level, seq-mask-tis), or
    None without truncation.
    """
    log_ratio = old - rollout
    if spec.level == "sequence":
        weights = finite_or_zero(torch.exp(segment_sum(log_ratio, lengths)))  # sum in the compute dtype
    else:
        weights = finite_or_zero(torch.exp(log_ratio))
    if spec.truncation is None:
        return weights, None
    assert spec.ratio is not None
    if spec.truncation == "tis":
        low = 0.0 if spec.ratio_min is None else spec.ratio_min
        outside = (weights > spec.ratio) | (weights < low)
        return torch.clamp(weights, min=low, max=spec.ratio), outside
    if spec.truncation == "icepop":
        kept = (weights >= spec.ratio_min) & (weights <= spec.ratio)
        return torch.where(kept, weights, torch.zeros_like(weights)), ~kept
    # seq-mask-tis: a row's geometric-mean ratio (its non-finite log-ratios as 0) decides whether it is kept.
    sums = segment_sum(finite_or_zero(log_ratio), lengths)
    tokens = lengths.to(sums.dtype)
    means = sums / torch.where(lengths > 0, tokens, torch.ones_like(tokens))  # an empty row: 0
    geometric = torch.exp(means)
    kept = (geometric >= spec.ratio_min) & (geometric <= spec.ratio)
    kept_tokens = torch.repeat_interleave(kept, lengths)
    return torch.where(kept_tokens, weights, torch.zeros_like(weights)), ~kept


class NemoRlAccumulator(Accumulator):
    """The six keys ClippedPGLossFn logs about the mismatch, from sums and counts over the whole dump."""

    def __init__(self, spec: NemoRlSpec, device: torch.device) -> None:
        self.spec = spec
        self.state = Reducer(device)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk: per-token error terms and the weights over its masked-in tokens."""
        old, rollout, lengths = chunk.masked
        state, spec = self.state, self.spec
        state.add("tokens", float(old.numel()))
        state.add("rows", float(lengths.numel()))
        if old.numel():
            state.add("mult", torch.exp(torch.abs(rollout - old)))
            state.add("gen_kl", kl_terms(old - rollout, spec.kl_type))  # log-ratio train - rollout
            state.add("policy_kl", kl_terms(rollout - old, spec.kl_type))
            state.add("js", js_terms(old, rollout))
        # Rows without a token still have a sequence weight (exp(0) = 1) and a seq-mask-tis verdict.
        weights, outside = nemo_weights(old, rollout, lengths, spec)
        if weights.numel():
            state.add("weights", weights)
        if outside is None or not outside.numel():
            return
        if spec.truncation == "seq-mask-tis":
            state.add("outside", outside)  # rows
        elif spec.level == "sequence":
            state.add("outside", torch.where(outside, lengths, torch.zeros_like(lengths)))  # a row counts its tokens
        else:
            state.add("outside", outside)

    def merge(self, other: NemoRlAccumulator) -> None:
        """Fold another shard of the same batch in."""
        self.state.merge(other.state)

    def compute(self) -> Contribution:
        """The keys as NeMo-RL logs them; a key is 0.0 when its count is 0 (its 1e-8 denominator)."""
        get, spec = self.state.get, self.spec
        tokens, rows = get("tokens"), get("rows")

        def per_token(name: str) -> float:
            return get(name) / tokens if tokens else 0.0

        # Sequence level: the [B, 1] weights meet the [B] sample mask in a broadcast, so the micro-batch's
        # B rows each count every weight: B·Σw / B, the sum of the row weights.
        ratio = get("weights") if spec.level == "sequence" else per_token("weights")
        values: dict[str, float] = {
            "token_mult_prob_error": per_token("mult"),
            "gen_kl_error": per_token("gen_kl"),
            "policy_kl_error": per_token("policy_kl"),
            "js_divergence_error": per_token("js"),
            "sampling_importance_ratio": ratio,
        }
        if spec.truncation is not None:  # float32 masks and counts upstream: a float32 fraction
            whole = rows if spec.truncation == "seq-mask-tis" else tokens
            values["is_oob_ratio"] = float32_fraction(get("outside"), whole) if whole else 0.0
        return Contribution(family=values)


__all__ = ["NemoRlAccumulator", "finite_or_zero", "js_terms", "kl_terms", "nemo_weights"]
