"""Render a comparison of three or more runs: terminal table (runs as columns, or stacked when they do not
fit), Markdown, JSON and one plot of every run's value and interval per metric."""

from __future__ import annotations

import json

from rich.console import Console

from mismatch_cli.gate.bugs import BUG, BUG_WHY
from mismatch_cli.gate.nway import NWAY_MARKS, Run, RunsComparison, SpreadRow
from mismatch_cli.render.cells import format_value, markdown_cell
from mismatch_cli.render.table import Grid, Kind, plan_blocks, print_grid
from mismatch_cli.report import strict_json

PREFIX = "rollout_corr/"
_STYLES = {"*": "bold", "x": "yellow", BUG: "magenta"}
PLOT_NAME = "compare_metrics.png"


def _name(metric: str) -> str:
    return metric[len(PREFIX):] if metric.startswith(PREFIX) else metric


def _interval(interval: list[float] | None) -> str:
    return f"[{format_value(interval[0])}, {format_value(interval[1])}]" if interval else ""


def _better(row: SpreadRow) -> str:
    return row.direction.value if row.direction is not None else "?"


def run_cells(row: SpreadRow, label: str) -> tuple[str, str]:
    """A run's value (after `B ` when it is a bug's) and its interval ("-" and "" when the run lacks the metric)."""
    value = row.values.get(label)
    if value is None:
        return "-", ""
    shown = f"{BUG} {format_value(value)}" if label in row.bug_values else format_value(value)
    return shown, _interval(row.intervals.get(label))


def run_heading(run: Run) -> str:
    """A run's label as a column heading: `LABEL (BUG)` for a run whose report says BUG."""
    return f"{run.label} (BUG)" if run.bug else run.label


def bug_lines(comparison: RunsComparison) -> list[str]:
    """One line per run with a bug in its dump or config, naming the bug (empty for clean runs)."""
    return [f"BUG: {clause}" for clause in comparison.bugs()]


def column_cells(row: SpreadRow, labels: list[str]) -> list[str]:
    """Runs as columns: mark, metric, each run's value over its interval, best, worst, direction."""
    runs = ["\n".join(part for part in run_cells(row, label) if part) for label in labels]
    return [row.mark, _name(row.metric), *runs, row.best or "-", row.worst or "-", _better(row)]


def stacked_cells(row: SpreadRow, labels: list[str]) -> list[list[str]]:
    """Runs stacked: one line per run (run, value, interval, best / worst); the direction under the metric."""
    names = [_name(row.metric), f"better: {_better(row)}"]
    lines = []
    for i, label in enumerate(labels):
        value, interval = run_cells(row, label)
        rank = "best" if label == row.best else "worst" if label == row.worst else ""
        rank = rank or ("bug" if label in row.bug_values else "")
        lines.append([row.mark if i == 0 else "", names[i] if i < len(names) else "", label, value, interval, rank])
    return lines


def _grid(columns: list[str], rows: list[list[str]], kinds: list[Kind], styles: list[str | None]) -> Grid:
    justify = ["left" if i <= 1 or kind == "text" else "right" for i, kind in enumerate(kinds)]
    return Grid(None, columns, rows, kinds, justify, styles, 2)


def columns_grid(comparison: RunsComparison) -> Grid:
    """The runs-as-columns table."""
    labels = comparison.labels
    rows = [column_cells(row, labels) for row in comparison.rows]
    kinds: list[Kind] = ["fixed", "fixed", *["wrap"] * len(labels), "fixed", "fixed", "wrap"]
    headings = [run_heading(run) for run in comparison.runs]
    return _grid(["", "metric", *headings, "best", "worst", "better"], rows, kinds,
                 [_STYLES.get(row.mark) for row in comparison.rows])


def stacked_grid(comparison: RunsComparison) -> Grid:
    """The stacked table: one line per metric and run (no interval column when no run has one)."""
    rows, styles = [], []
    for row in comparison.rows:
        block = stacked_cells(row, comparison.labels)
        rows += block
        styles += [_STYLES.get(row.mark)] * len(block)
    columns, kinds = ["", "metric", "run", "value", "95% CI", ""], ["fixed", "fixed", "fixed", "fixed", "wrap", "fixed"]
    if not any(cells[4] for cells in rows):
        rows = [[*cells[:4], cells[5]] for cells in rows]
        columns, kinds = columns[:4] + columns[5:], kinds[:4] + kinds[5:]
    return _grid(columns, rows, kinds, styles)  # type: ignore[arg-type]


