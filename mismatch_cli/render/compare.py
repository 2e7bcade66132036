"""Render a Comparison (terminal table, Markdown, JSON, overlaid plots) and a CheckResult (tables)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

from rich.console import Console

from mismatch_cli.gate.bugs import BUG, BUG_PASS
from mismatch_cli.gate.comparison import MARKS, Comparison, MetricRow
from mismatch_cli.gate.thresholds import CheckResult, Outcome
from mismatch_cli.render.cells import format_percent, format_signed, format_value, markdown_cell
from mismatch_cli.render.paths import display_path, paths_in_text
from mismatch_cli.render.plotting import pyplot
from mismatch_cli.render.sections import SHOWN_ROUNDS, shown_rounds
from mismatch_cli.render.table import Grid, Kind, print_grid
from mismatch_cli.report import Report, strict_json

COLUMNS = ["", "metric", "base", "base 95% CI", "candidate", "candidate 95% CI", "change", "rel.", "better"]
ROUND_COLUMNS = ["", "round", "base tokens", "cand. tokens", "base mean |d|", "cand. mean |d|", "change", "rel.",
                 "base k1 KL", "cand. k1 KL"]
_STYLES = {"+": "red", "!": "bold red", "-": "green", "x": "yellow", BUG: "bold magenta"}


def _interval(interval: list[float] | None) -> str:
    if not interval:
        return "-"
    return f"[{format_value(interval[0])}, {format_value(interval[1])}]"


def _signed(value: float | None) -> str:
    return format_signed(value)


def _percent(value: float | None) -> str:
    return format_percent(value, signed=True)


def metric_cells(row: MetricRow) -> list[str]:
    """One table row of cells."""
    return [
        row.mark,
        row.metric,
        format_value(row.base) if row.base is not None else "-",
        _interval(row.base_interval),
        format_value(row.candidate) if row.candidate is not None else "-",
        _interval(row.candidate_interval),
        _signed(row.change),
        _percent(row.relative),
        row.direction.phrase if row.direction is not None else "?",
    ]


def round_cells(comparison: Comparison) -> list[list[str]]:
    """One row of cells per round index (the first SHOWN_ROUNDS; a last row counts the rest)."""
    rows = []
    for r in shown_rounds(comparison.rounds):
        b, c = r.base or {}, r.candidate or {}
        bv, cv = b.get("abs_diff_mean"), c.get("abs_diff_mean")
        change = None if bv is None or cv is None else cv - bv
        rel = None if change is None or not bv else change / abs(bv)
        rows.append([
            r.mark, f"r{r.round}",
            format_value(b.get("tokens")) if r.base else "-", format_value(c.get("tokens")) if r.candidate else "-",
            format_value(bv) if r.base else "-", format_value(cv) if r.candidate else "-",
            _signed(change), _percent(rel),
            format_value(b.get("kl")) if r.base else "-", format_value(c.get("kl")) if r.candidate else "-",
        ])
    more = len(comparison.rounds) - SHOWN_ROUNDS
    if more > 0:
        rows.append(["", f"+{more} more (JSON)", *[""] * (len(ROUND_COLUMNS) - 2)])
    return rows


def legend(comparison: Comparison) -> str:
    """The marks that appear, in words."""
    used = [m for m in MARKS if any(r.mark == m for r in comparison.rows)]
    return "marks: " + "; ".join(f"{m} {MARKS[m]}" for m in used) if used else ""


def side_tags(comparison: Comparison) -> tuple[str, str]:
    """What follows each side's label in a title: ` (BUG)` for a side whose report says BUG, else nothing."""
    return (" (BUG)" if comparison.base_bug else "", " (BUG)" if comparison.candidate_bug else "")


def bug_lines(comparison: Comparison) -> list[str]:
    """One line per side with a bug in its dump or config, naming the bug (empty for clean runs)."""
    return [f"BUG: {clause}" for clause in comparison.bugs()]


def _grid(title: str | None, columns: list[str], rows: list[list[str]], kinds: list[Kind],
          repeat: int = 2) -> Grid:
    """A table whose first column is the mark: numbers right-aligned, labels and prose left-aligned."""
    justify = ["left" if i <= 1 or kind == "text" else "right" for i, kind in enumerate(kinds)]
    return Grid(title, columns, rows, kinds, justify, [_STYLES.get(cells[0]) for cells in rows], repeat)


