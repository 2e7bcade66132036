"""A configured correction that removes more of the batch than the drop band allows (any family's keys).

The registry marks every key that is a share of tokens or sequences a correction masks, rejects or drops
(`Metric.removes`); health holds them to the drop band (verl's band for its veto fraction, ≤ 10 %). Beyond it the
correction trains on what little it keeps, so this finding leads What to do and the verdict is never healthy.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.answers.findings.model import Finding, percent
from mismatch_cli.answers.health import applies_correction, removal_checks

CODE = "correction_drops"


def correction_drops(report: Any) -> list[Finding]:
    """The run's own correction removes more tokens or sequences than the drop band allows."""
    if not report.config or not applies_correction(report.config):
        return []
    over = [c for c in removal_checks(report.metrics) if not c["ok"]]
    if not over:
        return []
    shares: dict[str, float] = {}
    for check in removal_checks(report.metrics):
        unit = _unit(check["metric"])
        shares[unit] = max(shares.get(unit, 0.0), check["value"])
    drops = " and ".join(f"{percent(shares[unit])} of {unit}" for unit in ("tokens", "sequences") if unit in shares)
    keys = ", ".join(f"{c['metric'].split('/')[-1]} {c['value']:.3g}" for c in over)
    evidence = {"removed_token_fraction": shares.get("tokens"), "removed_sequence_fraction": shares.get("sequences"),
                "keys": {c["metric"]: c["value"] for c in over}, "healthy_range": over[0]["healthy_range"]}
    return [Finding(
        CODE, "error", f"your correction drops {drops}", evidence,
        f"The configured correction removes them from the gradient ({keys}; healthy: {over[0]['healthy_range']}, "
        "verl's band for the share of sequences its veto drops): the loss trains on what little it keeps.",
        fix="loosen it, or replace it with the lighter setting below")]


def _unit(key: str) -> str:
    from mismatch_cli.metrics import lookup

    metric = lookup(key)
    return metric.removes if metric is not None and metric.removes else "tokens"


__all__ = ["CODE", "correction_drops"]
