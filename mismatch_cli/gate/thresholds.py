"""CI limits: parse rules (`abs(kl)<=0.01`, `chi2_token:+10%`), load `[check]` from TOML, evaluate against reports.

Rules are evaluated on finished reports only; nothing here touches a dump or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mismatch_cli.errors import UsageError, suggest
from mismatch_cli.gate.noise import NoiseTest, magnitude_interval, min_difference_of
from mismatch_cli.gate.rules import RULE_GRAMMAR, RULE_HELP, Rule, parse_rule
from mismatch_cli.gate.scopes import (
    ALL_GROUPS,
    QUANTIFIERS,
    Entry,
    entries,
    listing,
    missing_scope,
    reduce,
    resolve_metric,
    scope_rows,
    scope_words,
)
from mismatch_cli.metrics import Direction, direction_of
from mismatch_cli.report import SCHEMA_VERSION, Report

MISSING_POLICIES = ("error", "warn", "skip")
STATUSES = ("pass", "fail", "held", "error", "warn", "skip")
VERL_PREFIX = "rollout_corr/"
@dataclass
class CheckConfig:
    """The `[check]` table: rules, an optional baseline and the missing-metric policy."""

    rules: list[Rule] = field(default_factory=list)
    baseline: str | None = None
    missing: str | None = None


def load_check_config(path: Path | None) -> CheckConfig:
    """Read `[check]` (or `[tool.mismatch.check]`) from a TOML file; no file means no rules."""
    if path is None:
        return CheckConfig()
    from mismatch_cli.gate.configfile import load_table

    table = load_table(path, "check")  # keys and types checked there
    if "fail_on" in table and "fail-on" in table:
        raise UsageError(f"{path}: [check] has both fail_on and fail-on", hint="merge them into one fail_on list")
    raw_rules = table.get("fail_on", table.get("fail-on", []))
    if isinstance(raw_rules, str):
        raw_rules = [raw_rules]
    baseline = table.get("baseline")
    if baseline is not None and not Path(baseline).is_absolute():
        baseline = str(Path(path).parent / baseline)  # relative to the config file, as pyproject tools do
    missing = table.get("missing")
    if missing is not None and missing not in MISSING_POLICIES:
        raise UsageError(f"{path}: [check] missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}",
                         hint='e.g. missing = "warn"')
    return CheckConfig([parse_rule(r, origin=str(path)) for r in raw_rules], baseline, missing)


# ----------------------------------------------------------------------------------------------- evaluation


@dataclass
class Outcome:
    """How one rule fared: `pass`, `fail`, `held`, `error` (could not be evaluated), `warn` or `skip` (per --missing).

    `held`: a relative rule whose limit the value is past, but by a change within noise (the two 95 % intervals
    overlap) or smaller than the metric's minimal practical difference; it does not fail the check.
    """

    rule: Rule
    status: str
    metric: str = ""  # the report key the rule was held to (rollout_corr/ added when the rule left it out)
    value: float | None = None
    baseline: float | None = None
    bound: float | None = None  # the limit the value was held to
    message: str = ""
    severity: float = 0.0  # how far past the bound, relative to its scale (orders breaches worst first)
    exit_code: int = 0  # for `error`: 2 (the rule is wrong for this data) or 3 (the data lacks a value)
    where: list[str] = field(default_factory=list)  # scoped rules: the steps / groups that breach (or hold the value)
    interval: list[float] | None = None  # relative rules: the value's 95 % interval (of |x| for abs())
    baseline_interval: list[float] | None = None
    min_difference: float | None = None  # relative rules: the smallest change that counts (None: any)
    warnings: list[str] = field(default_factory=list)  # e.g. a relative rule on a signed metric

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"rule": self.rule.text, "metric": self.metric or self.rule.metric, "status": self.status,
                "value": self.value, "baseline": self.baseline, "bound": self.bound, "message": self.message,
                "origin": self.rule.origin, "aggregate": self.rule.aggregate, "scope": self.rule.scope,
                "where": list(self.where), "interval": self.interval, "baseline_interval": self.baseline_interval,
                "min_difference": self.min_difference, "held_back": self.status == "held",
                "warnings": list(self.warnings)}


@dataclass
class CheckResult:
    """Every rule's outcome and the exit code they add up to."""

    outcomes: list[Outcome]

    @property
    def breaches(self) -> list[Outcome]:
        """Failed rules, worst first."""
        return sorted((o for o in self.outcomes if o.status == "fail"), key=lambda o: -o.severity)

    @property
    def exit_code(self) -> int:
        """1 on any breach (a breach wins over a data error), else 2 / 3 for rules that could not be evaluated."""
        if any(o.status == "fail" for o in self.outcomes):
            return 1
        codes = [o.exit_code for o in self.outcomes if o.status == "error"]
        return min(codes) if codes else 0

    def verdict(self) -> str:
        """One line: PASS, FAIL or ERROR, with counts and the worst breach."""
        counts = {s: sum(o.status == s for o in self.outcomes) for s in STATUSES}
        total = len(self.outcomes)
        words = {"warn": "warned", "held": "held back as noise"}
        tail = ", ".join(f"{n} {words.get(s, s)}" for s, n in counts.items() if n and s != "pass")
        warned = sum(bool(o.warnings) for o in self.outcomes)
        tail += (", " if tail and warned else "") + (f"{warned} with a warning" if warned else "")
        tail = f" ({tail})" if tail else ""
        if counts["fail"]:
            worst = self.breaches[0]
            return (f"mismatch check: FAIL - {counts['fail']} of {total} rule(s) breached{tail}; "
                    f"worst: {worst.message}")
        if counts["error"]:
            first = next(o for o in self.outcomes if o.status == "error")
            return f"mismatch check: ERROR - {counts['error']} of {total} rule(s) not evaluated{tail}; {first.message}"
        return f"mismatch check: PASS - {counts['pass'] + counts['held']} of {total} rule(s) passed{tail}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict(), "exit_code": self.exit_code,
                "rules": [o.to_dict() for o in self.outcomes]}


