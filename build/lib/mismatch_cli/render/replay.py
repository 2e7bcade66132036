"""`mismatch replay`'s result as a terminal table (split into stacked blocks when the trainers do not fit),
Markdown, JSON and one self-contained HTML page. Nothing is computed here."""

from __future__ import annotations

import json
import textwrap
from html import escape

from rich.console import Console

from mismatch_cli.correction import TRAITS
from mismatch_cli.render.cells import format_value, markdown_cell
from mismatch_cli.render.html import STYLE
from mismatch_cli.render.table import Grid, Kind, print_grid
from mismatch_cli.replay import Cell, ReplayReport
from mismatch_cli.report import strict_json

MARK = "*"
ABSENT = "-"
UNDEFINED = "n/a"


def cell_text(cell: Cell) -> str:
    """A value as the table shows it: `-` when not logged, `*` before a value that disagrees beyond noise."""
    if cell.key is None:
        return ABSENT
    if cell.value is None:
        return UNDEFINED
    return (MARK if cell.disagrees else "") + format_value(cell.value)


def legend(report: ReplayReport) -> str:
    """What the marks mean and how noise was judged."""
    return (f"{MARK} differs from another trainer beyond noise ({report.sigmas:g} delete-a-group jackknife SE over "
            f"{report.groups} row groups) and beyond the minimal practical difference; {ABSENT} not logged; "
            f"{UNDEFINED} logged but not computable from this dump (see the notes); d is the log-ratio, old minus "
            "rollout log-prob")


def replay_grid(report: ReplayReport) -> Grid:
    """Concepts as rows, trainers as columns; the concept column repeats in every block."""
    names = [t.name for t in report.shown]
    rows = [[row.label, *(cell_text(row.cells[name]) for name in names)] for row in report.rows]
    kinds: list[Kind] = ["fixed", *(["fixed"] * len(names))]
    return Grid(None, ["concept", *names], rows, kinds, ["left", *(["right"] * len(names))],
                [None] * len(rows), 1)


def _lines(text: str, width: int, indent: str = "  ") -> list[str]:
    # Words never break, so neither does a number, a key or a path.
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False) or [indent]


def render_replay_table(report: ReplayReport, console: Console) -> None:
    """The heading, the table (in blocks when it does not fit), the legend, why trainers disagree, the notes."""
    width = console.width
    say = lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    inputs = ", ".join(report.inputs)
    for line in textwrap.wrap(f"mismatch replay: {inputs}, {len(report.shown)} trainers under their defaults",
                              width, break_long_words=False, break_on_hyphens=False):
        console.print(line, style="bold", highlight=False, markup=False, soft_wrap=True)
    print_grid(replay_grid(report), console)
    for line in _lines(legend(report), width, ""):
        say(line)
    disagreements = [row.why for row in report.rows if row.why]
    if disagreements:
        say("why they disagree:")
        for text in disagreements:
            for line in _lines(text, width):
                say(line)
    for note in report.notes:
        for line in _lines(f"note: {note}", width, ""):
            say(line)




def render_replay_markdown(report: ReplayReport) -> str:
    """The table, legend, reasons and notes as Markdown."""
    names = [t.name for t in report.shown]
    lines = [f"## mismatch replay: {len(names)} trainers under their defaults", ""]
    lines += [f"- input: `{path}`" for path in report.inputs] + [""]
    lines += ["| concept | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in report.rows:
        lines.append("| " + " | ".join(markdown_cell(c) for c in [row.label, *(cell_text(row.cells[n]) for n in names)])
                     + " |")
    lines += ["", markdown_cell(legend(report)), ""]
    lines += [f"- why: {markdown_cell(row.why)}" for row in report.rows if row.why]
    lines += [f"- note: {markdown_cell(note)}" for note in report.notes]
    return "\n".join([*lines, ""])


def render_replay_json(report: ReplayReport) -> str:
    """The report as strict, versioned JSON."""
    return json.dumps(strict_json(report.to_dict()), indent=2, allow_nan=False) + "\n"


EXTRA_STYLE = """
td.disagrees { background: #ffecec; font-weight: 600; }
td .se { color: #777; font-size: 11px; }
"""


def _html_cell(cell: Cell) -> str:
    if cell.key is None:
        return f'<td title="not logged">{ABSENT}</td>'
    if cell.value is None:
        return f'<td title="{escape(cell.key)}: not computable from this dump (see the notes)">{UNDEFINED}</td>'
    se = f' <span class="se">± {escape(format_value(cell.se))}</span>' if cell.se is not None else ""
    css = ' class="disagrees"' if cell.disagrees else ""
    return f'<td{css} title="{escape(cell.key)}">{escape(format_value(cell.value))}{se}</td>'


def render_replay_html(report: ReplayReport) -> str:
    """One self-contained page: the table with each value's jackknife SE, the reasons, the trainers' settings."""
    names = [t.name for t in report.shown]
    head = "".join(f"<th>{escape(n)}</th>" for n in ["concept", *names])
    body = "".join(f"<tr><td>{escape(row.label)}</td>{''.join(_html_cell(row.cells[n]) for n in names)}</tr>"
                   for row in report.rows)
    why = "".join(f"<li>{escape(row.why)}</li>" for row in report.rows if row.why)
    setting_rows = "".join(
        f"<tr><td>{escape(t.name)}</td><td class=\"prose\">{escape(t.title)}</td><td class=\"prose\">"
        f"{escape(', '.join(f'{k}={v}' for k, v in t.fields.items()) or 'defaults')}</td>"
        + "".join(f'<td class="prose">{escape(t.traits.get(trait, ""))}</td>' for trait in TRAITS)
        + "</tr>" for t in report.trainers)
    notes = "".join(f"<li>{escape(note)}</li>" for note in report.notes)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mismatch replay: {escape(', '.join(report.inputs))}</title>",
        f"<style>{STYLE}{EXTRA_STYLE}</style></head><body><main>",
        f"<h1>mismatch replay: {len(names)} trainers under their defaults</h1>",
        *(f'<p class="meta">input: {escape(path)}</p>' for path in report.inputs),
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>',
        f'<p class="note">{escape(legend(report))}; ± the jackknife standard error</p>',
        f"<h2>Why they disagree</h2><ul>{why}</ul>" if why else "",
        "<h2>Trainers</h2><div class=\"scroll\"><table><thead><tr><th>trainer</th><th class=\"prose\">title</th>"
        "<th class=\"prose\">setting</th>" + "".join(f'<th class="prose">{trait}</th>' for trait in TRAITS)
        + "</tr></thead>"
        f"<tbody>{setting_rows}</tbody></table></div>",
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
        f"<footer>{escape(report.device)}, {escape(report.dtype)}; one read of the input, every trainer on the same "
        "chunks (docs/replay.md)</footer>",
        "</main></body></html>", "",
    ]
    return "\n".join(part for part in parts if part)


__all__ = ["cell_text", "legend", "render_replay_html", "render_replay_json", "render_replay_markdown",
           "render_replay_table", "replay_grid"]
