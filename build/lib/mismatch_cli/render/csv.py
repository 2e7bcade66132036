"""CSV of the report's tables (per step, per group, per round, ...) for spreadsheets, pandas and plotting tools.

The text comes from `Report.table(name)`: one header row, then one row per entry. Columns are in a
stable order: the table's label columns first (`step`; `column`, `group`; `round`), then registered
metrics in the registry's order, then anything else in the order the report holds it. Numbers are
written at full precision (Python's `repr`, which reads back to the same float); an undefined value
is an empty field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mismatch_cli.metrics import METRICS, lookup
from mismatch_cli.report import Report

CSV_TABLES = ("steps", "groups", "rounds")  # the tables `--format csv` is for (any Report.table name works)
LABELS = ("step", "column", "group", "round", "round_from_end", "criterion", "rank", "metric", "name",
          "valid_tokens")
_ORDER = {metric.key: index for index, metric in enumerate(METRICS)}
_DIGITS = re.compile(r"(\d+)")


def _rank(column: str, position: int) -> tuple[int, int, tuple[Any, ...], int]:
    """Sort key: labels first (in LABELS order), registered metrics by registry order, then the rest as found."""
    if column in LABELS:
        return (0, LABELS.index(column), (), position)
    metric = lookup(column)
    if metric is not None:  # a template (round_{k}_...) orders its keys by their numbers: round_2 before round_10
        natural = tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(column))
        return (1, _ORDER[metric.key], natural, position)
    return (2, 0, (), position)


def ordered_columns(columns: list[str]) -> list[str]:
    """The CSV's column order for a table's columns."""
    return [c for _, c in sorted(((_rank(c, i), c) for i, c in enumerate(columns)), key=lambda item: item[0])]


def cell(value: Any) -> str:
    """One field: full-precision numbers (repr), empty for None / NaN / ±inf, true / false for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        value = value.item()  # a numpy scalar
    if isinstance(value, float):
        if not math.isfinite(value):  # undefined or overflowed: null in the JSON report, empty here
            return ""
        # pandas turns a count column with a gap into floats: a whole number reads back the same as "64".
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, (list, tuple)):
        return " ".join(cell(v) for v in value)
    return str(value)


def render_csv(report: Report, name: str) -> str:
    """One of the report's tables (`steps`, `groups`, `rounds`, ... as `Report.table`) as CSV text."""
    frame = report.table(name)
    columns = ordered_columns([str(c) for c in frame.columns])
    lines = [_row(columns)]
    lines += [_row([cell(record.get(c)) for c in columns]) for record in frame.astype(object).to_dict("records")]
    return "".join(lines)


def _row(fields: list[str]) -> str:
    """One CSV line (RFC 4180 quoting). Not the csv module: with "\n" line ends it leaves a carriage return bare,
    and a reader then starts a new row inside a group label (labels may hold any text)."""
    return ",".join('"' + f.replace('"', '""') + '"' if any(c in f for c in ',"\r\n') else f for f in fields) + "\n"


def default_csv_table(report: Report) -> str:
    """The table `--format csv` prints when none is named: steps if the report has them, else groups, else rounds."""
    if report.steps:
        return "steps"
    if any(report.groups.values()):
        return "groups"
    return "rounds"


def render_csv_tables(report: Report) -> dict[str, str]:
    """`NAME.csv` -> CSV text for each of the per-step, per-group and per-round tables the report has."""
    present = {"steps": bool(report.steps), "groups": any(report.groups.values()), "rounds": bool(report.rounds)}
    return {f"{name}.csv": render_csv(report, name) for name in CSV_TABLES if present[name]}


__all__ = ["CSV_TABLES", "cell", "default_csv_table", "ordered_columns", "render_csv", "render_csv_tables"]
