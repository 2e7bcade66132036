"""One self-contained HTML page for a report: inline CSS, plots embedded as data URIs, no external resource."""

from __future__ import annotations

import base64
from html import escape

from mismatch_cli.render.html_lead import LEAD_STYLE, render_lead
from mismatch_cli.render.lead import correction_text
from mismatch_cli.render.plots import CAPTIONS
from mismatch_cli.render.sections import Section, build_sections
from mismatch_cli.report import Report

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #1d1d1f;
       background: #f6f7f9; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 30px 0 10px; border-bottom: 1px solid #d9dce1; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #555; font-size: 13px; margin: 2px 0; }
.status { display: inline-block; padding: 3px 12px; border-radius: 12px; font-weight: 600; font-size: 14px; }
.status.healthy { background: #d8f3dc; color: #1b5e20; }
.status.warning { background: #ffe8cc; color: #8a4b00; }
.warnings { background: #fff6e0; border-left: 4px solid #f0a400; padding: 8px 14px; font-size: 13px; }
.warnings li { margin: 3px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px; background: #fff; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e6e8eb; text-align: right; white-space: nowrap; }
th { background: #eef0f3; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
td.prose, th.prose { text-align: left; white-space: normal; color: #444; }
tr.hl td { background: #fff3d6; font-weight: 600; }
.scroll { overflow-x: auto; }
.note { font-size: 12px; color: #555; margin: 0 0 10px; }
.plots { display: grid; grid-template-columns: 1fr; gap: 18px; }
figure { margin: 0; background: #fff; border: 1px solid #e0e3e7; border-radius: 6px; padding: 10px; }
figure img { width: 100%; max-width: 900px; height: auto; display: block; margin: 0 auto; }
figcaption { font-size: 12px; color: #555; margin-top: 6px; }
footer { margin-top: 36px; font-size: 12px; color: #777; }
"""
PROSE_COLUMNS = {"meaning", "healthy range", "file", "setting", "sequence"}


def _table(section: Section, title: bool = True) -> str:
    prose = [column in PROSE_COLUMNS for column in section.columns]
    head = "".join(f'<th class="prose">{escape(c)}</th>' if prose[j] and j > 0 else f"<th>{escape(c)}</th>"
                   for j, c in enumerate(section.columns))
    rows = []
    for i, row in enumerate(section.rows):
        cells = "".join(
            f'<td class="prose">{escape(cell)}</td>' if prose[j] and j > 0 else f"<td>{escape(cell)}</td>"
            for j, cell in enumerate(row)
        )
        rows.append(f'<tr class="hl">{cells}</tr>' if i in section.highlight else f"<tr>{cells}</tr>")
    note = f'<p class="note">{escape(section.note)}</p>' if section.note else ""
    heading = f"<h3>{escape(section.title)}</h3>\n" if title else ""
    return (f"{heading}<div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>{note}")


def _figure(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    caption = escape(CAPTIONS.get(name, name))
    return (f'<figure id="{escape(name)}"><img alt="{caption}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(name)}: {caption}</figcaption></figure>")


def render_html(report: Report, images: dict[str, bytes]) -> str:
    """The report as one HTML document: the answers of the terminal's first screen (render/html_lead.py), then
    the evidence: the health table, the plots and every table of the terminal report."""
    sections = build_sections(report)
    status = str(report.summary.get("status", "healthy"))
    inputs = ", ".join(f"{item.path} ({item.sequences:,} sequences, {item.tokens:,} valid tokens)"
                       for item in report.inputs)
    config = report.config
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mismatch report: {escape(status)}</title>",
        f"<style>{STYLE}{LEAD_STYLE}</style></head><body><main>",
        "<h1>mismatch report</h1>",
        f'<p class="meta">{escape(report.created_at)} · {escape(report.tool.get("name", ""))} '
        f'{escape(report.tool.get("version", ""))} · device {escape(str(config.get("device")))}, '
        f'{escape(str(config.get("dtype")))}</p>',
        f'<p class="meta">Inputs: {escape(inputs)}</p>',
        f'<p class="meta">Correction: {escape(correction_text(config))} · semantics '
        f'{escape(str(config.get("semantics", "verl")))}</p>',
        render_lead(report),
        '<h2 class="evidence">The evidence</h2>',
    ]
    health = next((s for s in sections if s.title.startswith("Health")), None)
    if health is not None:
        parts.append(_table(Section("Health checks", health.columns, health.rows, health.highlight)))
    if images:
        parts.append("<h3>Plots</h3>")
        figures = [_figure(name, images[name]) for name in CAPTIONS if name in images]
        figures += [_figure(name, png) for name, png in images.items() if name not in CAPTIONS]
        parts.append(f'<div class="plots">{"".join(figures)}</div>')
    for section in sections:
        if section is not health:
            parts.append(_table(section))
    parts.append(f"<footer>Written by {escape(report.tool.get('name', 'mismatch'))} "
                 f"{escape(report.tool.get('version', ''))}; report schema {report.schema_version}. "
                 "Δ = old_log_probs − rollout_log_probs on valid tokens.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["render_html"]