def _absent(metric: str, known: list[str]) -> str:
    """Why a rule's metric is not in the report: a typo (with the closest keys), or a key this run lacks."""
    from mismatch_cli.metrics import closest, lookup, resolve_name

    registered = resolve_name(metric)
    if registered is None:
        close = closest(metric, known)
        tail = suggest(close, "run `mismatch metrics` to list the metrics")
        return f"unknown metric {metric} (not a metric mismatch reports); {tail}"
    family = lookup(registered).family  # type: ignore[union-attr]
    return (f"{registered} is not in the input's report ({family.name} keys are reported {family.produced}); "
            "--missing warn or skip allows that")


def _missing(rule: Rule, policy: str, message: str, code: int) -> Outcome:
    return Outcome(rule, policy, rule.metric, message=message, exit_code=code if policy == "error" else 0)


def _bound(rule: Rule, base: float) -> tuple[float | None, float | None]:
    """(upper, lower) limits a relative rule puts on the candidate."""
    amount = abs(base) * rule.value / 100.0 if rule.percent else rule.value
    upper = base + amount if rule.op in ("+", "±") else None
    lower = base - amount if rule.op in ("-", "±") else None
    return upper, lower


def _judge(rule: Rule, metric: str, name: str, value: float, base: float | None,
           noise: NoiseTest | None = None) -> Outcome:
    """Hold one value (a metric, |metric| or an aggregate) to an absolute rule, or to a relative one vs `base`.

    With a `noise` test, a relative rule whose limit the value is past is `held` (not failed) when the change
    is within noise or below the minimal practical difference; the message says which, with the numbers.
    """
    if not rule.relative:
        limit = rule.value
        ok = _holds(rule.op, value, limit)
        scale = max(abs(limit), 1e-12)
        return Outcome(rule, "pass" if ok else "fail", metric, value=value, bound=limit,
                       severity=0.0 if ok else abs(value - limit) / scale,
                       message=f"{name} = {value:.6g} {'satisfies' if ok else 'breaches'} {rule.op} {limit:g}")
    assert base is not None
    upper, lower = _bound(rule, base)
    over = upper is not None and value > upper
    under = lower is not None and value < lower
    bound = upper if over or lower is None else lower
    scale = max(abs(bound - base), abs(base) * 1e-9, 1e-12)
    change = (value - base) / abs(base) * 100.0 if base else math.inf if value != base else 0.0
    change_text = f"{change:+.3g}%" if math.isfinite(change) else f"{value - base:+.3g}"
    allowed = rule.text.rsplit(":", 1)[1].strip()  # the scope's ':' comes before it
    head = f"{name} = {value:.6g} vs baseline {base:.6g} ({change_text})"
    held = noise.within_noise(base, value) if noise is not None and (over or under) else None
    if held is not None:
        outcome = Outcome(rule, "held", metric, value, base, bound,
                          message=f"{head} is past {allowed} (limit {bound:.6g}) but held back, {held}")
    elif over or under:
        severity = (value - upper) / scale if over else (lower - value) / scale  # type: ignore[operator]
        why = f"; beyond noise: {noise.beyond_noise(base, value)}" if noise is not None else ""
        outcome = Outcome(rule, "fail", metric, value, base, bound, severity=float(severity),
                          message=f"{head} breaches {allowed} (limit {bound:.6g}){why}")
    else:
        outcome = Outcome(rule, "pass", metric, value, base, bound, message=f"{head} within {allowed}")
    if noise is not None:
        outcome.interval, outcome.baseline_interval = noise.candidate_interval, noise.base_interval
        outcome.min_difference = noise.min_difference
    return outcome


