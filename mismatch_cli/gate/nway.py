"""Three or more runs side by side (precision arms, engines): each run's value and interval, the best and
the worst run per metric.

No run is the reference: every number of a row is a function of the runs' reports alone, never of the
order they were given in (the best and worst are chosen by the metric's direction, ties going to the
label first in sort order). A row is `~` (within noise) when the best and the worst run's 95 % intervals
overlap or their values are equal, `=` (no practical difference) when best and worst are closer than the
metric's minimal practical difference (a relative one is a fraction of the smaller |value| of the two),
`*` when the runs differ beyond both, and `x` when some run lacks the metric. Metrics without a
direction (counts, unknown keys) get no best or worst; their extremes are the smallest and largest value.

A value only a bug allows (every value of a run whose report says BUG, a χ² below 0 or a token ratio mean
below 1 beyond noise: gate/bugs.py) is never best: the best is the best of the other runs' values (the worst
may be a bug's), and a row is `B` when no run without a bug's value is better than another.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from mismatch_cli.errors import DataError, UsageError
from mismatch_cli.gate.bugs import BUG, bug_clause, bug_title, bug_value_reason
from mismatch_cli.gate.comparison import (
    HEADLINE,
    direction_of,
    is_report_path,
    min_difference_of,
    resolve_min_differences,
)
from mismatch_cli.metrics import Direction
from mismatch_cli.report import SCHEMA_VERSION, Report

DIFFER, NOISE, SAME, MISSING = "*", "~", "=", "x"
NWAY_MARKS = {
    DIFFER: "the runs differ beyond noise (the best and the worst run's 95 % intervals do not overlap)",
    NOISE: "within noise (the best and the worst run's 95 % intervals overlap, or equal values)",
    SAME: "no practical difference (best and worst closer than the metric's minimal practical difference)",
    MISSING: "missing in some run",
    BUG: "not judged: only a bug's values are better than the others (a bug's value is never best)",
}


@dataclass
class Run:
    """One run (arm) as the comparison names it: its label and where it came from."""

    label: str
    source: str  # the path as given, or "report" for a Report passed from Python
    bug: str | None = None  # the title of the run's own BUG diagnosis (None: its verdict is not BUG)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (with `bug` only for a run whose report says BUG)."""
        body = {"label": self.label, "source": self.source}
        return {**body, "bug": self.bug} if self.bug else body


@dataclass
class SpreadRow:
    """One metric across every run: values and intervals by label, the best and the worst run."""

    metric: str
    values: dict[str, float | None]
    intervals: dict[str, list[float] | None]
    direction: Direction | None
    mark: str
    best: str | None = None
    worst: str | None = None
    min_difference: float | None = None  # the smallest best-to-worst gap that counts (None: any)
    bug_values: dict[str, str] = field(default_factory=dict)  # label -> why its value is one only a bug allows

    @property
    def spread(self) -> float | None:
        """Largest minus smallest value over the runs that have one (None with fewer than two)."""
        present = [v for v in self.values.values() if v is not None]
        return max(present) - min(present) if len(present) >= 2 else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (with `bug_values` only where some run's value is a bug's)."""
        body = {"metric": self.metric, "direction": None if self.direction is None else self.direction.phrase,
                "mark": self.mark, "values": dict(self.values), "intervals": dict(self.intervals),
                "best": self.best, "worst": self.worst, "spread": self.spread, "min_difference": self.min_difference}
        return {**body, "bug_values": dict(self.bug_values)} if self.bug_values else body


@dataclass
class RunsComparison:
    """Every run side by side: one row per metric, notes, and a one-line verdict."""

    runs: list[Run]
    rows: list[SpreadRow]
    notes: list[str] = field(default_factory=list)
    has_intervals: bool = True

    @property
    def labels(self) -> list[str]:
        """The runs' labels, in the order given."""
        return [run.label for run in self.runs]

    def counts(self) -> dict[str, int]:
        """How many rows carry each mark."""
        return {mark: sum(r.mark == mark for r in self.rows) for mark in NWAY_MARKS}

    def bugs(self) -> list[str]:
        """Each run with a bug in its dump or config, and the bug (its BUG title, or why its values are a bug's)."""
        clauses = (bug_clause(run.label, run.bug, {r.metric: r.bug_values[run.label] for r in self.rows
                                                   if run.label in r.bug_values}) for run in self.runs)
        return [clause for clause in clauses if clause]

    def verdict(self) -> str:
        """One line: which run has a bug, on which metrics the runs differ beyond noise, and which run is most
        often best and worst."""
        counts = self.counts()
        parts = [f"{counts[DIFFER]} differ", f"{counts[NOISE]} within noise"]
        for mark, words in ((SAME, "below the practical difference"), (MISSING, "missing in some run"),
                            (BUG, "not judged for a bug's values")):
            if counts[mark]:
                parts.append(f"{counts[mark]} {words}")
        summary = ", ".join(parts)
        differing = [r for r in self.rows if r.mark == DIFFER]
        tail = "" if self.has_intervals else " (some spreads judged without intervals; see the notes)"
        bugs = f"BUG - {'; '.join(self.bugs())} (never best); " if self.bugs() else ""  # the bug first
        if not differing:
            return f"verdict: {bugs}NO SIGNIFICANT DIFFERENCE between the {len(self.runs)} runs ({summary}){tail}"
        head = f"verdict: {bugs}RUNS DIFFER beyond noise on {', '.join(_short(r.metric) for r in differing)}"
        ranked = [r for r in differing if r.best is not None]
        if ranked:
            head += f"; best most often: {_most_often([r.best for r in ranked])}, " \
                    f"worst most often: {_most_often([r.worst for r in ranked])}"
        return f"{head} ({summary}){tail}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (compare.json with three or more runs)."""
        return {"schema_version": SCHEMA_VERSION, "runs": [run.to_dict() for run in self.runs],
                "metrics": [r.to_dict() for r in self.rows], "notes": self.notes, "verdict": self.verdict()}


