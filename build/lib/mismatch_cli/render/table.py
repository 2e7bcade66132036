"""Rich terminal tables that never split a number or a name: only free text wraps, wide tables split into blocks.

Every cell is one of four kinds. `fixed` cells (numbers, metric keys, labels) never wrap: their column is
as wide as its widest line. `wrap` cells (an interval `[lo, hi]`, a rule) may wrap at spaces only: their
column is at least as wide as their longest word. `text` cells (meanings) are free text and take
what width is left. `path` cells (input paths, `name:row`) never wrap: a path longer than its column is shortened in the
middle (render/paths.py, `fit_path`); a path column is planned down to TEXT_MIN before any table splits,
so it gives way before a number is ever squeezed. When the fixed and minimum widths do not fit the terminal, the
table is printed as several blocks of columns, each repeating the leading label columns.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mismatch_cli.render.paths import fit_path, paths_in_text
from mismatch_cli.render.sections import Section, build_sections
from mismatch_cli.report import Report

Kind = Literal["fixed", "wrap", "text", "path"]
GAP = 2  # characters between two columns (SIMPLE_HEAD box, collapsed padding, no edge)
TEXT_MIN = 20  # a free-text column is never planned narrower than this (or its widest line)


@dataclass
class Grid:
    """A table to lay out: headers, rows of cells, each column's kind and justification, row styles."""

    title: str | None
    columns: list[str]
    rows: list[list[str]]
    kinds: list[Kind]
    justify: list[str]
    styles: list[str | None] = field(default_factory=list)
    repeat: int = 1  # leading columns repeated in every block


def _lines(cells: Sequence[str]) -> list[str]:
    return [line for cell in cells for line in cell.split("\n")]


def _widths(grid: Grid, j: int) -> tuple[int, int]:
    """The narrowest and the natural width of column j, headers' longest word included."""
    cells = _lines([row[j] for row in grid.rows])
    header_word = max((len(w) for w in grid.columns[j].split()), default=0)
    natural = max([len(line) for line in cells] + [header_word, 1])
    kind = grid.kinds[j]
    if kind == "fixed":
        return natural, natural
    if kind == "wrap":
        return max([len(w) for line in cells for w in line.split()] + [header_word, 1]), natural
    if kind == "path":  # as narrow as free text: the path's middle (its file name's last) gives way first
        return min(natural, max(TEXT_MIN, header_word)), natural
    return min(natural, max(TEXT_MIN, header_word)), natural


def plan_blocks(grid: Grid, width: int) -> list[tuple[list[int], list[int]]]:
    """Column blocks that fit `width`: each a list of column indices and the width planned for each."""
    bounds = [_widths(grid, j) for j in range(len(grid.columns))]
    head = list(range(min(grid.repeat, len(grid.columns))))
    rest = list(range(len(head), len(grid.columns)))

    def total(indices: list[int], natural: bool) -> int:
        return sum(bounds[j][1 if natural else 0] for j in indices) + GAP * (len(indices) - 1)

    def planned(indices: list[int]) -> list[int]:
        if total(indices, True) <= width:
            return [bounds[j][1] for j in indices]
        widths = {j: bounds[j][1] if grid.kinds[j] == "text" else bounds[j][0] for j in indices}
        spare = width - total(indices, False)
        # Left-over room goes to the wrap columns, those needing the least first, so fewer cells wrap; then to
        # the path columns, so fewer folders give way to `…`.
        growing = sorted((j for j in indices if grid.kinds[j] == "wrap"), key=lambda j: bounds[j][1] - bounds[j][0])
        for j in growing + [j for j in indices if grid.kinds[j] == "path"]:
            extra = max(0, min(spare, bounds[j][1] - bounds[j][0]))
            widths[j] += extra
            spare -= extra
        return [widths[j] for j in indices]

    if total(head + rest, False) <= width or not rest:
        return [(head + rest, planned(head + rest))]
    blocks, current = [], list(head)
    for j in rest:
        if len(current) > len(head) and total([*current, j], False) > width:
            blocks.append(current)
            current = list(head)
        current.append(j)
    blocks.append(current)
    return [(indices, planned(indices)) for indices in blocks]


def _header(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_long_words=False)) if text else text


def print_grid(grid: Grid, console: Console) -> None:
    """Print the grid's title and its table (in blocks if the console is too narrow)."""
    blocks = plan_blocks(grid, console.width)
    for b, (indices, widths) in enumerate(blocks):
        if grid.title:
            title = grid.title if b == 0 else f"{grid.title} (continued)"
            console.print(Text(title, style="bold"), highlight=False)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
        for j, planned in zip(indices, widths, strict=True):
            kind = grid.kinds[j]
            header = _header(grid.columns[j], planned)
            if kind == "text":
                table.add_column(header, justify=grid.justify[j], overflow="fold")  # type: ignore[arg-type]
            else:
                table.add_column(header, justify=grid.justify[j], width=planned,  # type: ignore[arg-type]
                                 no_wrap=kind in ("fixed", "path"), overflow="fold")
        for i, row in enumerate(grid.rows):
            style = grid.styles[i] if i < len(grid.styles) else None
            table.add_row(*[Text(fit_path(row[j], planned) if grid.kinds[j] == "path" else row[j])
                            for j, planned in zip(indices, widths, strict=True)], style=style)
        console.print(table)
        if b < len(blocks) - 1:
            console.print()


def section_grid(section: Section) -> Grid:
    """A report section as a grid: the first column and numbers fixed, the section's text columns free."""
    text, paths = section.text_columns(), section.path_columns()
    kinds: list[Kind] = ["path" if i in paths else "text" if i in text else "fixed"
                         for i in range(len(section.columns))]
    justify = ["left" if i == 0 or i in text | paths else "right" for i in range(len(section.columns))]
    styles = ["bold yellow" if i in section.highlight else None for i in range(len(section.rows))]
    return Grid(section.title, section.columns, section.rows, kinds, justify, styles, section.repeat)


def render_tables(report: Report, console: Console, warnings: bool = True) -> None:
    """Print every section of the report, then (unless `warnings` is off) its warnings."""
    for section in build_sections(report):
        print_grid(section_grid(section), console)
        if section.note:
            console.print(section.note, highlight=False, markup=False)
        console.print()
    paths = [item.path for item in report.inputs]
    for warning in report.warnings if warnings else ():
        shown = paths_in_text(warning, paths, console.width - len("warning: ") - 1)
        console.print(f"[yellow]warning:[/yellow] {escape(shown)}", highlight=False)


PRESET_TEXT = {"summary"}


def presets_grid(family: str, columns: list[str], rows: list[dict[str, object]]) -> Grid:
    """The presets of a family as a grid: name and fields fixed (never split), the summary free text."""
    cells = [["-" if r[c] is None else str(r[c]) for c in columns] for r in rows]
    kinds: list[Kind] = ["text" if c in PRESET_TEXT else "fixed" for c in columns]
    # Headers wrap at spaces, so a field's words may stack: `is_threshold` -> `is` over `threshold`.
    headers = [c.replace("rollout_", "").replace("_", " ") for c in columns]
    return Grid(f"{family} presets ({len(rows)}); use --preset NAME", headers, cells, kinds,
                ["left"] * len(columns))


def render_presets_table(family: str, columns: list[str], rows: list[dict[str, object]], console: Console) -> None:
    """Print the presets table (`mismatch presets`)."""
    print_grid(presets_grid(family, columns, rows), console)


__all__ = ["Grid", "plan_blocks", "print_grid", "presets_grid", "render_presets_table", "render_tables",
           "section_grid"]
