"""The top of report.html: the answers of the terminal's first screen, in its order and its words.

The verdict with each check, Why, What to do, the dump checks (each with its fix), drift and the key
metrics with their intervals, then the warnings; the text comes from render/lead.py, as the terminal's.
Unlike the terminal, the page lists every finding and every moving metric: it stands alone, without
the report.json the terminal points to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from mismatch_cli.render.lead import (
    BAD,
    NO_BUG,
    KeyMetric,
    Line,
    bug_signatures,
    causes,
    findings_of,
    glossary,
    key_metrics,
    ruled_out,
    setting_warnings,
    verdict,
    what_to_do_of,
)
from mismatch_cli.render.lead_drift import drift_lines
from mismatch_cli.report import Report

LEAD_STYLE = """
.status.bug { background: #ffd6d6; color: #9b1c1c; }
.verdict { font-size: 16px; font-weight: 600; margin: 6px 0 10px; }
.verdict.bad { color: #a40e26; }
.verdict.good { color: #1b5e20; }
ul.answers { list-style: none; padding-left: 0; margin: 4px 0 8px; font-size: 14px; }
ul.answers > li { margin: 5px 0; line-height: 1.4; }
ul.answers > li.bad { color: #a40e26; }
ul.answers > li.few { color: #8a4b00; }
.mark { display: inline-block; min-width: 2.6em; padding: 0 4px; margin-right: 4px; border-radius: 3px;
        font: 600 12px ui-monospace, Menlo, Consolas, monospace; text-align: center; }
.mark.ok { background: #d8f3dc; color: #1b5e20; }
.mark.few { background: #ffe8cc; color: #8a4b00; }
.mark.OUT, .mark.error { background: #ffd6d6; color: #9b1c1c; }
.mark.warning { background: #ffe8cc; color: #8a4b00; }
.mark.info { background: #e3ecfa; color: #1d4f91; }
.explain { color: #555; font-size: 13px; margin: 2px 0 0 3.3em; }
.detail { color: #333; font-size: 13px; margin: 3px 0 0 3.3em; }
.fix { font-size: 13px; margin: 3px 0 0 3.3em; }
p.answer { font-size: 14px; margin: 4px 0 8px; }
"""
SEVERITY_MARK = {"error": "!!", "warning": "!", "info": "i"}


def _line(line: Line) -> str:
    """A line with its naming words in bold; `lead` is where `text` starts."""
    if line.lead and line.text.startswith(line.lead):
        return f"<strong>{escape(line.lead)}</strong>{escape(line.text[len(line.lead):])}"
    return escape(line.text)


def _items(lines: Iterable[Line]) -> str:
    items = []
    for line in lines:
        if line.prose:
            items.append(f'<li class="prose">{escape(line.text)}</li>')
            continue
        note = f'<div class="explain">{escape(line.note)}</div>' if line.note else ""
        tone = ' class="bad"' if line.tone == BAD else ""
        items.append(f"<li{tone}>{_line(line)}{note}</li>")
    return f'<ul class="answers">{"".join(items)}</ul>'


def _health(report: Report) -> str:
    answer = verdict(report)
    items = []
    for line in answer.checks:
        text = line.text.split(" ", 1)[1].lstrip()  # the mark is shown as a badge
        note = f'<div class="explain">{escape(line.note)}</div>' if line.note else ""
        tone = ' class="few"' if line.lead == "few" else ' class="bad"' if line.tone == BAD else ""
        items.append(f'<li{tone}><span class="mark {escape(line.lead)}">{escape(line.lead)}</span> '
                     f"{escape(text)}{note}</li>")
    before = f'<p class="answer">{escape(answer.before)}</p>' if answer.before else ""
    return (f'<h2>Health <span class="status {escape(answer.status)}">{escape(answer.status)}</span></h2>'
            f'<p class="verdict {escape(answer.tone)}">{escape(answer.headline)}</p>'
            f'<ul class="answers">{"".join(items)}</ul>{before}')


def _findings(title: str, findings: list[Mapping[str, Any]], empty: str | None, first_fix: str | None = None) -> str:
    if not findings:
        return f'<h2>{escape(title)}</h2><p class="answer">{escape(empty)}</p>' if empty else ""
    items = []
    for finding in findings:
        severity = str(finding.get("severity", ""))
        mark = SEVERITY_MARK.get(severity, "-")
        detail = f'<div class="detail">{escape(str(finding["detail"]))}</div>' if finding.get("detail") else ""
        fix = "" if not finding.get("fix") else "the first step of What to do, above" \
            if finding["fix"] == first_fix else str(finding["fix"])
        fix = f'<div class="fix"><strong>fix</strong>: {escape(fix)}</div>' if fix else ""
        items.append(f'<li><span class="mark {escape(severity)}" title="{escape(severity)}">{escape(mark)}</span> '
                     f"<strong>{escape(str(finding.get('title', '')))}</strong>{detail}{fix}</li>")
    return f'<h2>{escape(title)}</h2><ul class="answers">{"".join(items)}</ul>'


def _what_to_do(report: Report) -> str:
    recommendation = getattr(report, "recommendation", None)
    lines = what_to_do_of(report)
    if not lines and not recommendation:
        return ""
    return f"<h2>What to do</h2>{_items(lines)}"


def _drift(report: Report) -> str:
    block = drift_lines(getattr(report, "drift", None))
    if block is None:
        return ""
    title, lines = block
    return f"<h2>{escape(title)}</h2>{_items(lines)}"


def _key_metrics(report: Report) -> str:
    title, rows = key_metrics(report)
    if not rows:
        return ""
    intervals, notes = any(row.interval for row in rows), any(row.note for row in rows)

    def cells(row: KeyMetric) -> str:
        interval = f"<td>[{escape(row.interval[0])}, {escape(row.interval[1])}]</td>" if row.interval else \
            "<td></td>"
        note = f'<td class="prose">{escape(row.note or "")}</td>'
        return (f'<tr><td title="{escape(row.key)}">{escape(row.name)}</td><td>{escape(row.value)}</td>'
                f'{interval if intervals else ""}{note if notes else ""}</tr>')

    head = "<th>metric</th><th>value</th>" + ("<th>95 % interval</th>" if intervals else "") + \
        ('<th class="prose">what it means</th>' if notes else "")
    return (f"<h2>{escape(title)}</h2><div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(cells(row) for row in rows)}</tbody></table></div>")


def render_lead(report: Report) -> str:
    """The answers, in the terminal's order: verdict, Why, What to do, dump checks, drift, key metrics, warnings."""
    findings = findings_of(report)
    diagnosis = report.summary.get("diagnosis") or {}
    first_fix = diagnosis.get("fix") if diagnosis.get("kind") == "bug" else None
    said = setting_warnings(findings, report.summary)  # what the settings do leads the page, as the screen
    parts = [
        "".join(f'<p class="answer"><strong>{escape(line)}</strong></p>' for line in said),
        _health(report),
        _findings("Why", causes(findings), None),
        _what_to_do(report),
        _findings("Dump checks (bug signatures)", bug_signatures(findings), NO_BUG, first_fix)
        + (f'<p class="answer">{escape(ruled_out(report))}</p>' if ruled_out(report) else ""),
        _drift(report),
        _key_metrics(report),
    ]
    terms = glossary("\n".join(parts))
    if terms:
        parts.append(f'<p class="answer"><strong>Terms</strong>: {escape(terms)}</p>')
    if report.warnings:
        items = "".join(f"<li>{escape(w)}</li>" for w in report.warnings)
        parts.append(f'<div class="warnings"><strong>Warnings ({len(report.warnings)})</strong><ul>{items}</ul></div>')
    return "\n".join(part for part in parts if part)


__all__ = ["LEAD_STYLE", "render_lead"]