TERMINAL_COLUMNS = ["", "metric", "base [95% CI]", "candidate [95% CI]", "change", "better"]


def terminal_cells(row: MetricRow) -> list[str]:
    """A compact row for the terminal: each value with its interval below it, change with its percentage."""
    def side(value: float | None, interval: list[float] | None) -> str:
        if value is None:
            return "-"
        return format_value(value) + ("\n" + _interval(interval) if interval else "")

    relative = _percent(row.relative)
    change = _signed(row.change) + ("" if relative == "-" else "\n" + relative)
    name = row.metric[len("rollout_corr/"):] if row.metric.startswith("rollout_corr/") else row.metric
    return [row.mark, name, side(row.base, row.base_interval), side(row.candidate, row.candidate_interval), change,
            row.direction.value if row.direction is not None else "?"]


def render_compare_table(comparison: Comparison, console: Console) -> None:
    """Print the side-by-side table, the per-round table, notes and the legend (not the verdict)."""
    # The title's first line holds `mismatch compare: base PATH vs`, its second `candidate PATH`.
    room = console.width - len("candidate ")
    labels = comparison.base_label, comparison.candidate_label
    tags = side_tags(comparison)
    base = display_path(labels[0], console.width - len("mismatch compare: base  vs") - len(tags[0]))
    candidate = display_path(labels[1], room - len(tags[1]))
    title = f"mismatch compare: base {base}{tags[0]} vs candidate {candidate}{tags[1]}"
    kinds: list[Kind] = ["fixed", "fixed", "wrap", "wrap", "fixed", "wrap"]
    print_grid(_grid(title, TERMINAL_COLUMNS, [terminal_cells(r) for r in comparison.rows], kinds), console)
    console.print("rollout_corr/ keys are shown without their prefix. " + legend(comparison), highlight=False,
                  markup=False)
    for line in bug_lines(comparison):
        console.print(line, style="bold magenta", highlight=False, markup=False)
    if comparison.rounds:
        console.print()
        # change and rel. share a cell (two lines), as in the metric table, so the table fits 80 columns.
        rows = [[*r[:6], r[6] if not r[7] or r[7] == "-" else f"{r[6]}\n{r[7]}", *r[8:]]
                for r in round_cells(comparison)]
        columns = [*ROUND_COLUMNS[:7], *ROUND_COLUMNS[8:]]
        print_grid(_grid("Per round (round k = k-th run of 1s in the mask)", columns, rows, ["fixed"] * len(columns)),
                   console)
    if comparison.check is not None:
        console.print()
        print_grid(_grid("Limits", ["", "rule", "value", "baseline", "status"], check_cells(comparison),
                         ["fixed", "wrap", "fixed", "fixed", "fixed"]), console)
        print_reasons(comparison.check, console)
    for note in comparison.notes:
        console.print(f"note: {paths_in_text(note, labels, room)}", highlight=False, markup=False)


def check_cells(comparison: Comparison) -> list[list[str]]:
    """One row per rule of the comparison's limits."""
    assert comparison.check is not None
    return [row[:4] + [row[5]] for row in outcome_cells(comparison.check)]


CHECK_COLUMNS = ["", "rule", "value", "baseline", "limit", "status", "detail"]
_STATUS_MARK = {"fail": "!", "held": "~", "error": "x", "warn": "x", "skip": "", "pass": ""}


def outcome_cells(result: CheckResult) -> list[list[str]]:
    """One row per rule: mark, rule, value, baseline, limit, status, detail."""
    def number(value: float | None) -> str:
        return "-" if value is None else format_value(value)

    def mark(outcome: Outcome) -> str:  # a rule failed for passing only on a bug's value is marked as the bug
        return BUG if outcome.status == "fail" and BUG_PASS in outcome.message else _STATUS_MARK[outcome.status]

    return [[mark(o), o.rule.text, number(o.value), number(o.baseline), number(o.bound),
             o.status, "; ".join([o.message, *(f"warning: {w}" for w in o.warnings)])] for o in result.outcomes]