def nway_grid(comparison: RunsComparison, width: int) -> Grid:
    """Runs as columns when that table fits `width` in one block, else the stacked table."""
    grid = columns_grid(comparison)
    return grid if len(plan_blocks(grid, width)) == 1 else stacked_grid(comparison)


def legend(comparison: RunsComparison) -> str:
    """The marks that appear, in words."""
    used = [f"{m} {NWAY_MARKS[m]}" for m in NWAY_MARKS if any(r.mark == m for r in comparison.rows)]
    if any(r.bug_values for r in comparison.rows):
        used.append(f"{BUG} before a value: a bug's value ({BUG_WHY}), never best")
    return "marks: " + "; ".join(used) if used else ""


def render_runs_table(comparison: RunsComparison, console: Console) -> None:
    """Print the runs, the table (whichever layout fits the console), the legend and the notes (not the verdict)."""
    console.print(f"mismatch compare: {len(comparison.runs)} runs side by side (no reference)", style="bold",
                  highlight=False, markup=False)
    width = max(len(run.label) for run in comparison.runs)
    for run in comparison.runs:
        if run.source != run.label:
            console.print(f"  {run.label.ljust(width)}  {run.source}", highlight=False, markup=False)
    print_grid(nway_grid(comparison, console.width), console)
    console.print(f"{PREFIX} keys are shown without their prefix; best and worst by the metric's direction. "
                  + legend(comparison), highlight=False, markup=False)
    for line in bug_lines(comparison):
        console.print(line, style="bold magenta", highlight=False, markup=False)
    for note in comparison.notes:
        console.print(f"note: {note}", highlight=False, markup=False)




def render_runs_markdown(comparison: RunsComparison) -> str:
    """The comparison as Markdown (for PR comments and step summaries)."""
    labels = comparison.labels
    lines = [f"## mismatch compare: {len(labels)} runs side by side", ""]
    lines += [f"- `{run.label}`: `{run.source}`" for run in comparison.runs] + [""]
    lines += [f"**{markdown_cell(line)}**" for line in bug_lines(comparison)] + ([""] if comparison.bugs() else [])
    columns = ["mark", "metric", *(run_heading(run) for run in comparison.runs), "best", "worst", "better"]
    lines += ["| " + " | ".join(markdown_cell(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in comparison.rows:
        runs = [" ".join(part for part in run_cells(row, label) if part) for label in labels]
        cells = [row.mark, row.metric, *runs, row.best or "-", row.worst or "-", _better(row)]
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    lines.append("")
    if legend(comparison):
        lines += [markdown_cell(legend(comparison)), ""]
    lines += [f"- note: {markdown_cell(n)}" for n in comparison.notes]
    lines += ["", f"**{markdown_cell(comparison.verdict())}**", ""]
    return "\n".join(lines)


def render_runs_json(comparison: RunsComparison) -> str:
    """The comparison as strict JSON."""
    return json.dumps(strict_json(comparison.to_dict()), indent=2, allow_nan=False) + "\n"


def render_runs_plot(comparison: RunsComparison) -> dict[str, bytes]:
    """One figure: per metric, every run's value and 95 % interval on a shared axis (best green, worst red)."""
    from matplotlib.ticker import MaxNLocator

    from mismatch_cli.render.plotting import COLORS, png_bytes, pyplot

    rows = [r for r in comparison.rows if any(v is not None for v in r.values.values())]
    if not rows:
        return {}
    plt = pyplot()
    labels = comparison.labels
    cols = 3
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(11, (0.35 * len(labels) + 1.0) * nrows), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        for y, label in enumerate(labels):
            value, interval = row.values[label], row.intervals.get(label)
            color = "#228833" if label == row.best else COLORS["band"] if label == row.worst else COLORS["data"]
            if interval:
                ax.plot(interval, [y, y], color=color, linewidth=3, alpha=0.45)
            if value is not None:
                ax.plot([value], [y], "o", color=color, markersize=5)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(f"{row.mark} {_name(row.metric)} ({_better(row)})", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(4))
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    fig.suptitle("Every run per metric with its 95 % bootstrap interval (best green, worst red)", fontsize=10)
    return {PLOT_NAME: png_bytes(fig)}


__all__ = [
    "PLOT_NAME",
    "bug_lines",
    "column_cells",
    "columns_grid",
    "legend",
    "nway_grid",
    "render_runs_json",
    "render_runs_markdown",
    "render_runs_plot",
    "render_runs_table",
    "run_cells",
    "run_heading",
    "stacked_cells",
    "stacked_grid",
]
