"""Markdown for a report: the same sections as the terminal, pasteable into an issue."""

from __future__ import annotations

from mismatch_cli.render.paths import display_path
from mismatch_cli.render.sections import build_sections
from mismatch_cli.report import Report


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured Markdown."""
    lines = ["# mismatch report", ""]
    for section in build_sections(report):
        lines += [f"## {section.title}", ""]
        lines.append("| " + " | ".join(section.columns) + " |")
        lines.append("|" + "|".join("---" for _ in section.columns) + "|")
        paths = section.path_columns()
        for row in section.rows:
            cells = [display_path(cell) if j in paths else cell for j, cell in enumerate(row)]
            lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
        lines.append("")
        if section.note:
            lines += [_escape(section.note), ""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {_escape(w)}" for w in report.warnings] + [""]
    return "\n".join(lines)
