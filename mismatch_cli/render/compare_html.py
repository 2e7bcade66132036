"""One self-contained HTML page for a comparison: verdict, side-by-side tables, limits, overlaid plots."""

from __future__ import annotations

import base64
from html import escape

from mismatch_cli.comparison import Comparison
from mismatch_cli.render.compare import COLUMNS, ROUND_COLUMNS, check_cells, legend, metric_cells, round_cells
from mismatch_cli.render.html import STYLE

CAPTIONS = {
    "compare_metrics.png": "each headline metric on both sides, with its 95 % bootstrap interval",
    "compare_log_ratio_hist.png": "distribution of Δ = old − rollout log-prob on both sides",
    "compare_rounds.png": "mean |Δ| per round on both sides",
}
EXTRA_STYLE = """
.verdict { font-size: 15px; font-weight: 600; padding: 8px 14px; border-radius: 6px; background: #eef0f3; }
.verdict.fail, .verdict.worse { background: #ffe1e1; color: #8a1010; }
.verdict.better { background: #d8f3dc; color: #1b5e20; }
tr.mark-worse td { background: #ffecec; }
tr.mark-better td { background: #e9f7ec; }
"""
_ROW_CLASS = {"+": "mark-worse", "!": "mark-worse", "-": "mark-better"}


def _rows(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(c or 'mark')}</th>" for c in columns)
    body = "".join(
        f'<tr class="{_ROW_CLASS.get(row[0], "")}">' + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>"
        for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _verdict_class(verdict: str) -> str:
    for word, css in (("FAIL", "fail"), ("WORSE", "worse"), ("BETTER", "better")):
        if f"verdict: {word}" in verdict:
            return css
    return ""


def render_compare_html(comparison: Comparison, images: dict[str, bytes]) -> str:
    """The comparison as one HTML document with its plots embedded as data URIs."""
    verdict = comparison.verdict()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mismatch compare: {escape(comparison.base_label)} vs {escape(comparison.candidate_label)}</title>",
        f"<style>{STYLE}{EXTRA_STYLE}</style></head><body><main>",
        "<h1>mismatch compare</h1>",
        f'<p class="meta">base (reference): {escape(comparison.base_label)}</p>',
        f'<p class="meta">candidate: {escape(comparison.candidate_label)}</p>',
        f'<p class="verdict {_verdict_class(verdict)}">{escape(verdict)}</p>',
        "<h2>Metrics</h2>",
        _rows(COLUMNS, [metric_cells(row) for row in comparison.rows]),
    ]
    if legend(comparison):
        parts.append(f'<p class="note">{escape(legend(comparison))}</p>')
    if comparison.check is not None:
        parts += ["<h2>Limits</h2>", _rows(["", "rule", "value", "baseline", "status"], check_cells(comparison))]
    if comparison.rounds:
        parts += ["<h2>Per round</h2>", _rows(ROUND_COLUMNS, round_cells(comparison))]
    if comparison.notes:
        items = "".join(f"<li>{escape(note)}</li>" for note in comparison.notes)
        parts.append(f'<div class="warnings"><strong>Notes</strong><ul>{items}</ul></div>')
    if images:
        parts.append('<h2>Plots</h2><div class="plots">')
        for name, png in images.items():
            data = base64.b64encode(png).decode("ascii")
            caption = escape(CAPTIONS.get(name, name))
            parts.append(f'<figure id="{escape(name)}"><img alt="{caption}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{escape(name)}: {caption}</figcaption></figure>")
        parts.append("</div>")
    parts.append("<footer>Written by mismatch compare. Δ = old_log_probs − rollout_log_probs on valid tokens; "
                 "a change is called worse or better only when the two 95 % intervals do not overlap.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["render_compare_html"]