def _noise_test(rule: Rule, metric: str, candidate: Report, baseline: Report, base: float) -> NoiseTest:
    """Both sides' 95 % intervals of the rule's value (of |x| for abs()) and the metric's minimal difference."""
    intervals = [report.intervals.get(metric) for report in (baseline, candidate)]
    if rule.magnitude:
        intervals = [magnitude_interval(interval) for interval in intervals]
    return NoiseTest(intervals[0], intervals[1], min_difference_of(metric, base))


def abs_form(rule: Rule) -> str:
    """The rule written on the metric's magnitude: `kl:+50%` -> `abs(kl):+50%`, `max(step:kl):+10%` -> ..."""
    inner = f"abs({rule.metric})"
    target = inner if rule.scope is None else f"{rule.aggregate}({rule.scope}:{inner})"
    return f"{target}:{rule.text.rsplit(':', 1)[1].strip()}"


def signed_warnings(rule: Rule, metric: str, base: float, value: float) -> list[str]:
    """A relative rule on a signed metric judges the signed value, blind to |x| growing the other way: say so."""
    if rule.magnitude or not rule.relative:
        return []
    signed = direction_of(metric) is Direction.LOWER_ABS
    if not signed and base >= 0 and value >= 0:
        return []
    why = "lower |x| is better" if signed else "it is negative here"
    growth = f", x{abs(value) / abs(base):.3g}" if base else ""
    return [f"{metric} is signed ({why}) and {rule.text} holds the signed value, so it cannot see the magnitude "
            f"grow the other way (here |value| went {abs(base):.3g} -> {abs(value):.3g}{growth}); "
            f"write {abs_form(rule)} to hold the magnitude"]


def _holds(op: str, value: float, limit: float) -> bool:
    return {"<=": value <= limit, ">=": value >= limit, "<": value < limit, ">": value > limit}[op]


