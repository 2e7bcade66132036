"""Two runs side by side: BASE is the reference, CANDIDATE is judged against it (pyperf / asv semantics).

Each side is a finished `Report` (read from report.json, or analyzed from dumps first). A change is
`~` (within noise) when the two 95 % bootstrap intervals overlap, `=` (no practical change) when it is
smaller than the metric's minimal practical difference (registry default, or the caller's); otherwise
it is `+` (worse) or `-` (better) by the metric's direction; `x` marks a metric only one side has, `!`
a breached limit, `B` a change that looks better only because of a value only a bug allows (gate/bugs.py),
which counts as neither better nor worse.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mismatch_cli.correction import REPLAY_FAMILIES
from mismatch_cli.errors import DataError, UsageError, suggest
from mismatch_cli.gate.bugs import BUG, BUG_LEGEND, bug_clause, bug_title, bug_value_reason, fail_bug_passes
from mismatch_cli.gate.noise import min_difference_of, overlap
from mismatch_cli.gate.thresholds import CheckResult, Rule, evaluate
from mismatch_cli.metrics import Direction, aliases_of, closest, resolve_name
from mismatch_cli.metrics import direction_of as registry_direction
from mismatch_cli.report import SCHEMA_VERSION, Report
from mismatch_cli.system.numbers import parse_number

# Directions come from the metric registry (never guessed from a name); kept here under their old names.
LOWER, HIGHER, CLOSER_TO_1, LOWER_ABS = Direction.LOWER, Direction.HIGHER, Direction.CLOSER_TO_1, Direction.LOWER_ABS

WORSE, BETTER, NOISE, SAME, BREACH, ONE_SIDE, CHANGED = "+", "-", "~", "=", "!", "x", "*"
MARKS = {
    WORSE: "worse",
    BETTER: "better",
    NOISE: "within noise (the 95 % intervals overlap, or equal values)",
    SAME: "no practical change (smaller than the metric's minimal practical difference)",
    BREACH: "limit breached",
    ONE_SIDE: "only on one side",
    CHANGED: "changed; no better direction (a count, or a metric the registry does not know)",
    BUG: BUG_LEGEND,
}

# The headline metrics, in table order (others join when a rule names them, and veto fractions).
HEADLINE = (
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/ppl_ratio",
    "diag/logprob_abs_diff_mean",
    "diag/ess_token",
    "diag/ess_seq_kish",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_std",
    "rollout_corr/rollout_is_eff_sample_size",
    "rollout_corr/rollout_rs_masked_fraction",
    "rollout_corr/rollout_rs_seq_masked_fraction",
    # Older families (--semantics verl-0.6.0 / xtuner) name theirs `mismatch/...` (no intervals there).
    "mismatch/mismatch_kl",
    "mismatch/mismatch_k3_kl",
    "mismatch/mismatch_log_ppl_abs_diff",
    "mismatch/mismatch_ppl_ratio",
    "mismatch/mismatch_logprob_abs_diff",
    "mismatch/rollout_is_mean",
    "mismatch/rollout_is_eff_sample_size",
    # A replayed trainer (--semantics trl, ...) compares by its own lead keys (no intervals there either).
    *(key for family in REPLAY_FAMILIES.values() for key in family.lead_keys),
)

def direction_of(metric: str) -> Direction | None:
    """Which way is better for a metric (from the registry), or None for counts and unknown keys."""
    direction = registry_direction(metric)
    return None if direction is Direction.NONE else direction


@dataclass
class MetricRow:
    """One metric on both sides."""

    metric: str
    base: float | None
    candidate: float | None
    direction: Direction | None
    mark: str
    base_interval: list[float] | None = None
    candidate_interval: list[float] | None = None
    min_difference: float | None = None  # the smallest change that counts, in the metric's unit (None: any)
    base_bug: str | None = None  # why the base's value is one only a bug allows (None: it is not)
    candidate_bug: str | None = None

    @property
    def change(self) -> float | None:
        """candidate - base."""
        if self.base is None or self.candidate is None:
            return None
        return self.candidate - self.base

    @property
    def relative(self) -> float | None:
        """(candidate - base) / |base|, None when base is 0 or missing."""
        change = self.change
        if change is None or self.base == 0:
            return None
        return change / abs(self.base)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (with `bug`, by side, only where a side's value is a bug's)."""
        body = {"metric": self.metric, "base": self.base, "candidate": self.candidate, "change": self.change,
                "relative_change": self.relative,
                "direction": None if self.direction is None else self.direction.phrase, "mark": self.mark,
                "base_interval": self.base_interval, "candidate_interval": self.candidate_interval,
                "min_difference": self.min_difference}
        bugs = {side: why for side, why in (("base", self.base_bug), ("candidate", self.candidate_bug)) if why}
        return {**body, "bug": bugs} if bugs else body


