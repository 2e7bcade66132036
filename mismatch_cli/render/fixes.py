"""Every family's vocabulary of fixes as Markdown (docs/fixes.md), JSON or a terminal table: `mismatch fixes`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich.console import Console

from mismatch_cli.correction.fixes import CONCERNS, Fixes

INTRO = """# Fixes, in each trainer's own words

What `mismatch analyze --semantics NAME` may tell you to change, for every family it knows: each setting as that
trainer spells it, with the upstream file and line that defines it at the version named. Concerns a trainer has
no setting for say so, with what to do instead. Traps are pitfalls the answers name when the evidence fits them.
Generated from the vocabularies (`mismatch_cli/trainers/<name>/fixes.py`, `mismatch_cli/correction/fixes_*.py`):
`mismatch fixes --format markdown > docs/fixes.md`.
"""


def grouped(vocabularies: dict[str, Fixes]) -> list[tuple[list[str], Fixes]]:
    """Families that share one vocabulary, together, in the families' order."""
    groups: list[tuple[list[str], Fixes]] = []
    for family, fixes in vocabularies.items():
        same = next((names for names, other in groups if other is fixes), None)
        if same is not None:
            same.append(family)
        else:
            groups.append(([family], fixes))
    return groups


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_fixes_markdown(vocabularies: dict[str, Fixes]) -> str:
    """Every vocabulary as one Markdown page: a table of settings per trainer, then what it lacks and its traps."""
    lines = [INTRO]
    for names, fixes in grouped(vocabularies):
        lines += [f"## {fixes.trainer} (`{'`, `'.join(names)}`)", "", f"Syntax: {fixes.syntax}.", "",
                  "| concern | setting | note | defined at |", "|---|---|---|---|"]
        for concern in CONCERNS:
            for setting in fixes.settings.get(concern, ()):
                lines.append(f"| {concern} | `{_cell(setting.text)}` | {_cell(setting.note)} | "
                             f"`{_cell(setting.source)}` |")
        lines.append("")
        missing = [(c, fixes.missing[c]) for c in CONCERNS if c in fixes.missing]
        if missing:
            lines += ["No setting:", ""] + [f"- **{c}**: {_cell(text)}" for c, text in missing] + [""]
        if fixes.traps:
            lines += ["Traps:", ""] + [f"- {_cell(t.text)} (`{_cell(t.source)}`)" for t in fixes.traps] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _plain(fixes: Fixes) -> dict[str, Any]:
    return {"trainer": fixes.trainer, "syntax": fixes.syntax,
            "settings": {c: [asdict(s) for s in fixes.settings.get(c, ())] for c in CONCERNS if c in fixes.settings},
            "missing": dict(fixes.missing), "traps": [asdict(t) for t in fixes.traps]}


def render_fixes_json(vocabularies: dict[str, Fixes]) -> str:
    """Every vocabulary as a versioned JSON document: `{schema_version, families: {name: vocabulary}}`."""
    from mismatch_cli.report import SCHEMA_VERSION

    body = {"schema_version": SCHEMA_VERSION, "families": {f: _plain(x) for f, x in vocabularies.items()}}
    return json.dumps(body, indent=2) + "\n"


def render_fixes_table(vocabularies: dict[str, Fixes], console: Console) -> None:
    """Each vocabulary as indented lines (a setting is never split, whatever the width); sources with --format
    markdown or json."""
    import textwrap

    from rich.markup import escape

    def say(text: str, indent: int, style: str = "") -> None:
        for line in textwrap.wrap(text, max(console.width - indent, 20), break_long_words=False,
                                  break_on_hyphens=False) or [""]:
            shown = escape(" " * indent + line)
            console.print(f"[{style}]{shown}[/]" if style else shown, highlight=False, soft_wrap=True)

    for names, fixes in grouped(vocabularies):
        say(f"{fixes.trainer} ({', '.join(names)}): {fixes.syntax}", 0, "bold")
        for concern in CONCERNS:
            settings = fixes.settings.get(concern, ())
            if not settings and concern not in fixes.missing:
                continue
            say(concern, 2)
            for setting in settings:
                say(setting.text, 4)
                if setting.note:
                    say(setting.note, 6)
            if concern in fixes.missing:
                say(f"none: {fixes.missing[concern]}", 4)
        console.print()


__all__ = ["render_fixes_json", "render_fixes_markdown", "render_fixes_table"]
