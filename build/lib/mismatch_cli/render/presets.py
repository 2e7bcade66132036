"""A family's rollout-correction presets as a terminal table, Markdown or JSON."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console


def _columns(fields: tuple[str, ...]) -> list[str]:
    return ["name", *fields, "summary"]


def render_presets_json(family: str, rows: list[dict[str, Any]]) -> str:
    """The presets as a versioned JSON document: `{schema_version, semantics, presets}`."""
    from mismatch_cli.report import SCHEMA_VERSION

    return json.dumps({"schema_version": SCHEMA_VERSION, "semantics": family, "presets": rows}, indent=2) + "\n"


def render_presets_markdown(fields: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    """The presets as a Markdown table, one row per preset."""
    columns = _columns(fields)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_presets_table(family: str, fields: tuple[str, ...], rows: list[dict[str, Any]], console: Console) -> None:
    """The presets as a terminal table, one row per preset (names and values never split across lines)."""
    from mismatch_cli.render.table import render_presets_table as print_presets

    print_presets(family, _columns(fields), rows, console)
