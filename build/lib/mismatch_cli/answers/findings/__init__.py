"""Findings: the causes of a failing health check and the bug signatures of a dump, each with its evidence.

Pure Python over a computed report and the engine's signature sums (no torch): `find(report, table)`.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.answers.findings.causes import concentrated_divergence, concentration
from mismatch_cli.answers.findings.model import SEVERITIES, Finding
from mismatch_cli.answers.findings.signatures import signatures


def find(report: Any, table: dict[str, Any]) -> list[Finding]:
    """Every finding of a report (bug signatures, then causes), most severe first."""
    found = signatures(report.metrics, table)
    found += concentrated_divergence(report, table, found)
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


__all__ = ["SEVERITIES", "Finding", "concentration", "find"]
