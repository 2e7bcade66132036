"""`mismatch replay`'s result as a terminal table (split into stacked blocks when the trainers do not fit),
Markdown, JSON and one self-contained HTML page (its table in blocks of `HTML_COLUMNS` trainers, so it fits a
1280-pixel page), each led by the dump's own verdict in `analyze`'s words (render/lead.py). Nothing is computed
here."""

from __future__ import annotations

import json
import textwrap
from html import escape

from rich.console import Console

from mismatch_cli.correction import TRAITS
from mismatch_cli.render.cells import format_value, markdown_cell
from mismatch_cli.render.html import STYLE
from mismatch_cli.render.lead import BAD, Line, verdict
from mismatch_cli.render.table import Grid, Kind, print_grid
from mismatch_cli.replay import Cell, ReplayReport
from mismatch_cli.report import strict_json

MARK = "*"
ABSENT = "-"
UNDEFINED = "n/a"
# Trainer columns per HTML table; more stack in blocks, as the terminal's do. Measured in headless Chromium on a
# 1280-pixel window (main's content ends at 1228 px), with the widest cells the formatter makes ("*-1.235e+07
# ± -1.234e-05") and 20-letter names: 5 columns end at 936 px, 6 at 1086, 7 at 1235 (over); 5 leave room for a
# wider font.
HTML_COLUMNS = 5


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
            f"{UNDEFINED} logged but not computable from this dump (non-finite, or an input it lacks: see below); "
            "d is the log-ratio, old minus rollout log-prob")


def heading(report: ReplayReport) -> str:
    """`mismatch replay: INPUTS, N trainers ...`: under their defaults, or which run the settings given."""
    changed = [t.name for t in report.changed]
    under = (f"({', '.join(changed)} with the settings below, the rest under their defaults)" if changed
             else "under their defaults")
    return f"mismatch replay: {', '.join(report.inputs)}, {len(report.shown)} trainers {under}"


def dump_lines(report: ReplayReport) -> list[Line]:
    """The dump's own verdict in `analyze`'s words: its headline, then what it means for the table (a bug) or the
    checks out of band; `mismatch analyze` on the dump gives the evidence and the fix."""
    if report.dump is None:
        return []
    told = verdict(report.dump)
    lines = [Line(f"dump: {told.headline}", told.tone, "dump")]
    diagnosis = report.dump.summary.get("diagnosis") or {}
    if diagnosis.get("kind") == "bug":
        lines.append(Line("every trainer below measures this bug, not the engines' mismatch; mismatch analyze on "
                          "the dump gives the evidence and the fix"))
    elif told.tone == BAD:
        lines += [check for check in told.checks if check.tone == BAD]
        if diagnosis.get("kind") == "precision":
            lines.append(Line("mismatch analyze on the dump gives the fix at the source"))
    return lines


def settings_lines(report: ReplayReport) -> list[str]:
    """The effective settings of each trainer not at its column's defaults."""
    return [f"{t.name}: {t.settings}" for t in report.changed]


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
    """The heading, the dump's verdict, the settings given, the table (in blocks when it does not fit), the legend,
    why trainers differ, the notes."""
    width = console.width
    say = lambda line, style=None: console.print(line, style=style, highlight=False, markup=False,  # noqa: E731
                                                 soft_wrap=True)
    for line in _lines(heading(report), width, ""):
        say(line, "bold")
    for i, answer in enumerate(dump_lines(report)):
        for line in _lines(answer.text, width, "" if i == 0 else "  "):
            say(line, "bold red" if answer.tone == BAD and i == 0 else None)
    changed = settings_lines(report)
    if changed:
        say("settings:")
        for text in changed:
            for line in _lines(text, width):
                say(line)
    print_grid(replay_grid(report), console)
    for line in _lines(legend(report), width, ""):
        say(line)
    reasons = [row.why for row in report.rows if row.why]
    if reasons:
        say("why they differ:")
        for text in reasons:
            for line in _lines(text, width):
                say(line)
    for note in report.notes:
        for line in _lines(f"note: {note}", width, ""):
            say(line)


