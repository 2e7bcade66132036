"""A finding: one cause or bug signature with its evidence, serializable to JSON (no torch, no I/O)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")  # most severe first
# Thresholds the signature findings share (answers/findings/signatures.py and processors.py say why).
FILL_MIN_TOKENS = 10  # fewer tokens can meet a pattern by chance
MIN_Z = 5.0  # standard errors a mean must lie from its reference
RATIO_MEAN_TOLERANCE = 0.01  # 1 % of probability mass
BULK_LOG_RATIO = 1.0  # the bulk: tokens with |delta| below this (ratios in [1/e, e])


@dataclass(frozen=True)
class Finding:
    """What was found, how bad it is, and the numbers that show it."""

    code: str  # stable identifier: constant_fill, temperature_mismatch, concentrated_divergence, ...
    severity: str  # error | warning | info
    title: str  # one line
    evidence: dict[str, Any] = field(default_factory=dict)  # numbers (and the file / row / position they point at)
    detail: str = ""  # one sentence with the numbers
    fix: str = ""  # for a bug: what to change, in the trainer's or engine's own settings ("" for a symptom)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Rebuild a finding from its JSON mapping."""
        return cls(code=data["code"], severity=data["severity"], title=data["title"],
                   evidence=dict(data.get("evidence", {})), detail=data.get("detail", ""), fix=data.get("fix", ""))


def metric_value(metrics: dict[str, Any], key: str) -> float | None:
    """A `diag/` key's value as a float, None when absent or not finite."""
    value = metrics.get("diag/" + key)
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else float(value)


def percent(fraction: float) -> str:
    """A share as a short percentage ("0.001 %", "99.99 %", "12 %")."""
    value = 100.0 * fraction
    if value == 0:
        return "0 %"
    if value >= 99.9 and value < 100:
        return f"{min(value, 99.99):.2f} %"
    if value >= 10:
        return f"{value:.0f} %"
    if value >= 0.01:
        return f"{value:.2g} %"
    return f"{value:.1g} %"