def _short(metric: str) -> str:
    return metric.split("/", 1)[1] if metric.startswith("rollout_corr/") else metric


def _most_often(labels: list[str | None]) -> str:
    counts = Counter(label for label in labels if label is not None)
    top = max(counts.values())
    # Ties name every tied run, in sort order, so the line does not depend on the order of the runs.
    return " / ".join(sorted(label for label, n in counts.items() if n == top)) + f" ({top} of {len(labels)})"


def _value(report: Report, metric: str) -> float | None:
    value = report.metrics.get(metric)
    return value if value is not None and math.isfinite(value) else None


def _extremes(values: dict[str, float], direction: Direction | None) -> tuple[str, str]:
    """(best, worst) by the direction, or (smallest, largest) without one; ties to the label first in sort order."""
    if direction is None:
        return min(values, key=lambda k: (values[k], k)), min(values, key=lambda k: (-values[k], k))
    badness = {k: direction.badness(v) for k, v in values.items()}
    return min(badness, key=lambda k: (badness[k], k)), min(badness, key=lambda k: (-badness[k], k))


def _row(metric: str, reports: Mapping[str, Report], differences: Mapping[str, tuple[float, bool] | None]) -> SpreadRow:
    values = {label: _value(report, metric) for label, report in reports.items()}
    intervals = {label: report.intervals.get(metric) for label, report in reports.items()}
    direction = direction_of(metric)
    present = {k: v for k, v in values.items() if v is not None}
    bugs = {label: why for label in present if (why := bug_value_reason(reports[label], metric)) is not None}
    if len(present) < 2:
        return SpreadRow(metric, values, intervals, direction, MISSING, bug_values=bugs)
    low, high = _extremes(present, direction)
    clean = {k: v for k, v in present.items() if k not in bugs}
    if direction is not None and low in bugs:  # a bug's value is never best: the best of the others is
        low = _extremes(clean, direction)[0] if clean else high
        if low == high:  # every run that would be better has a bug's value
            return SpreadRow(metric, values, intervals, direction, BUG, bug_values=bugs)
    a, b = present[low], present[high]
    least = min_difference_of(metric, min(abs(a), abs(b)), differences)
    ia, ib = intervals[low], intervals[high]
    if len(present) < len(values):
        mark = MISSING
    elif a == b or (ia and ib and ia[0] <= ib[1] and ib[0] <= ia[1]):
        mark = NOISE
    elif least is not None and abs(a - b) < least:
        mark = SAME
    else:
        mark = DIFFER
    named = direction is not None and a != b  # all equal: nobody is best
    return SpreadRow(metric, values, intervals, direction, mark, low if named else None, high if named else None,
                     least, bugs)


def _correction_notes(reports: Mapping[str, Report]) -> list[str]:
    fields = sorted({k for report in reports.values() for k in report.correction})
    differing = [k for k in fields if len({repr(r.correction.get(k)) for r in reports.values()}) > 1]
    if not differing:
        return []
    shown = "; ".join(f"{k}: " + ", ".join(f"{label} {r.correction.get(k)!r}" for label, r in reports.items())
                      for k in differing[:3])
    return [f"the runs were analyzed with different corrections ({shown}); metrics of one family may be missing "
            "in the others"]


