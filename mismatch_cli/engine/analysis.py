"""One batch's accumulators (off-policy, IS, RS, diagnostics) behind update / merge / compute."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mismatch_cli.correction import ResolvedCorrection
from mismatch_cli.engine.bootstrap import DEFAULT_REPLICATES, BootstrapAccumulator
from mismatch_cli.engine.chunk import Chunk
from mismatch_cli.engine.diagnostics import DiagnosticsAccumulator
from mismatch_cli.engine.family import FamilyAccumulator
from mismatch_cli.engine.importance import ImportanceAccumulator
from mismatch_cli.engine.offpolicy import OFFPOLICY_KEYS, OffPolicyAccumulator
from mismatch_cli.engine.rejection import RejectionAccumulator
from mismatch_cli.engine.rounds import RoundsAccumulator
from mismatch_cli.engine.whatif import WhatIfAccumulator
from mismatch_cli.engine.worst import WorstSequences

VERL_PREFIX = "rollout_corr/"
DIAG_PREFIX = "diag/"


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
    icepop_rejects_all: bool = False
    notes: list[str] = field(default_factory=list)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class BatchAccumulator:
    """Everything computed for one batch (the whole dump, or one step): mergeable, fixed size."""

    def __init__(self, correction: ResolvedCorrection, device: torch.device, rounds: bool = True,
                 extras: bool = True, bootstrap: int = DEFAULT_REPLICATES) -> None:
        self.correction = correction
        self.offpolicy = OffPolicyAccumulator(device)
        self.diagnostics = DiagnosticsAccumulator(device)
        # The what-if ladder and the worst sequences (the overall batch needs them; per-step ones may not).
        self.what_if = WhatIfAccumulator(correction.k1_bounds, device) if extras else None
        self.worst = WorstSequences() if extras else None
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
        # An older family (verl <= 0.7.1, xtuner) replaces verl 0.9's IS keys with its own blocks.
        self.family = FamilyAccumulator(correction.family_spec, device) if correction.family_spec is not None else None
        self.rounds = RoundsAccumulator(device) if rounds else None
        self.bootstrap = (
            BootstrapAccumulator(bootstrap, device, correction.is_level if self.importance else None,
                                 self.rejection is not None)
            if bootstrap > 0
            else None
        )

    def update(self, chunk: Chunk) -> None:
        """Fold one chunk of whole sequences into every family's state."""
        self.offpolicy.update(chunk)
        self.diagnostics.update(chunk)
        if self.what_if is not None:
            self.what_if.update(chunk)
        if self.worst is not None:
            self.worst.update(chunk)
        if self.importance is not None:
            self.importance.update(chunk)
        if self.rejection is not None:
            self.rejection.update(chunk)
        if self.bootstrap is not None:
            self.bootstrap.update(chunk)  # after IS / RS: it reads their per-token and per-row decisions
        if self.family is not None:
            self.family.update(chunk)
        if self.rounds is not None:
            self.rounds.update(chunk)  # last: it reads the IS weights and RS decisions of this chunk

    def merge(self, other: BatchAccumulator) -> None:
        """Fold the state of another shard of the same batch into this one."""
        self.offpolicy.merge(other.offpolicy)
        self.diagnostics.merge(other.diagnostics)
        if self.what_if is not None and other.what_if is not None:
            self.what_if.merge(other.what_if)
        if self.worst is not None and other.worst is not None:
            self.worst.merge(other.worst)
        if self.importance is not None and other.importance is not None:
            self.importance.merge(other.importance)
        if self.rejection is not None and other.rejection is not None:
            self.rejection.merge(other.rejection)
        if self.family is not None and other.family is not None:
            self.family.merge(other.family)
        if self.rounds is not None and other.rounds is not None:
            self.rounds.merge(other.rounds)
        if self.bootstrap is not None and other.bootstrap is not None:
            self.bootstrap.merge(other.bootstrap)

    @property
    def valid_tokens(self) -> int:
        """Valid tokens seen so far."""
        return int(self.offpolicy.state.get("tokens"))

    def compute(self) -> BatchResult:
        """verl's `rollout_corr/` keys and the `diag/` keys; all `None` when no token is valid."""
        diag = self.diagnostics.compute()
        tokens = self.valid_tokens
        result = BatchResult(metrics={}, valid_tokens=tokens)
        verl_keys = list(OFFPOLICY_KEYS)
        if tokens == 0 and self.family is not None and self.family.spec.per_pack:
            # xtuner does not raise on an all-masked pack: it reports valid = 0 and +-inf, and so do we.
            family, _ = self.family.compute(None)
            result.metrics.update({k: _finite_or_none(v) for k, v in family.items()})
            result.notes.append("no valid token: xtuner reports valid = 0, +-inf extrema (null here) and an "
                                "infinite ESS for such a pack, and its merge skips the pack")
            return result
        if tokens == 0:
            for key in verl_keys:
                result.metrics[VERL_PREFIX + key] = None
            for key in ("sequences", "valid_tokens", "empty_rows", "nonfinite_tokens", "sentinel_tokens"):
                result.metrics[DIAG_PREFIX + key] = diag[key]
            result.notes.append("no valid token, so its metrics are null")
            return result
        verl: dict[str, float] = {}
        if self.importance is not None:
            is_metrics, all_zero = self.importance.compute()
            verl.update(is_metrics)
            if all_zero:
                result.icepop_rejects_all = True
                result.notes.append(
                    "every valid IS weight is outside the IcePop band, so the ESS is undefined "
                    "(verl raises ZeroDivisionError here)"
                )
        if self.rejection is not None:
            verl.update(self.rejection.compute())
        verl.update(self.offpolicy.compute())
        if self.family is not None:
            family, notes = self.family.compute({k: verl.pop(k) for k in OFFPOLICY_KEYS})
            result.notes += notes
            family.update({VERL_PREFIX + k: v for k, v in verl.items()})  # verl 0.7.1's k1/k2/k3 RS keys
            verl = {k: v for k, v in family.items()}
            for key in sorted(verl):
                result.metrics[key] = _finite_or_none(verl[key])
        else:
            for key in sorted(verl):
                result.metrics[VERL_PREFIX + key] = _finite_or_none(verl[key])
        for key, value in diag.items():
            result.metrics[DIAG_PREFIX + key] = _finite_or_none(value)
        result.quantiles = self.diagnostics.quantiles()
        result.histograms = self.diagnostics.histograms()
        if self.what_if is not None:
            result.what_if = self.what_if.compute()
        if self.worst is not None:
            result.worst_sequences = self.worst.compute()
        if self.rounds is not None:
            result.metrics[DIAG_PREFIX + "rounds"] = float(self.rounds.total_rounds)
            round_metrics, result.rounds, result.rounds_from_end = self.rounds.compute()
            result.metrics.update(round_metrics)
        overflowed = sorted(k for k, v in verl.items() if not math.isfinite(v))
        if overflowed:
            result.notes.append(f"{', '.join(overflowed)} overflowed (reported as null)")
        if self.bootstrap is not None:
            # Only for keys this family reports (older families name theirs differently).
            result.intervals = {k: v for k, v in self.bootstrap.compute().items()
                                if result.metrics.get(k) is not None}
        return result
