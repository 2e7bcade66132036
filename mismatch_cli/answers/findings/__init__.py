"""Findings: the causes of a failing health check and the bug signatures of a dump, each with its evidence.

Pure Python over a computed report and the engine's signature sums (no torch): `find(report, table)`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mismatch_cli.answers.advice import fix_text
from mismatch_cli.answers.findings.causes import concentrated_divergence, concentration
from mismatch_cli.answers.findings.degenerate import degenerate_settings
from mismatch_cli.answers.findings.drops import correction_drops
from mismatch_cli.answers.findings.lag import policy_lag
from mismatch_cli.answers.findings.model import SEVERITIES, Finding
from mismatch_cli.answers.findings.signatures import signatures


def find(report: Any, table: dict[str, Any]) -> list[Finding]:
    """Every finding of a report (bug signatures, the correction's drops, then causes), most severe first, each
    fix said in the report's trainer."""
    found = signatures(report.metrics, table) + policy_lag(report.metrics, table)
    found += degenerate_settings(report) + correction_drops(report)
    found += concentrated_divergence(report, table, found)
    found = [replace(f, fix=fix_text(f.fix, f.code, report.config or {}, f.evidence)) if f.fix else f
             for f in found]
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


__all__ = ["SEVERITIES", "Finding", "concentration", "find"]