@dataclass
class RoundRow:
    """One round index on both sides (mean |delta| and k1 KL of the round)."""

    round: int
    base: dict[str, Any] | None
    candidate: dict[str, Any] | None
    mark: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        pick = ("tokens", "abs_diff_mean", "kl", "chi2_token")

        def side(entry: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if entry is None else {k: entry.get(k) for k in pick}

        return {"round": self.round, "base": side(self.base), "candidate": side(self.candidate), "mark": self.mark}


@dataclass
class Comparison:
    """The side-by-side table, per-round rows, notes, and (with limits) the check result."""

    base_label: str
    candidate_label: str
    rows: list[MetricRow]
    rounds: list[RoundRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    check: CheckResult | None = None
    has_intervals: bool = True
    base_bug: str | None = None  # the title of a side's own BUG diagnosis (None: its verdict is not BUG)
    candidate_bug: str | None = None

    def bugs(self) -> list[str]:
        """Each side with a bug in its dump or config, and the bug (its BUG title, or why its values are a bug's)."""
        clauses = (bug_clause("the base", self.base_bug, {r.metric: r.base_bug for r in self.rows if r.base_bug}),
                   bug_clause("the candidate", self.candidate_bug,
                              {r.metric: r.candidate_bug for r in self.rows if r.candidate_bug}))
        return [clause for clause in clauses if clause]

    def counts(self) -> dict[str, int]:
        """How many rows carry each mark."""
        return {mark: sum(r.mark == mark for r in self.rows) for mark in MARKS}

    def verdict(self) -> str:
        """One line in asv's spirit: what changed beyond noise, and whether a limit broke."""
        counts = self.counts()
        worse = [r.metric for r in self.rows if r.mark == WORSE]
        better = [r.metric for r in self.rows if r.mark == BETTER]
        parts = [f"{counts[WORSE]} worse", f"{counts[BETTER]} better", f"{counts[NOISE]} within noise"]
        for mark, words in ((SAME, "below the practical difference"), (BREACH, "breached"),
                            (ONE_SIDE, "only on one side"), (CHANGED, "changed"), (BUG, "a bug's value")):
            if counts[mark]:
                parts.append(f"{counts[mark]} {words}")
        summary = ", ".join(parts)
        bugs = f"BUG - {'; '.join(self.bugs())}" if self.bugs() else ""  # named whatever else the line says
        if self.check is not None and self.check.exit_code == 1:
            return f"verdict: FAIL - {len(self.check.breaches)} limit(s) breached ({summary}); " \
                   f"worst: {self.check.breaches[0].message}" + (f"; {bugs}" if bugs else "")
        if self.check is not None and self.check.exit_code:  # a limit that could not be evaluated (exit 2 / 3)
            errors = [o for o in self.check.outcomes if o.status == "error"]
            return f"verdict: ERROR - {len(errors)} limit(s) not evaluated ({summary}); " \
                   f"{errors[0].rule.text}: {errors[0].message}" + (f"; {bugs}" if bugs else "")
        if worse and better:
            head = "MIXED - candidate changed beyond noise both ways"
        elif worse:
            head = f"WORSE - candidate is worse beyond noise on {', '.join(_short(m) for m in worse)}"
        elif better:
            head = f"BETTER - candidate is better beyond noise on {', '.join(_short(m) for m in better)}"
        else:
            head = "NO SIGNIFICANT CHANGE"
        head = f"{bugs}; {head}" if bugs else head  # the bug first: `B` rows are not counted better
        tail = "" if self.has_intervals else " (some changes judged without intervals; see the notes)"
        return f"verdict: {head} ({summary}){tail}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        body: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "base": self.base_label,
            "candidate": self.candidate_label,
            "metrics": [r.to_dict() for r in self.rows],
            "rounds": [r.to_dict() for r in self.rounds],
            "notes": self.notes,
            "verdict": self.verdict(),
        }
        if self.base_bug or self.candidate_bug:
            body["bug"] = {side: title for side, title in (("base", self.base_bug), ("candidate", self.candidate_bug))
                           if title}
        if self.check is not None:
            body["check"] = self.check.to_dict()
        return body


def _short(metric: str) -> str:
    return metric.split("/", 1)[1] if metric.startswith("rollout_corr/") else metric


def _value(report: Report, metric: str) -> float | None:
    value = report.metrics.get(metric)
    return value if value is not None and math.isfinite(value) else None


def _mark(base: float | None, candidate: float | None, direction: Direction | None, overlapping: bool | None,
          breached: bool, min_difference: float | None = None, base_bug: bool = False,
          candidate_bug: bool = False) -> str:
    if base is None or candidate is None:
        return ONE_SIDE
    if breached:
        return BREACH
    if overlapping or base == candidate:
        return NOISE
    if min_difference is not None and abs(candidate - base) < min_difference:
        return SAME
    if direction is None:
        return CHANGED
    mark = WORSE if direction.badness(candidate) > direction.badness(base) else BETTER
    # A bug's value never wins: neither the candidate's looking better nor the base's making the candidate worse.
    return BUG if (mark == BETTER and candidate_bug) or (mark == WORSE and base_bug) else mark


def _compare_rounds(base: Report, candidate: Report) -> list[RoundRow]:
    if not base.rounds or not candidate.rounds or max(len(base.rounds), len(candidate.rounds)) < 2:
        return []
    rows, bugs = [], (bug_title(base) is not None, bug_title(candidate) is not None)
    for k in range(max(len(base.rounds), len(candidate.rounds))):
        b = base.rounds[k] if k < len(base.rounds) else None
        c = candidate.rounds[k] if k < len(candidate.rounds) else None
        bv = None if b is None else b.get("abs_diff_mean")
        cv = None if c is None else c.get("abs_diff_mean")
        rows.append(RoundRow(k, b, c, _mark(bv, cv, LOWER, None, False, None, *bugs)))
    return rows


def _config_notes(base: Report, candidate: Report) -> list[str]:
    # Only the correction fields: a side made with --by, on another device or dtype used the same correction.
    ours, theirs = base.correction, candidate.correction
    differing = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
    if not differing:
        return []
    if "semantics" in differing:  # another trainer's rules and keys: say that first, the fields follow from it
        differing.remove("semantics")
        differing.insert(0, "semantics")
    shown = ", ".join(f"{k}: {ours.get(k)!r} vs {theirs.get(k)!r}" for k in differing[:4])
    return [f"the sides were analyzed with different corrections ({shown}); metrics of one family may be missing "
            "on the other side"]


# ------------------------------------------------------------------------ minimal practical difference
DIFFERENCE_HINT = "write METRIC=AMOUNT (in the metric's unit, e.g. kl=1e-4) or METRIC=N% (of |base|), or METRIC=none"


def _difference(value: float | str | None, what: str) -> tuple[float, bool] | None:
    """(amount, relative) of one override: a number is absolute, 'N%' a fraction of |base|, None / 'none' no MPD."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    relative = isinstance(value, str) and value.strip().endswith("%")
    number = parse_number(value.strip().removesuffix("%") if isinstance(value, str) else value, what,
                          hint=DIFFERENCE_HINT)
    if number < 0:
        raise UsageError(f"{what} must be >= 0, got {value!r}", hint=DIFFERENCE_HINT)
    return (number / 100.0, True) if relative else (number, False)


def resolve_min_differences(overrides: Mapping[str, float | str | None] | None = None,
                            origin: str = "min_difference") -> dict[str, tuple[float, bool] | None]:
    """The caller's minimal practical differences by registered key (and its older-family aliases), validated."""
    resolved: dict[str, tuple[float, bool] | None] = {}
    named: dict[str, str] = {}
    for name, value in (overrides or {}).items():
        key = resolve_name(name)
        if key is None:
            close = closest(name)
            tail = suggest(close, "run `mismatch metrics` to list the metrics")
            raise UsageError(f"{origin}: unknown metric {name!r}", hint=tail)
        difference = _difference(value, f"{origin} of {name}")
        if key in named:  # `kl=1e-4` and `rollout_corr/kl=1e-3`: which one was meant?
            raise UsageError(f"{origin}: {key} is given twice ({named[key]!r} and {name!r})",
                             hint="give each metric once")
        named[key] = name
        for target in (key, *aliases_of(key)):
            resolved[target] = difference
    return resolved


def parse_min_differences(texts: list[str], origin: str = "--min-difference") -> dict[str, str]:
    """`METRIC=AMOUNT` / `METRIC=N%` strings (a repeatable flag) as the mapping `compare_reports` takes."""
    parsed: dict[str, str] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"{origin}: cannot read {text!r}", hint=DIFFERENCE_HINT)
        if name.strip() in parsed:
            raise UsageError(f"{origin}: {name.strip()} is given twice ({parsed[name.strip()]} and {value.strip()})",
                             hint="give each metric once")
        parsed[name.strip()] = value.strip()
    resolve_min_differences(parsed, origin)  # refuse bad names and amounts before any input is read
    return parsed


