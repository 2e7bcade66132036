"""Markdown for a report, pasteable into an issue: the terminal's answers first, then every table.

The answers (verdict with each check's mark and note, Why, What to do, the dump checks with their fixes,
drift, key metrics) come from render/lead.py, in the terminal's words and order; like report.html the
Markdown stands alone, so it lists every finding and every moving metric. Then the sections of
render/sections.py, as `--full` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.render.cells import markdown_cell
from mismatch_cli.render.lead import (
    NO_BUG,
    Line,
    bug_signatures,
    causes,
    correction_text,
    findings_of,
    glossary,
    inputs_text,
    key_metrics,
    ruled_out,
    setting_warnings,
    verdict,
    what_to_do_of,
)
from mismatch_cli.render.lead_drift import drift_lines
from mismatch_cli.render.paths import display_path
from mismatch_cli.render.sections import build_sections
from mismatch_cli.report import Report

SEVERITY_MARK = {"error": "!!", "warning": "!", "info": "i"}




def _item(line: Line) -> list[str]:
    """A list item with its naming words in bold and its note indented under it."""
    text = markdown_cell(line.text)
    if line.lead and line.text.startswith(line.lead) and not line.prose:
        text = f"**{markdown_cell(line.lead)}**{markdown_cell(line.text[len(line.lead):])}"
    return [f"- {text}"] + ([f"  - {markdown_cell(line.note)}"] if line.note else [])


def _findings(title: str, findings: list[Mapping[str, Any]], empty: str | None, first_fix: str | None) -> list[str]:
    if not findings:
        return [f"## {title}", "", markdown_cell(empty), ""] if empty else []
    lines = [f"## {title}", ""]
    for finding in findings:
        mark = SEVERITY_MARK.get(str(finding.get("severity")), "-")
        lines.append(f"- `{mark}` **{markdown_cell(str(finding.get('title', '')))}**")
        if finding.get("detail"):
            lines.append(f"  {markdown_cell(str(finding['detail']))}")
        if finding.get("fix"):
            fix = "the first step of What to do, above" if finding["fix"] == first_fix else str(finding["fix"])
            lines.append(f"  - **fix**: {markdown_cell(fix)}")
    return [*lines, ""]


def lead_markdown(report: Report) -> list[str]:
    """The answers of the first screen as Markdown lines (render/lead.py's text)."""
    answer = verdict(report)
    lines = [markdown_cell(f"`mismatch` on {inputs_text(report)}; correction: {correction_text(report.config)}"), ""]
    lines += [f"**{markdown_cell(w)}**" for w in setting_warnings(findings_of(report), report.summary)]
    lines += ["", f"## Health: {markdown_cell(answer.headline)}", ""]
    for line in answer.checks:
        mark, text = line.text.split(" ", 1)
        lines.append(f"- `{mark}` {markdown_cell(text.lstrip())}")
        lines += [f"  - {markdown_cell(line.note)}"] if line.note else []
    lines += ["", markdown_cell(answer.before), ""] if answer.before else [""]
    findings = findings_of(report)
    diagnosis = report.summary.get("diagnosis") or {}
    lines += _findings("Why", causes(findings), None, None)
    recommendation = getattr(report, "recommendation", None)
    todo = what_to_do_of(report)
    if todo or recommendation:
        lines += ["## What to do", ""] + [item for line in todo for item in _item(line)] + [""]
    first_fix = diagnosis.get("fix") if diagnosis.get("kind") == "bug" else None
    lines += _findings("Dump checks (bug signatures)", bug_signatures(findings), NO_BUG, first_fix)
    against = ruled_out(report)
    if against:
        lines[-1:] = [markdown_cell(against), ""]
    block = drift_lines(getattr(report, "drift", None))
    if block is not None:
        lines += [f"## {block[0]}", ""] + [item for line in block[1] for item in _item(line)] + [""]
    title, rows = key_metrics(report)
    if rows:
        lines += [f"## {title}", "", "| metric | value | 95 % interval | what it means |", "|---|---|---|---|"]
        for row in rows:
            interval = f"[{row.interval[0]}, {row.interval[1]}]" if row.interval else ""
            lines.append(f"| `{row.key}` | {row.value} | {interval} | {markdown_cell(row.note or '')} |")
        lines.append("")
    terms = glossary("\n".join(lines))
    return [*lines, *([f"Terms: {markdown_cell(terms)}.", ""] if terms else [])]


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured Markdown: the answers, then every table."""
    lines = ["# mismatch report", "", *lead_markdown(report), "# Tables", ""]
    for section in build_sections(report):
        lines += [f"## {section.title}", ""]
        lines.append("| " + " | ".join(section.columns) + " |")
        lines.append("|" + "|".join("---" for _ in section.columns) + "|")
        paths = section.path_columns()
        for row in section.rows:
            cells = [display_path(cell) if j in paths else cell for j, cell in enumerate(row)]
            lines.append("| " + " | ".join(markdown_cell(cell) for cell in cells) + " |")
        lines.append("")
        if section.note:
            lines += [markdown_cell(section.note), ""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {markdown_cell(w)}" for w in report.warnings] + [""]
    return "\n".join(lines)
