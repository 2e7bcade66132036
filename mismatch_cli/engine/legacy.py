"""Seed-era families (verl 0.6.0 / 0.6.1 / 0.7.0 / 0.7.1 IS, xtuner) as one streaming accumulator.

Formulas: docs/legacy-semantics.md. The IS / RS / veto blocks live in `engine/legacy_blocks.py`; here
are xtuner's per-pack mismatch block, the accumulator that runs a family's blocks, and xtuner's merge
of per-pack metrics.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.legacy_blocks import Means, RatioBlock, VetoBlock
from mismatch_cli.engine.offpolicy import OffPolicyAccumulator
from mismatch_cli.engine.ops import total
from mismatch_cli.engine.protocol import Accumulator, ChunkDecisions, Contribution
from mismatch_cli.engine.state import Reducer
from mismatch_cli.legacy import LegacySpec


class PackMismatchBlock:
    """xtuner's mismatch metrics, computed over the whole pack as one row (docs/legacy-semantics.md §8.5)."""

    def __init__(self, device: torch.device) -> None:
        self.state = Reducer(device)

    def update(self, chunk: Chunk) -> None:
        """Fold one chunk in."""
        s = self.state
        s.add("tokens", float(chunk.num_tokens))
        s.add("old", chunk.old)
        s.add("rollout", chunk.rollout)
        s.add("neg_log_ratio", -total(chunk.log_ratio))
        s.add("k3", chunk.k3)
        s.add("abs", chunk.abs_log_ratio)

    def merge(self, other: PackMismatchBlock) -> None:
        """Fold another shard in."""
        self.state.merge(other.state)

    def compute(self) -> dict[str, float]:
        """The 12 `mismatch_*` keys plus `valid`."""
        s = self.state
        tokens = s.get("tokens")
        if tokens == 0:  # no valid token: xtuner reports PPL 1 and zero differences
            a = b = kl = k3 = absdiff = 0.0
        else:
            a, b = s.get("old") / tokens, s.get("rollout") / tokens
            kl, k3, absdiff = s.get("neg_log_ratio") / tokens, s.get("k3") / tokens, s.get("abs") / tokens
        diff = b - a
        return {
            "valid": 1.0 if tokens > 0 else 0.0,
            "mismatch_training_ppl": math.exp(-a),
            "mismatch_training_log_ppl": -a,
            "mismatch_kl": kl,
            "mismatch_k3_kl": k3,
            "mismatch_rollout_ppl": math.exp(-b),
            "mismatch_rollout_log_ppl": -b,
            "mismatch_log_ppl_diff": diff,
            "mismatch_log_ppl_abs_diff": abs(diff),
            "mismatch_log_ppl_diff_max": diff,
            "mismatch_log_ppl_diff_min": diff,
            "mismatch_ppl_ratio": math.exp(diff),
            "mismatch_logprob_abs_diff": absdiff,
        }


MISMATCH_NAMES = {
    "training_ppl": "mismatch_training_ppl",
    "training_log_ppl": "mismatch_training_log_ppl",
    "kl": "mismatch_kl",
    "k3_kl": "mismatch_k3_kl",
    "rollout_ppl": "mismatch_rollout_ppl",
    "rollout_log_ppl": "mismatch_rollout_log_ppl",
    "log_ppl_diff": "mismatch_log_ppl_diff",
    "log_ppl_abs_diff": "mismatch_log_ppl_abs_diff",
    "log_ppl_diff_max": "mismatch_log_ppl_diff_max",
    "log_ppl_diff_min": "mismatch_log_ppl_diff_min",
    "ppl_ratio": "mismatch_ppl_ratio",
}