def evaluate_rule(rule: Rule, candidate: Report, baseline: Report | None, missing: str = "error") -> Outcome:
    """Hold the candidate's value of one metric (or its aggregate over steps or groups) to one rule."""
    if rule.scope is not None:
        return _evaluate_scoped(rule, candidate, baseline, missing)
    metric = rule.metric
    if metric not in candidate.metrics and VERL_PREFIX + metric in candidate.metrics:
        metric = VERL_PREFIX + metric  # `kl<=0.01` means rollout_corr/kl
    if metric not in candidate.metrics:
        return _missing(rule, missing, _absent(metric, sorted(candidate.metrics)), 2)
    value = candidate.metrics[metric]
    if value is None or not math.isfinite(value):
        return _missing(rule, missing, f"{metric} is null in the input (undefined for this data)", 3)
    value = abs(value) if rule.magnitude else value
    name = f"|{metric}|" if rule.magnitude else metric
    if not rule.relative:
        return _judge(rule, metric, name, value, None)
    if baseline is None:  # callers refuse relative rules without a baseline up front
        return Outcome(rule, "error", metric, value=value, message=f"{rule.text} needs --baseline", exit_code=2)
    base = baseline.metrics.get(metric)
    if base is None or not math.isfinite(base):
        what = "has no" if metric not in baseline.metrics else "has a null"
        return _missing(rule, missing, f"the baseline {what} {metric}", 3)
    base_value = abs(base) if rule.magnitude else base
    outcome = _judge(rule, metric, name, value, base_value, _noise_test(rule, metric, candidate, baseline, base_value))
    outcome.warnings += signed_warnings(rule, metric, base, value)
    return outcome


def _evaluate_scoped(rule: Rule, candidate: Report, baseline: Report | None, missing: str) -> Outcome:
    """Hold an aggregate over the per-step / per-group table (or each of its entries) to one rule."""
    scope = rule.scope or ""
    rows = scope_rows(candidate, scope)
    if not rows:
        return _missing(rule, missing, missing_scope(candidate, scope), 2)
    key = resolve_metric(rule.metric, rows)
    if key is None:
        known = sorted({k for _, values in rows for k in values})
        return _missing(rule, missing, _absent(rule.metric, known) + f" (looked in the per-{scope} table)", 2)
    found = entries(rows, key, rule.magnitude)
    defined = [e for e in found if e.value is not None]
    if not defined:
        return _missing(rule, missing, f"{key} is null in all {scope_words(scope, len(found))}", 3)
    skipped = [e.label for e in found if e.value is None]
    left_out = f"{scope_words(scope, len(skipped))} with a null {key} left out ({', '.join(skipped[:5])}" + \
        (f" and {len(skipped) - 5} more)" if len(skipped) > 5 else ")")
    note = f"; {left_out}" if skipped else ""
    value_name = f"|{key}|" if rule.magnitude else key
    if rule.aggregate in QUANTIFIERS:
        outcome = _quantified(rule, key, value_name, defined)
    else:
        value, holder = reduce(rule.aggregate or "", defined)
        name = f"{rule.aggregate} over {scope_words(scope, len(defined))} of {value_name}"
        base = None
        if rule.relative:
            if baseline is None:
                return Outcome(rule, "error", key, value=value, message=f"{rule.text} needs --baseline",
                               exit_code=2)
            base_rows = scope_rows(baseline, scope)
            if not base_rows:  # no table at all, not a missing metric: say which --by the baseline lacks
                return _missing(rule, missing, missing_scope(baseline, scope).replace("the report", "the baseline", 1),
                                2)
            base_defined = [e for e in entries(base_rows, key, rule.magnitude) if e.value is not None]
            if not base_defined:
                return _missing(rule, missing, f"the baseline has no {key} in its per-{scope} table", 3)
            base = reduce(rule.aggregate or "", base_defined)[0]
        outcome = _judge(rule, key, name + (f" (at {holder.label})" if holder else ""), value, base)
        if base is not None:  # per-step / per-group tables carry no intervals: the value alone decides
            outcome.warnings += signed_warnings(rule, key, base, value)
        if holder is None:  # mean: name the entry that pulls it furthest the wrong way
            high = (value > outcome.bound if outcome.status == "fail" and outcome.bound is not None
                    else rule.op in ("<=", "<", "+", "±"))
            worst = max(defined, key=lambda e: e.value if high else -e.value)  # type: ignore[operator]
            outcome.message += f"; {'largest' if high else 'smallest'}: {worst.label} = {worst.value:.6g}"
        outcome.where = [holder.label if holder else worst.label]
    outcome.message += note
    if skipped:  # said in every format: a step with no valid token must not pass the rule unseen
        outcome.warnings.append(left_out)
    return outcome


