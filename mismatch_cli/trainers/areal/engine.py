"""AReaL 1.0.4's rejection-sampling keys (`ppo_actor/update/*`), replayed over the whole dump as one step.

Formulas: docs/areal-semantics.md; the settings come resolved as an `ArealSpec` (`settings.py`). The
proximal side is the dump's old log-probs (the rollout ones when `use_decoupled_loss` is off), the behaviour side
the rollout log-probs. As AReaL does, the log-ratio, the weight and the KL metrics are float32 whatever the input
dtype, a non-finite log-ratio counts as 0 for the weight, and `behave_approx_kl` is the raw difference in the
input dtype. Rows are whole within a chunk, so a sequence's aggregate is per chunk; every key is a global sum,
count or extreme over tokens, so the numbers do not depend on chunking. `rs_filtered_fraction` is one loss call's
fraction (the dump as one micro-batch), rounded to float32 as AReaL's scalar tracker returns it.
"""

from __future__ import annotations

import math

import torch

from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.core.state import F64, Reducer, float32_fraction
from mismatch_cli.engine.kernels.ops import count, segment_max, segment_sum
from mismatch_cli.trainers.areal.settings import ArealSpec

PREFIX = "ppo_actor/update/"
STOP = "prox_logp contains NaN or Inf with prox_logp_method='recompute'. This indicates computation failed."
F32 = torch.float32


def _in_bounds(metric: torch.Tensor, spec: ArealSpec) -> torch.Tensor:
    """AReaL's bounds check: metric <= upper (and >= lower when set); NaN is out of bounds."""
    inside = metric <= spec.upper
    return inside & (metric >= spec.lower) if spec.lower is not None else inside


def _clamp(weight: torch.Tensor, spec: ArealSpec) -> torch.Tensor:
    return weight.clamp(min=spec.lower if spec.lower is not None else 0.0, max=spec.upper)


def areal_keys() -> tuple[str, ...]:
    """The keys AReaL logs once rejection sampling is configured, with the prefix."""
    stats = [f"{name}/{part}" for name in ("behave_imp_weight", "behave_approx_kl") for part in ("avg", "min", "max")]
    return tuple(PREFIX + key for key in (*stats, "unclipped_behave_tokens", "rs_filtered_fraction"))


class ArealAccumulator(Accumulator):
    """AReaL's behave_* keys, kept-token count and filtered fraction over the whole dump."""

    def __init__(self, spec: ArealSpec, device: torch.device) -> None:
        self.spec = spec
        self.state = Reducer(device)

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole rows."""
        spec = self.spec
        old, rollout, lengths = chunk.masked
        prox = old if spec.decoupled else rollout
        self.state.add("stopped", float(count(~torch.isfinite(prox))))
        self.state.add("tokens", float(prox.numel()))
        if not prox.numel():
            return
        raw = prox.to(F32) - rollout.to(F32)
        log_ratio = torch.where(torch.isfinite(raw), raw, torch.zeros_like(raw))
        if spec.metric == "ratio":
            metric = log_ratio.exp()
        elif spec.metric == "kl_k1":
            metric = raw
        elif spec.metric == "kl_k2":
            metric = raw**2 / 2.0
        else:
            metric = (-raw).exp() - 1 + raw
        weight = log_ratio.exp()
        if spec.level == "token":
            keep = _in_bounds(metric, spec) if spec.action == "mask" else torch.ones_like(raw, dtype=torch.bool)
            original = weight
            if spec.action == "clamp":
                weight = _clamp(weight, spec)
        else:
            rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=raw.device), lengths)
            valid = lengths.clamp(min=1).to(F32)
            values = log_ratio if spec.metric == "ratio" else metric
            if spec.agg == "max":
                agg = segment_max(values, lengths).to(F32)
            else:
                agg = segment_sum(values, lengths, dtype=F64).to(F32)
                if spec.agg == "mean":
                    agg = agg / valid
            if spec.metric == "ratio":
                agg = agg.exp()
                weight = (segment_sum(log_ratio, lengths, dtype=F64).to(F32) / valid).exp()[rows]
            inside = _in_bounds(agg, spec)[rows]
            original = weight
            if spec.action == "mask":
                keep = inside
            else:
                keep = torch.ones_like(inside)
                weight = torch.where(inside, weight, _clamp(weight, spec))
        if spec.action == "mask":
            self.state.add("filtered", float(count(~keep)))
        else:
            self.state.add("filtered", float(count(original != weight)))
        behave = keep & (weight > 0)
        kept_weight = weight[behave].to(F64)
        kl = (prox - rollout)[behave].to(F64)
        self.state.add("kept", float(kept_weight.numel()))
        if kept_weight.numel():
            self.state.add("weight_sum", kept_weight)
            self.state.max("weight_max", kept_weight)
            self.state.min("weight_min", kept_weight)
            self.state.add("kl_sum", kl)
            self.state.max("kl_max", kl)
            self.state.min("kl_min", kl)

    def merge(self, other: ArealAccumulator) -> None:
        """Fold another shard of the same dump in."""
        self.state.merge(other.state)

    def compute(self) -> Contribution:
        """The keys as AReaL's stats tracker exports them for one step on one process."""
        state, keys = self.state, areal_keys()
        if state.get("stopped"):
            return Contribution(family=dict.fromkeys(keys), notes=[f"AReaL stops the step: {STOP} "
                                                                   "(a non-finite proximal log-prob on a token)"])
        kept, notes = state.get("kept"), []

        def extreme(name: str) -> float | None:
            value = state.get(name)
            return None if math.isinf(value) else value  # AReaL's tracker drops an infinite min / max

        family: dict[str, float | None] = {}
        for key, name in (("behave_imp_weight", "weight"), ("behave_approx_kl", "kl")):
            family[f"{PREFIX}{key}/avg"] = state.get(f"{name}_sum") / kept if kept else None
            family[f"{PREFIX}{key}/min"] = extreme(f"{name}_min") if kept else None
            family[f"{PREFIX}{key}/max"] = extreme(f"{name}_max") if kept else None
        if not kept:
            notes.append("no token kept: AReaL logs no behave_* key")
        family[PREFIX + "unclipped_behave_tokens"] = kept
        family[PREFIX + "rs_filtered_fraction"] = float32_fraction(state.get("filtered"),
                                                                   max(state.get("tokens"), 1.0))
        return Contribution(family=family, notes=notes)


__all__ = ["PREFIX", "ArealAccumulator", "areal_keys"]