class LegacyAccumulator(Accumulator):
    """Every block one older family computes, behind update / merge / compute."""

    decides = frozenset({"legacy_rs_row_reject", "legacy_rs_token_reject", "vetoed_rows"})
    reads = frozenset({"rs_row_reject", "rs_token_reject"})  # with its own, for the tokens it trains on

    def __init__(self, spec: LegacySpec, device: torch.device) -> None:
        self.spec = spec
        means = Means(spec.exact_mask)
        self.blocks = [RatioBlock(block, means, device) for block in spec.blocks] if spec.enabled else []
        self.veto = VetoBlock(spec.veto, means, device) if spec.enabled and spec.veto_keys and spec.blocks else None
        if spec.family in ("verl-0.7.0", "verl-0.6.1"):
            self.veto = VetoBlock(spec.veto, means, device)  # always emitted there, 0.0 when off
        self.pack = PackMismatchBlock(device) if spec.offpolicy == "xtuner" else None
        self.kept_tokens = 0.0
        # verl's 13 off-policy keys under this family's names (bool-mask arithmetic with an exact mask).
        self.offpolicy = OffPolicyAccumulator(device, exact_mask=spec.exact_mask) if spec.offpolicy in (
            "verl", "mismatch") else None

    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk into every block (after verl's RS, whose rejections it counts)."""
        for block in self.blocks:
            block.update(chunk, decisions)
        if self.veto is not None:
            self.veto.update(chunk, decisions)
        if self.pack is not None:
            self.pack.update(chunk)
        if self.offpolicy is not None:
            self.offpolicy.update(chunk, decisions)
        self.kept_tokens += self._kept_tokens(chunk, decisions)

    @staticmethod
    def _kept_tokens(chunk: Chunk, decisions: ChunkDecisions) -> float:
        """Valid tokens that survive the RS mask and the veto (what verl <= 0.7.1 trains on)."""
        lost_rows = torch.zeros(chunk.num_rows, dtype=torch.bool, device=chunk.old.device)
        for rows in (decisions.legacy_rs_row_reject, decisions.vetoed_rows, decisions.rs_row_reject):
            if rows is not None:
                lost_rows = lost_rows | rows
        token_reject = [t for t in (decisions.legacy_rs_token_reject, decisions.rs_token_reject) if t is not None]
        lost_in_row = chunk.row_count(token_reject[0] | token_reject[-1]) if token_reject else 0.0
        kept = torch.where(lost_rows, torch.zeros_like(chunk.row_tokens), chunk.row_tokens - lost_in_row)
        return float(kept.sum().item())

    def merge(self, other: LegacyAccumulator) -> None:
        """Fold another shard in."""
        for mine, theirs in zip(self.blocks, other.blocks, strict=True):
            mine.merge(theirs)
        if self.veto is not None and other.veto is not None:
            self.veto.merge(other.veto)
        if self.pack is not None and other.pack is not None:
            self.pack.merge(other.pack)
        if self.offpolicy is not None and other.offpolicy is not None:
            self.offpolicy.merge(other.offpolicy)
        self.kept_tokens += other.kept_tokens

    def compute(self) -> Contribution:
        """The family's prefixed keys, and notes."""
        out: dict[str, float] = {}
        notes: list[str] = []
        offpolicy = self.offpolicy.values() if self.offpolicy is not None else None
        if self.spec.family in ("verl-0.7.0", "verl-0.6.1", "verl-0.7.1") and self.kept_tokens == 0 and offpolicy:
            notes.append(
                "RS and the veto reject every sequence: verl <= 0.7.1's legacy actor recomputes the off-policy "
                "metrics per micro-batch on this modified mask and crashes with AssertionError ('Expected at "
                "least one valid token'); the numbers above are the driver's, on the original mask")
        if self.spec.valid_key and self.blocks and self.pack is not None:
            out["valid"] = 1.0 if self.pack.state.get("tokens") > 0 else 0.0
        if self.veto is not None:
            out.update(self.veto.compute())
        for block in self.blocks:
            values, block_notes = block.compute()
            out.update(values)
            notes += block_notes
        if self.spec.offpolicy == "verl" and offpolicy is not None:
            out.update(offpolicy)
        elif self.spec.offpolicy == "mismatch" and offpolicy is not None:
            out.update({MISMATCH_NAMES[k]: v for k, v in offpolicy.items() if k in MISMATCH_NAMES})
        elif self.pack is not None:
            out.update(self.pack.compute())
        return Contribution(family={self.spec.prefix + k: v for k, v in out.items()}, notes=notes)


def merge_xtuner_packs(packs: list[dict[str, float]], head: bool) -> dict[str, float]:
    """xtuner's `merge_rollout_is_metrics` over per-pack metric maps (docs/legacy-semantics.md §8.6).

    Keys naming "max" take the max and "min" the min over the counted packs, the rest their mean;
    values go through float32 as upstream's tensors do. The head version counts valid packs only; the
    2025-12 version lets an invalid pack add 0.0 everywhere and counts every pack for the IS keys
    (which had no `valid` flag yet), so an all-masked pack's infinite ESS leaks into the mean.
    """
    valid_key = "mismatch/valid"
    out: dict[str, float] = {}
    keys = [k for k in packs[0] if k != valid_key]
    for key in keys:
        is_key = key.startswith("mismatch/rollout_is_")
        valid = [bool(p.get(valid_key, 1.0)) for p in packs]
        if head or not is_key:
            counted = [p for p, ok in zip(packs, valid, strict=True) if ok]
            zero_filled = [] if head else [0.0 for ok in valid if not ok]
        else:
            counted, zero_filled = list(packs), []
        count = len(counted)
        if count == 0:
            out[key] = 0.0
            continue
        values = [np.float32(math.nan if p[key] is None else p[key]) for p in counted]
        values += [np.float32(v) for v in zero_filled]
        if "max" in key:
            merged = max(values)
        elif "min" in key:
            merged = min(values)
        else:
            # Upstream sums one float32 tensor (torch's reduction order, not a running sum) and divides
            # on the host in float64: `sum.item() / count`.
            merged = torch.tensor(np.asarray(values, dtype=np.float32)).sum().item() / count
        out[key] = float(merged)
    return out
