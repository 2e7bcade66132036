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


def _column_blocks(section: Section, width: int) -> list[Section]:
    if not section.split_columns:
        return [section]
    label_width = max(len(r[0]) for r in section.rows) + 2
    per_block = max(1, (width - label_width) // 11)
    values = len(section.columns) - 1
    if values <= per_block:
        return [section]
    blocks = []
    for start in range(1, values + 1, per_block):
        stop = min(start + per_block, values + 1)
        blocks.append(Section(
            section.title if start == 1 else f"{section.title} (continued)",
            [section.columns[0], *section.columns[start:stop]],
            [[row[0], *row[start:stop]] for row in section.rows],
            section.highlight,
        ))
    blocks[-1].note = section.note
    return blocks


def render_tables(report: Report, console: Console, warnings: bool = True) -> None:
    """Print every section of the report, then (unless `warnings` is off) its warnings."""
    for section in build_sections(report):
        for block in _column_blocks(section, console.width):
            console.print(_table(block))
            if block.note:
                console.print(block.note, highlight=False)
            console.print()
    for warning in report.warnings if warnings else ():
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
