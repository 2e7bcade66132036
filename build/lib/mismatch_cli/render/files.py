"""The files `analyze --out-dir` and `compare --out-dir` write, rendered in memory first (none half-written)."""

from __future__ import annotations

import re

from mismatch_cli.gate.comparison import Comparison
from mismatch_cli.gate.nway import RunsComparison
from mismatch_cli.report import Report


def report_files(report: Report, plots: bool = True) -> dict[str, str | bytes]:
    """`report.json`, the per-step / per-group / per-round CSV tables, and (with `plots`) the PNGs and `report.html`."""
    from mismatch_cli.render.csv import render_csv_tables

    files: dict[str, str | bytes] = {"report.json": report.to_json(), **render_csv_tables(report)}
    if plots:
        from mismatch_cli.render.html import render_html
        from mismatch_cli.render.plots import render_plots

        figures = render_plots(report)
        files.update(figures)
        files["report.html"] = render_html(report, figures)
    return files


def compare_files(comparison: Comparison, base: Report, candidate: Report, reports: dict[str, bool],
                  plots: bool = True) -> dict[str, str | bytes]:
    """`compare.json`, `compare.md`, each side's report when analyzed from dumps, the plots and `compare.html`."""
    from mismatch_cli.render.compare import render_compare_json, render_compare_markdown, render_compare_plots

    files: dict[str, str | bytes] = {"compare.json": render_compare_json(comparison),
                                     "compare.md": render_compare_markdown(comparison)}
    for name, report in (("base", base), ("candidate", candidate)):
        if reports.get(name):
            files[f"{name}_report.json"] = report.to_json()
    if plots:
        from mismatch_cli.render.compare_html import render_compare_html

        images = render_compare_plots(comparison, base, candidate)
        files.update(images)
        files["compare.html"] = render_compare_html(comparison, images)
    return files


def runs_files(comparison: RunsComparison, reports: dict[str, Report], plots: bool = True) -> dict[str, str | bytes]:
    """`compare.json`, `compare.md`, `LABEL_report.json` of each run analyzed from dumps (`reports`, by label),
    the plot of every run per metric and `compare.html`."""
    from mismatch_cli.render.compare_nway import render_runs_json, render_runs_markdown, render_runs_plot

    files: dict[str, str | bytes] = {"compare.json": render_runs_json(comparison),
                                     "compare.md": render_runs_markdown(comparison)}
    for i, (label, report) in enumerate(reports.items()):
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or f"run{i + 1}"
        name = name if f"{name}_report.json" not in files else f"{name}_{i + 1}"
        files[f"{name}_report.json"] = report.to_json()
    if plots:
        from mismatch_cli.render.compare_html import render_runs_html

        images = render_runs_plot(comparison)
        files.update(images)
        files["compare.html"] = render_runs_html(comparison, images)
    return files
