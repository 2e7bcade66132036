"""A setting the trainer accepts that makes its correction degenerate (bounds reversed, a cap <= 0, a veto that can
never fire): the run replays it exactly, and this finding leads the screen and What to do with what it does here.

Each trainer declares its own (`ReplayFamily.degenerate`, built with correction.model's `reversed_band` and
`cap_not_positive`), so the rule is written once and every family gets it.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.answers.findings.model import Finding, percent
from mismatch_cli.correction import replay_families

CODE = "degenerate_setting"


def degenerate_settings(report: Any) -> list[Finding]:
    """Every degenerate setting of the run's replayed trainer, with its key's value on this dump."""
    config = report.config or {}
    family = replay_families().get(str(config.get("semantics")))
    if family is None:
        return []
    found = []
    for rule in family.degenerate:
        if not rule.when(config):
            continue
        given = ", ".join(f"{name}={config.get(name)}" for name in rule.fields)
        value = report.metrics.get(rule.shown_by) if rule.shown_by else None
        here = f"; here {rule.shown_by.split('/')[-1]} = {_shown(value)}" if value is not None else ""
        evidence = {"fields": {name: config.get(name) for name in rule.fields}, "does": rule.does,
                    "key": rule.shown_by or None, "value": value}
        found.append(Finding(
            CODE, "error", f"{given}: {family.title.split(' ')[0]} {rule.does}{here}", evidence,
            f"{family.title} accepts {given} and runs it as it is (replayed exactly here): it {rule.does}.",
            fix=rule.fix or f"change {rule.fields[0]}"))
    return found


def _shown(value: Any) -> str:
    return percent(value) if isinstance(value, float) and 0 <= value <= 1 else f"{value:.4g}" \
        if isinstance(value, float) else str(value)


__all__ = ["CODE", "degenerate_settings"]
