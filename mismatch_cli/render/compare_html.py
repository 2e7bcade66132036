"""One self-contained HTML page for a comparison: verdict, side-by-side tables, limits, overlaid plots."""

from __future__ import annotations

import base64
from html import escape

from mismatch_cli.gate.bugs import BUG
from mismatch_cli.gate.comparison import Comparison
from mismatch_cli.gate.nway import RunsComparison
from mismatch_cli.render.compare import (
    COLUMNS,
    ROUND_COLUMNS,
    bug_lines,
    check_cells,
    legend,
    metric_cells,
    round_cells,
    side_tags,
)
from mismatch_cli.render.html import STYLE

CAPTIONS = {
    "compare_metrics.png": "each headline metric on both sides, with its 95 % bootstrap interval",
    "compare_log_ratio_hist.png": "distribution of Δ = old − rollout log-prob on both sides",
    "compare_rounds.png": "mean |Δ| per round on both sides",
}
RUNS_CAPTIONS = {"compare_metrics.png": "each headline metric in every run, with its 95 % bootstrap interval"}
EXTRA_STYLE = """
.verdict { font-size: 15px; font-weight: 600; padding: 8px 14px; border-radius: 6px; background: #eef0f3; }
.verdict.fail, .verdict.worse { background: #ffe1e1; color: #8a1010; }
.verdict.better { background: #d8f3dc; color: #1b5e20; }
.verdict.bug, p.bug { background: #f6e0f6; color: #6a1b6a; }
p.bug { font-weight: 600; padding: 6px 14px; border-radius: 6px; }
tr.mark-worse td { background: #ffecec; }
tr.mark-bug td, td.bug { background: #f6e0f6; }
tr.mark-better td { background: #e9f7ec; }
td.best { background: #e9f7ec; font-weight: 600; }
td.worst { background: #ffecec; font-weight: 600; }
"""
_ROW_CLASS = {"+": "mark-worse", "!": "mark-worse", "-": "mark-better", BUG: "mark-bug"}


def _rows(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(c or 'mark')}</th>" for c in columns)
    body = "".join(
        f'<tr class="{_ROW_CLASS.get(row[0], "")}">' + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>"
        for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _verdict_class(verdict: str) -> str:
    for word, css in (("FAIL", "fail"), ("BUG", "bug"), ("WORSE", "worse"), ("BETTER", "better")):
        if f"verdict: {word}" in verdict:
            return css
    return ""


def _figures(images: dict[str, bytes], captions: dict[str, str]) -> list[str]:
    parts = ['<h2>Plots</h2><div class="plots">']
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        caption = escape(captions.get(name, name))
        parts.append(f'<figure id="{escape(name)}"><img alt="{caption}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{escape(name)}: {caption}</figcaption></figure>")
    return [*parts, "</div>"]


def _head(runs: str) -> list[str]:
    """The document's opening up to <main>, titled by the runs compared."""
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>mismatch compare: {escape(runs)}</title>",
            f"<style>{STYLE}{EXTRA_STYLE}</style></head><body><main>"]


def render_compare_html(comparison: Comparison, images: dict[str, bytes]) -> str:
    """The comparison as one HTML document with its plots embedded as data URIs."""
    verdict = comparison.verdict()
    parts = [
        *_head(f"{comparison.base_label} vs {comparison.candidate_label}"),
        "<h1>mismatch compare</h1>",
        f'<p class="meta">base (reference): {escape(comparison.base_label + side_tags(comparison)[0])}</p>',
        f'<p class="meta">candidate: {escape(comparison.candidate_label + side_tags(comparison)[1])}</p>',
        f'<p class="verdict {_verdict_class(verdict)}">{escape(verdict)}</p>',
        *(f'<p class="bug">{escape(line)}</p>' for line in bug_lines(comparison)),
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
        parts += _figures(images, CAPTIONS)
    parts.append("<footer>Written by mismatch compare. Δ = old_log_probs − rollout_log_probs on valid tokens; "
                 "a change is called worse or better only when the two 95 % intervals do not overlap.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def _runs_table(comparison: RunsComparison) -> str:
    """Runs as columns; the best run's cell green, the worst's red, a bug's value purple."""
    from mismatch_cli.render.compare_nway import run_cells, run_heading

    labels = comparison.labels
    head = "".join(f"<th>{escape(c)}</th>" for c in ["mark", "metric", *(run_heading(run) for run in comparison.runs),
                                                     "best", "worst", "better"])
    body = []
    for row in comparison.rows:
        cells = [f"<td>{escape(row.mark)}</td>", f"<td>{escape(row.metric)}</td>"]
        for label in labels:
            css = ' class="best"' if label == row.best else ' class="worst"' if label == row.worst else ""
            css = ' class="bug"' if label in row.bug_values else css
            cells.append(f"<td{css}>{escape(' '.join(p for p in run_cells(row, label) if p))}</td>")
        better = row.direction.phrase if row.direction is not None else "?"
        cells += [f"<td>{escape(row.best or '-')}</td>", f"<td>{escape(row.worst or '-')}</td>",
                  f"<td>{escape(better)}</td>"]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def render_runs_html(comparison: RunsComparison, images: dict[str, bytes]) -> str:
    """A comparison of three or more runs as one HTML document, its plot embedded as a data URI."""
    from mismatch_cli.render.compare_nway import bug_lines, legend

    verdict = comparison.verdict()
    parts = [
        *_head(", ".join(comparison.labels)),
        f"<h1>mismatch compare: {len(comparison.runs)} runs</h1>",
        *(f'<p class="meta">{escape(run.label)}: {escape(run.source)}</p>' for run in comparison.runs),
        f'<p class="{" ".join(["verdict", _verdict_class(verdict)]).strip()}">{escape(verdict)}</p>',
        *(f'<p class="bug">{escape(line)}</p>' for line in bug_lines(comparison)),
        "<h2>Metrics</h2>",
        _runs_table(comparison),
    ]
    if legend(comparison):
        parts.append(f'<p class="note">{escape(legend(comparison))}</p>')
    if comparison.notes:
        items = "".join(f"<li>{escape(note)}</li>" for note in comparison.notes)
        parts.append(f'<div class="warnings"><strong>Notes</strong><ul>{items}</ul></div>')
    if images:
        parts += _figures(images, RUNS_CAPTIONS)
    parts.append("<footer>Written by mismatch compare. Δ = old_log_probs − rollout_log_probs on valid tokens; the "
                 "runs are said to differ only when the best and the worst run's 95 % intervals do not "
                 "overlap.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["render_compare_html", "render_runs_html"]
