"""GitHub Actions output: `::error` / `::warning` annotations (capped, worst first) and a step-summary table."""

from __future__ import annotations

from mismatch_cli.gate.thresholds import CheckResult
from mismatch_cli.render.cells import format_value, markdown_cell

MAX_ANNOTATIONS = 10
TITLE = "mismatch check"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(result: CheckResult, limit: int = MAX_ANNOTATIONS) -> list[str]:
    """Workflow-command lines: breaches worst first as errors, then unevaluated rules, then warnings (missing
    metrics, relative rules on signed metrics), then rules held back as noise as notices."""
    ordered = [("error", o, o.message) for o in result.breaches]
    ordered += [("error", o, o.message) for o in result.outcomes if o.status == "error"]
    ordered += [("warning", o, o.message) for o in result.outcomes if o.status == "warn"]
    ordered += [("warning", o, warning) for o in result.outcomes for warning in o.warnings]
    ordered += [("notice", o, o.message) for o in result.outcomes if o.status == "held"]
    lines = [f"::{level} title={_escape_property(TITLE)}::{_escape_data(o.rule.text + ': ' + text)}"
             for level, o, text in ordered[:limit]]
    if len(ordered) > limit:
        lines.append(f"::notice title={_escape_property(TITLE)}::{len(ordered) - limit} more finding(s) "
                     "not annotated; see the job summary")
    return lines


def step_summary(result: CheckResult, input_label: str, baseline_label: str | None) -> str:
    """A Markdown block for $GITHUB_STEP_SUMMARY."""
    icon = {"pass": "pass", "fail": "**FAIL**", "held": "held (noise)", "error": "**error**", "warn": "warning",
            "skip": "skipped"}
    lines = ["### mismatch check", "", f"input: `{input_label}`" + (f", baseline: `{baseline_label}`"
                                                                    if baseline_label else ""), ""]
    lines += ["| status | rule | value | baseline | detail |", "|---|---|---|---|---|"]
    for o in result.outcomes:
        cells = [icon[o.status], f"`{o.rule.text}`", format_value(o.value) if o.value is not None else "-",
                 format_value(o.baseline) if o.baseline is not None else "-",
                 "; ".join([o.message, *(f"warning: {w}" for w in o.warnings)])]
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    lines += ["", f"**{result.verdict()}**", ""]
    return "\n".join(lines)


__all__ = ["MAX_ANNOTATIONS", "annotations", "step_summary"]
