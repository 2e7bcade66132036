"""Rich terminal tables for a report (NO_COLOR and narrow terminals are handled by rich)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mismatch_cli.render.sections import Section, build_sections
from mismatch_cli.report import Report


def _table(section: Section) -> Table:
    table = Table(title=section.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  title_style="bold", pad_edge=False, collapse_padding=True)
    for i, column in enumerate(section.columns):
        prose = column in ("meaning", "healthy range", "file")
        table.add_column(column, justify="left" if prose or i == 0 else "right", overflow="fold", no_wrap=not prose)
    for i, row in enumerate(section.rows):
        table.add_row(*row, style="bold yellow" if i in section.highlight else None)
    return table


def render_tables(report: Report, console: Console) -> None:
    """Print every section of the report, then its warnings."""
    for section in build_sections(report):
        console.print(_table(section))
        console.print()
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
