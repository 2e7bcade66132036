"""A finding: one cause or bug signature with its evidence, serializable to JSON (no torch, no I/O)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")  # most severe first


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