def render_replay_markdown(report: ReplayReport) -> str:
    """The verdict, settings, table, legend, reasons and notes as Markdown."""
    names = [t.name for t in report.shown]
    lines = [f"## {heading(report)}", ""]
    lines += [f"- input: `{path}`" for path in report.inputs] + [""]
    answers = dump_lines(report)
    if answers:
        lines += [f"**{markdown_cell(answers[0].text)}**", ""] + [f"- {markdown_cell(a.text)}" for a in answers[1:]]
        lines += [""] if answers[1:] else []
    changed = settings_lines(report)
    if changed:
        lines += ["Settings given:", ""] + [f"- {markdown_cell(text)}" for text in changed] + [""]
    lines += ["| concept | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in report.rows:
        lines.append("| " + " | ".join(markdown_cell(c) for c in [row.label, *(cell_text(row.cells[n]) for n in names)])
                     + " |")
    lines += ["", markdown_cell(legend(report)), ""]
    lines += [f"- why: {markdown_cell(row.why)}" for row in report.rows if row.why]
    lines += [f"- note: {markdown_cell(note)}" for note in report.notes]
    return "\n".join([*lines, ""])


def render_replay_json(report: ReplayReport) -> str:
    """The report as strict, versioned JSON; the dump's verdict carries its headline as the terminal says it."""
    data = report.to_dict()
    answers = dump_lines(report)
    if data.get("dump") is not None and answers:
        data["dump"] = {"headline": answers[0].text.removeprefix("dump: "), **data["dump"]}
    return json.dumps(strict_json(data), indent=2, allow_nan=False) + "\n"


EXTRA_STYLE = """
td.disagrees { background: #ffecec; font-weight: 600; }
td .se { color: #777; font-size: 11px; }
p.dump { font-size: 16px; font-weight: 600; margin: 6px 0 4px; }
p.dump.bad { color: #a40e26; }
ul.dump { font-size: 13px; margin: 2px 0 10px; }
table.trainers td { vertical-align: top; }
table.trainers td.prose { overflow-wrap: anywhere; }
"""


def _html_cell(cell: Cell) -> str:
    if cell.key is None:
        return f'<td title="not logged">{ABSENT}</td>'
    if cell.value is None:
        what = "non-finite" if cell.nonfinite else "not computable from this dump (see the notes)"
        return f'<td title="{escape(cell.key)}: {what}">{UNDEFINED}</td>'
    se = f' <span class="se">± {escape(format_value(cell.se))}</span>' if cell.se is not None else ""
    css = ' class="disagrees"' if cell.disagrees else ""
    return f'<td{css} title="{escape(cell.key)}">{escape(format_value(cell.value))}{se}</td>'


def html_blocks(names: list[str], size: int = HTML_COLUMNS) -> list[list[str]]:
    """The trainer columns in blocks of at most `size`, each block one table that repeats the concept column."""
    return [names[i:i + size] for i in range(0, len(names), size)] or [[]]


def _html_table(report: ReplayReport, names: list[str]) -> str:
    head = "".join(f"<th>{escape(n)}</th>" for n in ["concept", *names])
    body = "".join(f"<tr><td>{escape(row.label)}</td>{''.join(_html_cell(row.cells[n]) for n in names)}</tr>"
                   for row in report.rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def render_replay_html(report: ReplayReport) -> str:
    """One self-contained page: the dump's verdict, the table with each value's jackknife SE (in blocks that fit a
    1280-pixel page), the reasons, the trainers' settings."""
    names = [t.name for t in report.shown]
    answers = dump_lines(report)
    verdict_html = ""
    if answers:
        tone = " bad" if answers[0].tone == BAD else ""
        rest = "".join(f"<li>{escape(a.text)}</li>" for a in answers[1:])
        verdict_html = f'<p class="dump{tone}">{escape(answers[0].text)}</p>' + (
            f'<ul class="dump">{rest}</ul>' if rest else "")
    changed = "".join(f"<li>{escape(text)}</li>" for text in settings_lines(report))
    why = "".join(f"<li>{escape(row.why)}</li>" for row in report.rows if row.why)
    setting_rows = "".join(
        f"<tr><td>{escape(t.name)}</td><td class=\"prose\">{escape(t.title)}<br><i>{escape(t.settings)}</i></td>"
        f"<td>{escape(t.form or '')}</td><td class=\"prose\">"
        + "<br>".join(f"<b>{trait}</b>: {escape(t.traits[trait])}" for trait in TRAITS if trait in t.traits)
        + "</td></tr>" for t in report.trainers)
    notes = "".join(f"<li>{escape(note)}</li>" for note in report.notes)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mismatch replay: {escape(', '.join(report.inputs))}</title>",
        f"<style>{STYLE}{EXTRA_STYLE}</style></head><body><main>",
        f"<h1>{escape(heading(report).partition(': ')[0])}</h1>",
        f'<p class="meta">{escape(heading(report).partition(": ")[2])}</p>',
        verdict_html,
        f"<h2>Settings given</h2><ul>{changed}</ul>" if changed else "",
        *(_html_table(report, block) for block in html_blocks(names, HTML_COLUMNS)),
        f'<p class="note">{escape(legend(report))}; ± the jackknife standard error</p>',
        f"<h2>Why they differ</h2><ul>{why}</ul>" if why else "",
        "<h2>Trainers</h2><div class=\"scroll\"><table class=\"trainers\"><thead><tr><th>trainer</th>"
        "<th class=\"prose\">what it runs, and its settings</th><th>weight</th><th class=\"prose\">traits</th></tr>"
        f"</thead><tbody>{setting_rows}</tbody></table></div>",
        f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
        f"<footer>{escape(report.device)}, {escape(report.dtype)}; one read of the input, every trainer on the same "
        "chunks (docs/replay.md)</footer>",
        "</main></body></html>", "",
    ]
    return "\n".join(part for part in parts if part)


__all__ = ["HTML_COLUMNS", "cell_text", "dump_lines", "heading", "html_blocks", "legend", "render_replay_html",
           "render_replay_json", "render_replay_markdown", "render_replay_table", "replay_grid", "settings_lines"]