def compare_reports(
    base: Report,
    candidate: Report,
    rules: list[Rule] | None = None,
    missing: str = "error",
    base_label: str = "base",
    candidate_label: str = "candidate",
    min_difference: Mapping[str, float | str | None] | None = None,
) -> Comparison:
    """Compare two finished reports; with rules, hold the candidate to them (BASE is the baseline).

    `min_difference` overrides the registry's minimal practical differences, by metric: a number is an
    amount in the metric's unit, `"N%"` a fraction of |base|, None no minimum; a smaller change is `=`.
    """
    rules = rules or []
    differences = resolve_min_differences(min_difference)
    check = evaluate(rules, candidate, base, missing) if rules else None
    if check is not None:
        fail_bug_passes(check, candidate, base)
    # Rules over steps or groups judge per-step / per-group values, not the row of the overall metric.
    plain = [o for o in (check.outcomes if check else []) if o.rule.scope is None]
    breached = {o.metric for o in plain if o.status == "fail"}
    keys = [k for k in HEADLINE if k in base.metrics or k in candidate.metrics]
    keys += [o.metric for o in plain if o.metric in base.metrics or o.metric in candidate.metrics]
    keys += sorted(k for k in set(base.metrics) | set(candidate.metrics)
                   if k not in keys and "veto" in k and "fraction" in k)
    keys = list(dict.fromkeys(keys))
    common = [k for k in keys if _value(base, k) is not None and _value(candidate, k) is not None]
    if not common:
        raise DataError(
            f"nothing to compare: {base_label} and {candidate_label} have no headline metric in common",
            hint="compare two mismatch reports (report.json) or two dumps",
        )
    rows = []
    for key in keys:
        b, c = _value(base, key), _value(candidate, key)
        bi, ci = base.intervals.get(key), candidate.intervals.get(key)
        direction = direction_of(key)
        least = min_difference_of(key, b, differences)
        base_bug, candidate_bug = bug_value_reason(base, key), bug_value_reason(candidate, key)
        mark = _mark(b, c, direction, overlap(bi, ci), key in breached, least, base_bug is not None,
                     candidate_bug is not None)
        rows.append(MetricRow(key, b, c, direction, mark, bi, ci, least, base_bug, candidate_bug))
    notes = _config_notes(base, candidate)
    unjudged = [r.metric for r in rows if r.base is not None and r.candidate is not None
                and not (r.base_interval and r.candidate_interval)]
    if unjudged:
        shown = ", ".join(unjudged[:4]) + (f" and {len(unjudged) - 4} more" if len(unjudged) > 4 else "")
        notes.append(f"no bootstrap intervals for {shown}: their changes are judged by direction alone "
                     "(the bootstrap covers verl's and mismatch's keys, not an older family's or a replayed "
                     "trainer's; reports made with --bootstrap 0 or by an older version have none)")
    titles = bug_title(base), bug_title(candidate)
    return Comparison(base_label, candidate_label, rows, _compare_rounds(base, candidate), notes, check,
                      not unjudged, *titles)


def is_report_path(arg: str) -> bool:
    """Whether a side names a report (a .json path, or a folder holding report.json and no dump)."""
    if arg.lower().endswith(".json"):
        return True
    if os.path.isdir(arg) and os.path.isfile(os.path.join(arg, "report.json")):
        for _root, _dirs, files in os.walk(arg):
            if any(f.endswith((".parquet", ".safetensors")) for f in files):
                return False
        return True
    return False


__all__ = [
    "CLOSER_TO_1", "DIFFERENCE_HINT", "HEADLINE", "HIGHER", "LOWER", "LOWER_ABS", "MARKS", "Comparison", "MetricRow",
    "RoundRow", "compare_reports", "direction_of", "is_report_path", "min_difference_of", "parse_min_differences",
    "resolve_min_differences",
]