def _quantified(rule: Rule, key: str, name: str, defined: list[Entry]) -> Outcome:
    """every(...): each entry satisfies the bound; any(...): at least one does. Names the entries that decide."""
    limit, scope = rule.value, rule.scope or ""
    sign = 1.0 if rule.op in ("<=", "<") else -1.0  # sign * value grows as an entry moves past the bound
    holding = [e for e in defined if _holds(rule.op, e.value, limit)]  # type: ignore[arg-type]
    breaking = [e for e in defined if not _holds(rule.op, e.value, limit)]  # type: ignore[arg-type]
    scale = max(abs(limit), 1e-12)
    total = scope_words(scope, len(defined))
    if rule.aggregate == "every":
        if not breaking:
            edge = max(defined, key=lambda e: sign * e.value)  # type: ignore[operator]
            return Outcome(rule, "pass", key, edge.value, bound=limit, where=[edge.label],
                           message=f"{name} satisfies {rule.op} {limit:g} in all {total} (closest: {edge.label} = "
                           f"{edge.value:.6g})")
        breaking.sort(key=lambda e: -sign * e.value)  # type: ignore[operator]
        worst = breaking[0]
        return Outcome(rule, "fail", key, worst.value, bound=limit, where=[e.label for e in breaking],
                       severity=abs(worst.value - limit) / scale,  # type: ignore[operator]
                       message=f"{name} breaches {rule.op} {limit:g} in {len(breaking)} of {total}: "
                       f"{listing(breaking)}")
    if holding:
        holding.sort(key=lambda e: sign * e.value)  # type: ignore[operator]  # furthest inside the bound first
        return Outcome(rule, "pass", key, holding[0].value, bound=limit, where=[e.label for e in holding],
                       message=f"{name} satisfies {rule.op} {limit:g} in {len(holding)} of {total}: "
                       f"{listing(holding)}")
    closest = min(defined, key=lambda e: sign * e.value)  # type: ignore[operator]
    return Outcome(rule, "fail", key, closest.value, bound=limit, where=[closest.label],
                   severity=abs(closest.value - limit) / scale,  # type: ignore[operator]
                   message=f"{name} breaches {rule.op} {limit:g} in all {total}; closest: {closest.label} = "
                   f"{closest.value:.6g}")


def evaluate(rules: list[Rule], candidate: Report, baseline: Report | None, missing: str = "error") -> CheckResult:
    """Evaluate every rule against the candidate (and the baseline for relative rules)."""
    return CheckResult([evaluate_rule(rule, candidate, baseline, missing) for rule in rules])


def grouping_for(rules: list[Rule]) -> tuple[bool, tuple[str, ...]]:
    """(by_step, group_by) an analysis needs for rules over steps or `--by` columns (`group` names no column)."""
    scopes = [r.scope for r in rules if r.scope is not None]
    columns = tuple(dict.fromkeys(s for s in scopes if s not in ("step", ALL_GROUPS)))
    return "step" in scopes, columns


def require_baseline(rules: list[Rule], baseline: str | None) -> None:
    """Refuse relative rules when no baseline is given (exit 2, before any input is read)."""
    relative = [r.text for r in rules if r.relative]
    if relative and baseline is None:
        raise UsageError(f"relative rule(s) {', '.join(relative)} need a baseline",
                         hint="pass --baseline REPORT (or baseline = \"...\" in [check])")


__all__ = [
    "MISSING_POLICIES",
    "RULE_GRAMMAR",
    "RULE_HELP",
    "CheckConfig",
    "CheckResult",
    "Outcome",
    "Rule",
    "abs_form",
    "evaluate",
    "evaluate_rule",
    "grouping_for",
    "load_check_config",
    "parse_rule",
    "require_baseline",
    "signed_warnings",
]