def compare_runs(runs: Sequence[tuple[str, Report]], sources: Sequence[str] | None = None,
                 min_difference: Mapping[str, float | str | None] | None = None,
                 metrics: Sequence[str] | None = None) -> RunsComparison:
    """Put finished reports side by side, by label: one row per headline metric any run has (or per key of
    `metrics`, in that order).

    `min_difference` overrides the registry's minimal practical differences as in `compare_reports`; a
    relative amount ("N%") is a fraction of the smaller |value| of the best and the worst run.
    """
    labels = [label for label, _ in runs]
    if len(runs) < 2:
        raise UsageError(f"compare needs at least two runs, got {len(runs)}", hint="give two or more runs")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise UsageError(f"two runs have the same label {repeated[0]!r}", hint="give every run its own label")
    reports = dict(runs)
    differences = resolve_min_differences(min_difference)
    if metrics is not None:
        keys = list(dict.fromkeys(metrics))
    else:
        keys = [k for k in HEADLINE if any(k in r.metrics for r in reports.values())]
        keys += sorted({k for r in reports.values() for k in r.metrics
                        if k not in keys and "veto" in k and "fraction" in k})
    rows = [_row(key, reports, differences) for key in keys]
    if not any(all(v is not None for v in row.values.values()) for row in rows):
        lacking = next((label for label, r in reports.items() if not any(_value(r, k) is not None for k in keys)),
                       labels[-1])
        raise DataError(f"nothing to compare: no headline metric is in every run ({lacking} lacks them)",
                        hint="compare mismatch reports (report.json) or dumps")
    notes = _correction_notes(reports)
    unjudged = [r.metric for r in rows if r.mark != MISSING and not all(r.intervals.values())]
    if unjudged:
        shown = ", ".join(unjudged[:4]) + (f" and {len(unjudged) - 4} more" if len(unjudged) > 4 else "")
        notes.append(f"no bootstrap intervals in every run for {shown}: their spread is judged by the minimal "
                     "practical difference alone (reports made with --bootstrap 0 or by an older version have none)")
    given = list(sources) if sources is not None else labels
    runs_given = [Run(label, source, bug_title(reports[label])) for label, source in zip(labels, given, strict=True)]
    return RunsComparison(runs_given, rows, notes, not unjudged)


def default_labels(paths: Sequence[str]) -> list[str]:
    """Short unique labels: each path's stem (a folder's name), with as many parent folders as it takes to differ."""
    parts = [[p for p in PurePath(os.path.normpath(path)).parts if p not in ("/", ".")] or [path] for path in paths]
    for chain in parts:
        chain[-1] = PurePath(chain[-1]).stem if PurePath(chain[-1]).suffix else chain[-1]
    depth = 1
    while True:
        labels = ["/".join(chain[-depth:]) for chain in parts]
        clashing = len(set(labels)) < len(labels)
        if not clashing or depth >= max(len(chain) for chain in parts):
            return labels if not clashing else list(paths)
        depth += 1


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_repeated_inputs(paths: Sequence[str]) -> None:
    """A usage error when two runs name the same file or folder (however spelled)."""
    seen: dict[str, str] = {}
    identities: dict[str, str] = {}  # run as given -> the file or folder read
    for path in paths:
        named = os.path.join(path, "report.json") if os.path.isdir(path) and is_report_path(path) else path
        key = os.path.realpath(named) if os.path.exists(named) else os.path.normpath(named)
        # The file itself (device and inode): a hard link to a run is that run, whatever its name.
        same = next((p for p, other in identities.items() if os.path.exists(named) and _same_file(named, other)), None)
        if key in seen or same is not None:
            raise UsageError(f"the same run is given twice: {seen.get(key, same)} and {path}",
                             hint="give each run once")
        seen[key] = path
        if os.path.exists(named):
            identities[path] = named
    folders = {key: path for key, path in seen.items() if os.path.isdir(key)}
    for key, path in seen.items():
        inside = next((folder for folder in folders if key != folder and key.startswith(folder + os.sep)), None)
        if inside is not None:
            raise UsageError(f"run {path} is inside run {folders[inside]}, which reads it too",
                             hint="give each run once: a folder, or the files in it")


__all__ = [
    "BUG",
    "DIFFER",
    "MISSING",
    "NOISE",
    "NWAY_MARKS",
    "SAME",
    "Run",
    "RunsComparison",
    "SpreadRow",
    "compare_runs",
    "default_labels",
    "refuse_repeated_inputs",
]