def check_title(inputs: list[str], baseline: str | None = None, width: int | None = None) -> str:
    """`mismatch check: INPUTS (baseline REPORT)`, each path as `display_path` shows it in `width` columns."""
    room = None if width is None else width - len("mismatch check: ")
    title = "mismatch check: " + " ".join(display_path(path, room) for path in inputs)
    return title + (f" (baseline {display_path(baseline, room)})" if baseline else "")


def render_check_table(result: CheckResult, console: Console, title: str) -> None:
    """Print one row per rule, then why any rule was not evaluated (the verdict is the caller's, on stderr)."""
    rows = [cells[:-1] for cells in outcome_cells(result)]
    print_grid(_grid(title, CHECK_COLUMNS[:-1], rows, ["fixed", "wrap", "fixed", "fixed", "fixed", "fixed"]), console)
    print_reasons(result, console)


def print_reasons(result: CheckResult, console: Console) -> None:
    """Why each rule was not evaluated (error, warn, skip: one unwrapped line each, as CI logs grep them), then
    why each rule failed or was held back as noise, and each rule's warnings (wrapped to the width)."""
    for outcome in result.outcomes:
        if outcome.status in ("error", "warn", "skip"):
            console.print(f"{outcome.status}: {outcome.rule.text}: {outcome.message}", highlight=False, markup=False,
                          soft_wrap=True)
    for outcome in result.outcomes:
        reasons = [(outcome.status, outcome.message)] if outcome.status in ("fail", "held") else []
        for label, text in reasons + [("warning", warning) for warning in outcome.warnings]:
            console.print(f"{label}: {outcome.rule.text}: {text}", highlight=False, markup=False)


def render_check_markdown(result: CheckResult, title: str) -> str:
    """The rule table and verdict as Markdown."""
    lines = [f"## {title}", ""] + markdown_table(CHECK_COLUMNS, outcome_cells(result))
    return "\n".join(lines + ["", f"**{markdown_cell(result.verdict())}**", ""])




def markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    """GitHub-flavoured Markdown table lines."""
    lines = ["| " + " | ".join(c or "mark" for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_compare_markdown(comparison: Comparison) -> str:
    """The comparison as Markdown (for PR comments and step summaries)."""
    tags = side_tags(comparison)
    lines = [f"## mismatch compare: `{display_path(comparison.base_label)}` (base){tags[0]} vs "
             f"`{display_path(comparison.candidate_label)}` (candidate){tags[1]}", ""]
    lines += [f"**{markdown_cell(line)}**" for line in bug_lines(comparison)] + ([""] if comparison.bugs() else [])
    lines += markdown_table(COLUMNS, [metric_cells(r) for r in comparison.rows]) + [""]
    if legend(comparison):
        lines += [markdown_cell(legend(comparison)), ""]
    if comparison.rounds:
        lines += ["### Per round", ""] + markdown_table(ROUND_COLUMNS, round_cells(comparison)) + [""]
    if comparison.check is not None:
        lines += ["### Limits", ""] + markdown_table(["", "rule", "value", "baseline", "status"],
                                                      check_cells(comparison)) + [""]
    lines += [f"- note: {markdown_cell(n)}" for n in comparison.notes]
    lines += ["", f"**{markdown_cell(comparison.verdict())}**", ""]
    return "\n".join(lines)


def render_compare_json(comparison: Comparison) -> str:
    """The comparison as strict JSON."""
    return json.dumps(strict_json(comparison.to_dict()), indent=2, allow_nan=False) + "\n"


# -------------------------------------------------------------------------------------------------- plots


def _histogram(report: Report) -> tuple[list[float], list[float]] | None:
    """The report's histogram of delta = old - rollout as (signed edges, fractions), when analyze stored one.

    Accepts {edges, counts} over delta, or analyze's magnitude form {edges, negative, positive, zero}
    (bins of |delta| on each side of 0).
    """
    entry = (report.histograms or {}).get("log_ratio")
    if not isinstance(entry, dict) or not entry.get("edges"):
        return None
    edges = [float(e) for e in entry["edges"]]
    if "counts" in entry:
        counts = [float(c) for c in entry["counts"]]
    elif "negative" in entry and "positive" in entry:
        edges = [-e for e in reversed(edges)] + edges
        counts = ([float(c) for c in reversed(entry["negative"])] + [float(entry.get("zero", 0))]
                  + [float(c) for c in entry["positive"]])
    else:
        return None
    total = sum(counts)
    if len(edges) != len(counts) + 1 or total <= 0:
        return None
    return edges, [c / total for c in counts]


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    pyplot().close(fig)
    return buffer.getvalue()


def render_compare_plots(comparison: Comparison, base: Report, candidate: Report) -> dict[str, bytes]:
    """Overlaid plots of both sides as PNG bytes per file name (the CLI writes them)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()

    written: dict[str, bytes] = {}
    labels = (f"base: {comparison.base_label}", f"candidate: {comparison.candidate_label}")
    colors = ("#4477aa", "#ee6677")

    rows = [r for r in comparison.rows if r.base is not None and r.candidate is not None]
    if rows:
        cols = 3
        nrows = -(-len(rows) // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(11, 1.9 * nrows), squeeze=False)
        for ax, row in zip(axes.flat, rows, strict=False):
            for y, (value, interval, color) in enumerate(((row.base, row.base_interval, colors[0]),
                                                           (row.candidate, row.candidate_interval, colors[1]))):
                if interval:
                    ax.plot(interval, [y, y], color=color, linewidth=3, alpha=0.5)
                ax.plot([value], [y], "o", color=color)
            ax.set_yticks([0, 1], ["base", "cand."])
            ax.set_ylim(-0.6, 1.6)
            ax.set_title(f"{row.mark} {row.metric}", fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(4))
        for ax in list(axes.flat)[len(rows):]:
            ax.axis("off")
        fig.suptitle("Headline metrics with 95 % bootstrap intervals", fontsize=10)
        fig.tight_layout()
        written["compare_metrics.png"] = _png(fig)

    hists = _histogram(base), _histogram(candidate)
    if hists[0] and hists[1]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for (edges, fractions), label, color in zip(hists, labels, colors, strict=True):
            ax.stairs(fractions, edges, label=label, color=color, linewidth=1.5)
        magnitudes = [abs(e) for h in hists for e in h[0] if e != 0]
        if magnitudes:  # else every edge is 0: a plain linear axis around 0
            low, high = math.floor(math.log10(min(magnitudes))), math.ceil(math.log10(max(magnitudes)))
            ax.set_xscale("symlog", linthresh=10.0**low)
            step = max(1, (high - low) // 4)  # about five labelled decades per side
            decades = [10.0**k for k in range(high, low - 1, -step)]
            ax.set_xticks([-d for d in decades] + [0.0] + decades[::-1],
                          [f"-1e{round(math.log10(d))}" for d in decades] + ["0"]
                          + [f"1e{round(math.log10(d))}" for d in decades[::-1]], fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("delta = old_log_probs - rollout_log_probs")
        ax.set_ylabel("fraction of valid tokens")
        ax.legend(fontsize=8)
        ax.set_title("Distribution of the log-ratio, both runs")
        fig.tight_layout()
        written["compare_log_ratio_hist.png"] = _png(fig)

    if comparison.rounds:
        rounds = shown_rounds(comparison.rounds)
        fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(rounds) + 2), 3.5))
        width = 0.4
        for offset, side, label, color in ((-width / 2, "base", labels[0], colors[0]),
                                           (width / 2, "candidate", labels[1], colors[1])):
            xs, ys = [], []
            for r in rounds:
                entry = getattr(r, side)
                if entry is not None and entry.get("abs_diff_mean") is not None:
                    xs.append(r.round + offset)
                    ys.append(entry["abs_diff_mean"])
            ax.bar(xs, ys, width=width, label=label, color=color)
        ax.set_xticks([r.round for r in rounds], [f"r{r.round}" for r in rounds])
        ax.set_ylabel("mean |delta|")
        ax.set_title("Per-round divergence, both runs")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written["compare_rounds.png"] = _png(fig)
    return written


__all__ = [
    "terminal_cells",
    "bug_lines",
    "side_tags",
    "check_cells",
    "check_title",
    "outcome_cells",
    "render_check_markdown",
    "render_check_table",
    "legend",
    "markdown_table",
    "metric_cells",
    "render_compare_json",
    "render_compare_markdown",
    "render_compare_table",
    "render_compare_plots",
]
