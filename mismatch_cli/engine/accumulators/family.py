"""The older families (verl 0.6.0 / 0.6.1 / 0.7.0 / 0.7.1 IS, xtuner) as one streaming accumulator.

Formulas: docs/legacy-semantics.md. The IS / RS / veto blocks live in `engine/accumulators/family_blocks.py` and
xtuner's per-pack block and pack merge in `engine/accumulators/packs.py`; here is the accumulator that runs a
family's blocks, driven by the fields of its `FamilySpec` (never by the family's name).
"""

from __future__ import annotations

import torch

from mismatch_cli.correction import FamilySpec
from mismatch_cli.engine.accumulators.family_blocks import Means, RatioBlock, VetoBlock
from mismatch_cli.engine.accumulators.offpolicy import OffPolicyAccumulator
from mismatch_cli.engine.accumulators.packs import PackMismatchBlock
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import Accumulator, ChunkDecisions, Contribution

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


class FamilyAccumulator(Accumulator):
    """Every block one older family computes, behind update / merge / compute."""

    decides = frozenset({"family_rs_row_reject", "family_rs_token_reject", "vetoed_rows"})
    reads = frozenset({"rs_row_reject", "rs_token_reject"})  # with its own, for the tokens it trains on

    def __init__(self, spec: FamilySpec, device: torch.device) -> None:
        self.spec = spec
        means = Means(spec.exact_mask)
        self.blocks = [RatioBlock(block, means, device) for block in spec.blocks] if spec.enabled else []
        self.veto = VetoBlock(spec.veto, means, device) if spec.enabled and spec.veto_keys and spec.blocks else None
        if spec.veto_keys_always:
            self.veto = VetoBlock(spec.veto, means, device)  # 0.0 when off
        self.pack = PackMismatchBlock(device) if spec.offpolicy == "pack" else None
        self.kept_tokens = 0.0
        # verl's 13 off-policy keys under this family's names (bool-mask arithmetic with an exact mask).
        self.offpolicy = OffPolicyAccumulator(device, exact_mask=spec.exact_mask) if spec.offpolicy in (
            "rollout_corr", "mismatch") else None

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
        for rows in (decisions.family_rs_row_reject, decisions.vetoed_rows, decisions.rs_row_reject):
            if rows is not None:
                lost_rows = lost_rows | rows
        token_reject = [t for t in (decisions.family_rs_token_reject, decisions.rs_token_reject) if t is not None]
        lost_in_row = chunk.row_count(token_reject[0] | token_reject[-1]) if token_reject else 0.0
        kept = torch.where(lost_rows, torch.zeros_like(chunk.row_tokens), chunk.row_tokens - lost_in_row)
        return float(kept.sum().item())

    def merge(self, other: FamilyAccumulator) -> None:
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
        if self.spec.actor_recomputes_offpolicy and self.kept_tokens == 0 and offpolicy:
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
        if self.spec.offpolicy == "rollout_corr" and offpolicy is not None:
            out.update(offpolicy)
        elif self.spec.offpolicy == "mismatch" and offpolicy is not None:
            out.update({MISMATCH_NAMES[k]: v for k, v in offpolicy.items() if k in MISMATCH_NAMES})
        elif self.pack is not None:
            out.update(self.pack.compute())
        return Contribution(family={self.spec.prefix + k: v for k, v in out.items()}, notes=notes)
