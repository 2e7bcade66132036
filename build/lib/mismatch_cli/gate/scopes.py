"""The per-step and per-group tables of a report as rule scopes: `step`, one `--by` column, or `group` (all).

A rule such as `max(step:abs(kl))<=1e-3` reads one metric from every entry of a scope; this module
finds the entries and reduces their values (max, min, mean, every, any). No dump, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mismatch_cli.report import Report

AGGREGATES = ("max", "min", "mean", "every", "any")
QUANTIFIERS = ("every", "any")  # hold each entry to the bound, rather than one reduced value
ALL_GROUPS = "group"
VERL_PREFIX = "rollout_corr/"


@dataclass(frozen=True)
class Entry:
    """One row of a scope: its label (`step 12`, `env_name=math`) and its metric value (None when undefined)."""

    label: str
    value: float | None


def scope_rows(report: Report, scope: str) -> list[tuple[str, dict[str, float | None]]]:
    """(label, metrics) of every entry of a scope: `step`, a `--by` column, or `group` for every column."""
    if scope == "step":
        return [(f"step {e['step']}", e["metrics"]) for e in report.steps]
    columns = list(report.groups) if scope == ALL_GROUPS else [scope] if scope in report.groups else []
    return [(f"{column}={e['group']}", e["metrics"]) for column in columns for e in report.groups[column]]


def scope_words(scope: str, count: int | None = None) -> str:
    """The scope's entries in words ("steps", "3 steps", "env_name groups")."""
    noun = "steps" if scope == "step" else "groups" if scope == ALL_GROUPS else f"{scope} groups"
    if count is None:
        return noun
    return f"{count} {noun if count != 1 else noun[:-1]}"


def missing_scope(report: Report, scope: str) -> str:
    """Why a scope has no entry in this report, with what to do."""
    if scope == "step":
        return "the report has no per-step table (analyze with --by step, on an input that has steps)"
    if scope == ALL_GROUPS:
        return "the report has no per-group table (analyze with --by COLUMN)"
    known = ", ".join(sorted(report.groups)) or "none"
    return (f"the report has no {scope} groups (its --by columns: {known}); analyze with --by {scope}, or use "
            "step or group as the scope")


def resolve_metric(metric: str, rows: list[tuple[str, dict[str, float | None]]]) -> str | None:
    """The key a rule's metric names in a scope's entries (`kl` is `rollout_corr/kl`), None when no entry has it."""
    for key in (metric, VERL_PREFIX + metric):
        if any(key in values for _, values in rows):
            return key
    return None


def entries(rows: list[tuple[str, dict[str, float | None]]], key: str, magnitude: bool) -> list[Entry]:
    """Each entry's value of one key (|value| for abs()); undefined or non-finite values become None."""
    found = []
    for label, values in rows:
        value = values.get(key)
        if value is None or not math.isfinite(value):
            found.append(Entry(label, None))
        else:
            found.append(Entry(label, abs(value) if magnitude else float(value)))
    return found


def reduce(aggregate: str, defined: list[Entry]) -> tuple[float, Entry | None]:
    """max / min / mean of the defined entries, and the entry that holds the max / min (None for mean)."""
    if aggregate == "max":
        top = max(defined, key=lambda e: e.value)  # type: ignore[arg-type, return-value]
        return float(top.value), top  # type: ignore[arg-type]
    if aggregate == "min":
        low = min(defined, key=lambda e: e.value)  # type: ignore[arg-type, return-value]
        return float(low.value), low  # type: ignore[arg-type]
    return math.fsum(e.value for e in defined) / len(defined), None  # type: ignore[misc]


def listing(found: list[Entry], shown: int = 5) -> str:
    """The first entries as `label = value`, and how many more ("step 3 = 0.012, step 7 = 0.02 and 4 more")."""
    text = ", ".join(f"{e.label} = {e.value:.6g}" for e in found[:shown])
    return text + (f" and {len(found) - shown} more" if len(found) > shown else "")


__all__ = ["AGGREGATES", "ALL_GROUPS", "QUANTIFIERS", "Entry", "entries", "listing", "missing_scope", "reduce",
           "resolve_metric", "scope_rows", "scope_words"]
