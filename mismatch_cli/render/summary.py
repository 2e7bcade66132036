"""The first screen of `mismatch analyze`: is it healthy, why not, what to do, in about 40 lines.

Every line is laid out here and wrapped only at spaces, so a number or a key is never split across
lines whatever the terminal width; `--full` prints every table instead (render/table.py). The words
come from render/lead.py, which report.html shares.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape

from mismatch_cli.render.lead import (
    BAD,
    NO_BUG,
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
from mismatch_cli.render.paths import paths_in_text
from mismatch_cli.report import Report

SHOWN_FINDINGS = 4
SHOWN_WARNINGS = 2
SHOWN_DRIFT = 3
PATH_ROOM = 20  # a path inside a paragraph leaves room for the indent and a `:row:position` after it
SEVERITY_MARK = {"error": "!! ", "warning": "! ", "info": "i "}


class Lines:
    """Text lines for a given width: wrapped at spaces only, with a hanging indent."""

    def __init__(self, width: int) -> None:
        self.width = max(width, 40)
        self.lines: list[tuple[str, str]] = []  # (text, rich style)

    def add(self, text: str, indent: int = 0, hang: int = 2, style: str = "") -> None:
        """One paragraph: wrapped to the width; continuation lines indented by `hang` more."""
        wrapped = textwrap.wrap(text, width=self.width, initial_indent=" " * indent,
                                subsequent_indent=" " * (indent + hang), break_long_words=False,
                                break_on_hyphens=False) or [""]
        # A word longer than the room after the indent (a trainer's setting key) moves left rather than past the
        # right edge; it is never split.
        wrapped = [line if len(line) <= self.width or " " in line.strip()
                   else " " * max(self.width - len(line.strip()), 0) + line.strip() for line in wrapped]
        self.lines += [(line, style) for line in wrapped]

    def blank(self) -> None:
        """An empty line between blocks."""
        if self.lines and self.lines[-1][0]:
            self.lines.append(("", ""))

    def heading(self, text: str) -> None:
        """A block's title."""
        self.blank()
        self.lines.append((text, "bold"))


def _correction(report: Report) -> str:
    config = report.config
    semantics = config.get("semantics", "verl")
    return f"correction: {correction_text(config)} · semantics {semantics} · " \
           f"{config.get('device')} {config.get('dtype')}"


def _health(out: Lines, report: Report) -> None:
    answer = verdict(report)
    out.add(f"Health: {answer.headline}", style="bold red" if answer.tone == BAD else "bold green")
    for line in answer.checks:
        out.add(line.text, indent=2, hang=4, style="red" if line.tone == BAD else "")
        if line.note:
            out.add(line.note, indent=6, hang=2)
    if answer.before:
        out.add(answer.before, indent=2, hang=4)


def _findings(out: Lines, findings: list[Mapping[str, Any]], cause: bool, against: str = "") -> None:
    chosen = causes(findings) if cause else bug_signatures(findings)
    if cause:
        if not chosen:
            return
        out.heading("Why")
    else:
        out.heading("Dump checks (bug signatures)")
        if not chosen:
            out.add(f"{NO_BUG}; {against}" if against else NO_BUG, indent=2, hang=2)
            return
    for finding in chosen[:SHOWN_FINDINGS]:
        mark = SEVERITY_MARK.get(str(finding.get("severity")), "- ")
        out.add(f"{mark}{finding.get('title', '')}", indent=2, hang=2,
                style="red" if finding.get("severity") == "error" else "")
        if finding.get("detail"):
            out.add(str(finding["detail"]), indent=4, hang=0)
    if len(chosen) > SHOWN_FINDINGS:
        out.add(f"+{len(chosen) - SHOWN_FINDINGS} more in report.json (`findings`)", indent=2)
    if against:
        out.add(against, indent=2, hang=2)


def _recommendation(out: Lines, report: Report) -> None:
    recommendation = getattr(report, "recommendation", None)
    lines = what_to_do_of(report)
    if not lines and not recommendation:
        return
    out.heading("What to do")
    for line in lines:
        out.add(line.text, indent=2, hang=2 if line.prose else 4, style="red" if line.tone == BAD else "")


def _drift(out: Lines, drift: Mapping[str, Mapping[str, Any]] | None) -> None:
    block = drift_lines(drift)
    if block is None:
        return
    title, lines = block
    out.heading(title)
    for line in lines[:SHOWN_DRIFT]:
        out.add(line.text, indent=2, hang=2 if line.prose else 4)
    if len(lines) > SHOWN_DRIFT:
        out.add(f"+{len(lines) - SHOWN_DRIFT} more in report.json (`drift`)", indent=2)


def _key_metrics(out: Lines, report: Report) -> None:
    title, rows = key_metrics(report)
    if not rows:
        return
    out.heading(title)
    name_width = max(len(row.name) for row in rows)
    for row in rows:
        text = f"{row.name:<{name_width}}  {row.value:>10}"
        if row.interval:
            text += f"  [{row.interval[0]}, {row.interval[1]}]"
        out.add(text, indent=2, hang=4)
        if row.note:
            out.add(row.note, indent=4, hang=2)


def summary_lines(report: Report, width: int = 80, warnings: bool = True) -> list[tuple[str, str]]:
    """The summary's lines (text, rich style) for a terminal `width` columns wide (`warnings` off for `-q`)."""
    out = Lines(width)
    out.add(f"mismatch: {inputs_text(report, out.width)}", style="bold")
    out.add(_correction(report))
    paths = [item.path for item in report.inputs]  # a worst token's `file:row:position`, shown at the width
    findings = [{**f, "detail": paths_in_text(str(f.get("detail") or ""), paths, out.width - PATH_ROOM)}
                for f in findings_of(report)]
    for line in setting_warnings(findings, report.summary):  # what the settings do leads the screen
        out.add(line, hang=4, style="bold red")
    out.blank()
    _health(out, report)
    _findings(out, findings, cause=True)
    _recommendation(out, report)
    _findings(out, findings, cause=False, against=ruled_out(report))
    _drift(out, getattr(report, "drift", None))
    _key_metrics(out, report)
    if report.warnings and warnings:
        out.heading(f"Warnings ({len(report.warnings)})")
        for warning in report.warnings[:SHOWN_WARNINGS]:
            out.add(f"warning: {paths_in_text(warning, paths, out.width - PATH_ROOM)}", indent=2, hang=4)
        if len(report.warnings) > SHOWN_WARNINGS:
            out.add(f"+{len(report.warnings) - SHOWN_WARNINGS} more with --full", indent=2)
    terms = glossary("\n".join(text for text, _ in out.lines))
    out.heading("Next")
    out.add("--full: every table · --out-dir DIR: JSON, HTML, plots · mismatch metrics KEY", indent=2)
    if terms:
        out.add(f"terms: {terms}", indent=2, hang=4)
    return out.lines


def render_summary(report: Report, console: Console, warnings: bool = True) -> None:
    """Print the one-screen summary on `console`, wrapped to its width."""
    for text, style in summary_lines(report, console.width, warnings):
        console.print(f"[{style}]{escape(text)}[/]" if style else escape(text), highlight=False, soft_wrap=True)


__all__ = ["render_summary", "summary_lines"]
