"""One batch's accumulators (off-policy, IS, RS, diagnostics, ...) behind update / merge / compute."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mismatch_cli.correction import ResolvedCorrection, make_accumulator
from mismatch_cli.engine import INFINITE_NOTE, UNDEFINED_NOTE
from mismatch_cli.engine.accumulators.diagnostics import DiagnosticsAccumulator
from mismatch_cli.engine.accumulators.evidence import EvidenceAccumulator
from mismatch_cli.engine.accumulators.family import FamilyAccumulator
from mismatch_cli.engine.accumulators.importance import ImportanceAccumulator
from mismatch_cli.engine.accumulators.offpolicy import OFFPOLICY_KEYS, OffPolicyAccumulator
from mismatch_cli.engine.accumulators.rejection import RejectionAccumulator
from mismatch_cli.engine.accumulators.rounds import RoundsAccumulator
from mismatch_cli.engine.accumulators.signatures import SignaturesAccumulator, fused_row_sums
from mismatch_cli.engine.accumulators.whatif import WhatIfAccumulator
from mismatch_cli.engine.accumulators.worst import WorstSequences
from mismatch_cli.engine.core.bootstrap import DEFAULT_REPLICATES, BootstrapAccumulator
from mismatch_cli.engine.core.chunk import Chunk
from mismatch_cli.engine.core.protocol import (
    DIAG_PREFIX,
    TABLES,
    VERL_PREFIX,
    Accumulator,
    ChunkDecisions,
    check_order,
    finite_or_none,
)


@dataclass
class BatchResult:
    """Computed metrics of one batch (`None` where undefined) and why some are undefined."""

    metrics: dict[str, float | None]
    valid_tokens: int
    rounds: list[dict] = field(default_factory=list)
    rounds_from_end: list[dict] = field(default_factory=list)
    intervals: dict[str, list[float]] = field(default_factory=dict)  # 95 % bootstrap intervals
    quantiles: dict = field(default_factory=dict)
    histograms: dict = field(default_factory=dict)
    worst_sequences: list[dict] = field(default_factory=list)
    what_if: list[dict] = field(default_factory=list)
    signatures: dict = field(default_factory=dict)
    icepop_rejects_all: bool = False
    notes: list[str] = field(default_factory=list)


# Update order: the deciders (IS, RS, the older family) before the accumulators reading their decisions.
ACCUMULATORS = ("importance", "rejection", "family", "trainer", "offpolicy", "diagnostics", "what_if", "worst",
                "signatures", "evidence", "bootstrap", "rounds")
# The overall batch's own accumulators that read no decision: under --by, a chunk cut into parts folds into them
# once, whole, as without --by (per part, their fixed cost was most of a small step's: 1.7 of 9 ms).
WHOLE_CHUNK = ("what_if", "worst")


class BatchAccumulator:
    """Everything computed for one batch (the whole dump, or one step): mergeable, fixed size.

    Its accumulators run in one list, deciders first: IS, RS and an older family decide per-chunk
    weights and rejections that the bootstrap, the rounds and the older family's kept-token count read.
    """

    def __init__(self, correction: ResolvedCorrection, device: torch.device, rounds: bool = True,
                 extras: bool = True, bootstrap: int = DEFAULT_REPLICATES, findings: bool = True) -> None:
        self.correction = correction
        self.importance = (
            ImportanceAccumulator(
                correction.is_level, correction.is_threshold, correction.is_batch_normalize, device,
                seq_fraction_weights=correction.seq_fraction_weights,
            )
            if correction.is_level is not None and correction.is_threshold is not None
            else None
        )
        self.rejection = (
            RejectionAccumulator(correction.rs_options, correction.k1_bounds, device,
                                 exact_mask=correction.family_spec is not None and correction.family_spec.exact_mask)
            if correction.rs_options
            else None
        )
        # An older family (verl <= 0.7.1, xtuner) reports verl's off-policy keys under its own names (or
        # not at all), and replaces verl 0.9's IS keys with its own blocks.
        self.family = FamilyAccumulator(correction.family_spec, device) if correction.family_spec is not None else None
        # A replayed trainer (TRL, ...) reports its own keys only.
        self.trainer = None if correction.trainer is None else make_accumulator(
            correction.trainer_accumulator, correction.trainer, device)
        self.offpolicy = OffPolicyAccumulator(device) if self.family is None and not correction.replay else None
        self.diagnostics = DiagnosticsAccumulator(device, tables=extras)
        # The what-if ladder and the worst sequences (the overall batch needs them; per-step ones may not).
        self.what_if = WhatIfAccumulator(correction.k1_bounds, device) if extras else None
        self.worst = WorstSequences() if extras else None
        # The findings' evidence (its octave table only where findings read it: not a step's) and per-step diag/ keys
        self.signatures = SignaturesAccumulator(device, tables=findings)
        self.evidence = EvidenceAccumulator(device)  # zero-filled prefixes, the gap per policy version
        self.bootstrap = (
            BootstrapAccumulator(bootstrap, device, correction.is_level if self.importance else None,
                                 self.rejection is not None)
            if bootstrap > 0
            else None
        )
        self.rounds = RoundsAccumulator(device, tables=extras) if rounds else None
        ordered = tuple(getattr(self, name) for name in ACCUMULATORS)
        self.accumulators: list[Accumulator] = [a for a in ordered if a is not None]
        check_order(self.accumulators)
        # Update order: the late ones (reading the fused sweep, deciding nothing) after the others.
        present = [name for name in ACCUMULATORS if getattr(self, name) is not None]
        self.updating = sorted(present, key=lambda name: getattr(self, name).late)

    def update(self, chunk: Chunk) -> ChunkDecisions:
        """Fold one chunk of whole sequences into every family's state; returns what the deciders decided."""
        decisions = ChunkDecisions()
        for name in self.updating:
            getattr(self, name).update(chunk, decisions)
        return decisions

    def update_from(self, chunk: Chunk, part: BatchAccumulator, decisions: ChunkDecisions,
                    whole: bool = False) -> None:
        """Fold a chunk that `part` (the same configuration, fewer accumulators) has already folded on its own.

        Its accumulators' states merge in, as a shard's would, instead of redoing their per-token work; the
        ones `part` lacks (the extras) update from the chunk with the decisions `part`'s deciders made, but for
        WHOLE_CHUNK's when the whole chunk will go to `update_whole`.
        """
        for name in self.updating:
            mine, theirs = getattr(self, name), getattr(part, name)
            if theirs is not None:
                mine.merge(theirs)
            elif not (whole and name in WHOLE_CHUNK):
                mine.update(chunk, decisions)

    def update_whole(self, chunk: Chunk) -> None:
        """Fold a chunk whose parts went through `update_from(..., whole=True)` into the WHOLE_CHUNK accumulators."""
        fused_row_sums(chunk)  # the row sums a run without --by takes: the same numbers
        for name in WHOLE_CHUNK:
            accumulator = getattr(self, name)
            if accumulator is not None:
                accumulator.update(chunk, ChunkDecisions())

    def pack(self) -> None:
        """Shrink every accumulator's state while nothing updates it (a breakdown state at rest)."""
        for accumulator in self.accumulators:
            accumulator.pack()

    def merge(self, other: BatchAccumulator) -> None:
        """Fold the state of another shard of the same batch into this one."""
        for mine, theirs in zip(self.accumulators, other.accumulators, strict=True):
            assert type(mine) is type(theirs), "merging batches of different configurations"
            mine.merge(theirs)

    @property
    def valid_tokens(self) -> int:
        """Valid tokens seen so far."""
        return int(self.diagnostics.state.get("tokens"))

    def compute(self) -> BatchResult:
        """verl's `rollout_corr/` keys (or an older family's) and the `diag/` keys; all `None` without a valid token."""
        tokens = self.valid_tokens
        result = BatchResult(metrics={}, valid_tokens=tokens)
        if tokens == 0:
            return self._no_valid_token(result)
        family: dict[str, float] = {}
        for accumulator in self.accumulators:
            part = accumulator.compute()
            clash = family.keys() & part.family.keys() | result.metrics.keys() & part.metrics.keys()
            assert not clash, f"{sorted(clash)} reported twice"
            family.update(part.family)
            result.metrics.update(part.metrics)
            result.notes += part.notes
            result.icepop_rejects_all |= part.icepop_rejects_all
            for name in TABLES:
                if getattr(part, name) and name == "signatures":  # the signatures' and the evidence's keys
                    result.signatures = {**result.signatures, **part.signatures}
                elif getattr(part, name):
                    setattr(result, name, getattr(part, name))
        result.metrics = {**{k: finite_or_none(family[k]) for k in sorted(family)}, **result.metrics}
        # None: an input the trainer needs is absent (its accumulator says which in a note).
        infinite = sorted(k for k, v in family.items() if v is not None and math.isinf(v))
        undefined = sorted(k for k, v in family.items() if v is not None and math.isnan(v))
        if infinite:
            result.notes.append(f"{', '.join(infinite)} {INFINITE_NOTE}")
        if undefined:  # NaN: no value to reduce, a std of one value, or NaN log-probs the trainer kept
            result.notes.append(f"{', '.join(undefined)} {UNDEFINED_NOTE}")
        # Intervals only for keys this family reports (older families name theirs differently).
        result.intervals = {k: v for k, v in result.intervals.items() if result.metrics.get(k) is not None}
        return result

    def _no_valid_token(self, result: BatchResult) -> BatchResult:
        if self.family is not None and self.family.spec.per_pack:
            # xtuner does not raise on an all-masked pack: it reports valid = 0 and +-inf, and so do we.
            family = self.family.compute().family
            result.metrics.update({k: finite_or_none(v) for k, v in family.items()})
            result.notes.append("no valid token: xtuner reports valid = 0, +-inf extrema (null here) and an "
                                "infinite ESS for such a pack, and its merge skips the pack")
            return result
        if self.trainer is not None:  # a trainer may log numbers for a batch without a token (TRL: 0.0, weight 1)
            part = self.trainer.compute()
            result.metrics.update({k: finite_or_none(v) for k, v in part.family.items()})
            result.notes += part.notes
        for key in OFFPOLICY_KEYS if not self.correction.replay else ():
            result.metrics[VERL_PREFIX + key] = None
        diag = self.diagnostics.values()
        for key in ("sequences", "valid_tokens", "empty_rows", "nonfinite_tokens", "sentinel_tokens"):
            result.metrics[DIAG_PREFIX + key] = diag[key]
        result.notes.append("no valid token, so its metrics are null")
        return result
