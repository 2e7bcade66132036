"""The rule grammar of `check` / `compare`: `abs(kl)<=0.01`, `chi2_token:+10%`, `max(step:abs(kl))<=1e-3`.

Parsing only (no report, no evaluation): thresholds.py holds rules to reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mismatch_cli.errors import UsageError
from mismatch_cli.gate.scopes import AGGREGATES, QUANTIFIERS, scope_words
from mismatch_cli.system.numbers import NUMBER_LITERAL, parse_number

_NUMBER = NUMBER_LITERAL.pattern
_UNSIGNED = _NUMBER.removeprefix("[+-]?")
# The rule grammar, in one place: a TARGET, then an absolute bound or a change relative to the baseline.
# TARGET is METRIC, abs(METRIC), or AGG(SCOPE:METRIC) / AGG(SCOPE:abs(METRIC)) over the per-step or per-group table.
_ABSOLUTE = re.compile(rf"^\s*(?P<target>.+?)\s*(?P<op><=|>=|<|>)\s*(?P<value>{_NUMBER})\s*$")
_RELATIVE = re.compile(
    rf"^\s*(?P<target>.+?)\s*:\s*(?P<sign>\+/-|\+-|±|\+|-)\s*(?P<value>{_UNSIGNED})\s*(?P<pct>%)?\s*$"
)
_NAME = r"[^\s<>=:()]+"
_PLAIN = re.compile(rf"^(?:abs\(\s*(?P<abs_metric>{_NAME})\s*\)|(?P<metric>{_NAME}))$")
_SCOPED = re.compile(rf"^(?P<agg>\w+)\(\s*(?P<scope>{_NAME})\s*:\s*(?P<value>.+?)\s*\)$")
_UNSCOPED = re.compile(rf"^(?P<agg>\w+)\(\s*(?P<value>abs\(\s*{_NAME}\s*\)|{_NAME})\s*\)$")
_SCOPE_OUTSIDE = re.compile(rf"^(?P<scope>{_NAME})\s*:\s*(?P<agg>\w+)\((?P<value>.*)\)$")
RULE_GRAMMAR = (
    "METRIC<=X, METRIC>=X, METRIC<X, METRIC>X (absolute), or METRIC:+N% / METRIC:-N% / METRIC:±N% "
    "(relative to the baseline; without % the change is absolute); abs(METRIC) holds the magnitude; "
    "AGG(SCOPE:METRIC) holds the max, min or mean over steps or groups, every(...) / any(...) each of them "
    "(SCOPE: step, group or a --by column), e.g. rollout_corr/kl<=0.01, abs(kl)<=0.01, "
    "rollout_corr/chi2_token:+10%, max(step:abs(kl))<=1e-3, every(group:chi2_token)<=1"
)
RULE_HELP = ("A limit: METRIC<=X, >=, <, > or METRIC:+N% / :-N% / :±N% relative to the baseline; abs(METRIC) "
             "for its magnitude; max|min|mean|every|any(SCOPE:METRIC) over the per-step or per-group table "
             "(SCOPE: step, group, or a --by column), e.g. 'abs(kl)<=0.01', 'max(step:abs(kl))<=1e-3'. "
             "Repeatable; adds to the [check] table of --config.")
_AGGREGATE_HINT = ("write AGG(SCOPE:METRIC) with AGG one of max, min, mean, every, any and SCOPE step, group or a "
                   "--by column, e.g. max(step:abs(kl))<=1e-3")


@dataclass(frozen=True)
class Rule:
    """One limit on one metric: absolute (`op` is <=, >=, < or >) or relative to a baseline (`op` is +, - or ±).

    With a `scope` the rule reads the metric from every entry of the per-step (`step`) or per-group
    (`group`, or one `--by` column) table and holds their `aggregate` (max, min, mean) to the limit, or
    (every, any) holds each entry to it.
    """

    text: str
    metric: str
    op: str
    value: float
    percent: bool = False
    origin: str = "--fail-on"
    magnitude: bool = False  # abs(METRIC): the rule holds |value| (and |baseline|)
    aggregate: str | None = None  # max, min, mean, every or any over the scope's entries
    scope: str | None = None  # step, group, or a --by column

    @property
    def relative(self) -> bool:
        """Whether the rule needs a baseline."""
        return self.op in ("+", "-", "±")

    @property
    def subject(self) -> str:
        """What the rule holds: the metric, |metric|, or their aggregate over a scope."""
        value = f"|{self.metric}|" if self.magnitude else self.metric
        if self.scope is None:
            return value
        if self.aggregate in QUANTIFIERS:
            return f"{value} of {self.aggregate} {scope_words(self.scope)[:-1]}"
        return f"{self.aggregate} over {scope_words(self.scope)} of {value}"

    def describe(self) -> str:
        """The rule in words."""
        if not self.relative:
            return f"{self.subject} {self.op} {self.value:g}"
        amount = f"{self.value:g}%" if self.percent else f"{self.value:g}"
        verb = {"+": "may grow by at most", "-": "may drop by at most", "±": "may change by at most"}[self.op]
        return f"{self.subject} {verb} {amount} vs baseline"


def _bad(text: str, origin: str, problem: str, hint: str) -> UsageError:
    return UsageError(f"{origin}: rule '{text.strip()}': {problem}", hint=hint)


def _target(target: str, text: str, origin: str) -> tuple[str, bool, str | None, str | None]:
    """(metric, magnitude, aggregate, scope) of a rule's left side; a malformed one is a usage error naming it."""
    plain = _PLAIN.match(target)
    if plain:
        return plain["metric"] or plain["abs_metric"], plain["abs_metric"] is not None, None, None
    scoped = _SCOPED.match(target)
    if scoped and scoped["agg"] != "abs":
        if scoped["agg"] not in AGGREGATES:
            raise _bad(text, origin, f"unknown aggregate '{scoped['agg']}'", _AGGREGATE_HINT)
        inner = _PLAIN.match(scoped["value"])
        if inner is None:
            raise _bad(text, origin, f"'{scoped['value']}' is not METRIC or abs(METRIC)", _AGGREGATE_HINT)
        return (inner["metric"] or inner["abs_metric"], inner["abs_metric"] is not None, scoped["agg"],
                scoped["scope"])
    unscoped = _UNSCOPED.match(target)
    if unscoped and unscoped["agg"] in AGGREGATES:
        agg, value = unscoped["agg"], unscoped["value"]
        raise _bad(text, origin, f"{agg}() needs a scope", f"write {agg}(step:{value}) over steps, "
                   f"{agg}(group:{value}) over every --by group, or {agg}(COLUMN:{value}) over one --by column")
    outside = _SCOPE_OUTSIDE.match(target)
    if outside and outside["agg"] in AGGREGATES:
        raise _bad(text, origin, "the scope goes inside the aggregate",
                   f"write {outside['agg']}({outside['scope']}:{outside['value']})")
    if target.startswith("abs(") and any(target[4:].lstrip().startswith(a + "(") for a in AGGREGATES):
        raise _bad(text, origin, "abs() goes around the metric, inside the aggregate",
                   "write e.g. max(step:abs(kl))<=1e-3")
    raise UsageError(f"{origin}: cannot parse rule '{text}'", hint=f"write {RULE_GRAMMAR}")


def parse_rule(text: str, origin: str = "--fail-on") -> Rule:
    """Parse one rule; a malformed rule is a usage error (exit 2) naming the rule and the fix."""
    what = f"{origin}: the limit of rule '{text.strip()}'"
    match = _ABSOLUTE.match(text)
    if match:
        metric, magnitude, aggregate, scope = _target(match["target"], text, origin)
        value = parse_number(match["value"], what, hint=f"write {RULE_GRAMMAR}")
        return Rule(text.strip(), metric, match["op"], value, origin=origin, magnitude=magnitude,
                    aggregate=aggregate, scope=scope)
    match = _RELATIVE.match(text)
    if match:
        metric, magnitude, aggregate, scope = _target(match["target"], text, origin)
        if aggregate in QUANTIFIERS:
            raise _bad(text, origin, f"{aggregate}() holds each entry to a bound, not to a change vs baseline",
                       f"write {aggregate}({scope}:...)<=X, or max/min/mean({scope}:...):+N% for a change")
        sign = "±" if match["sign"] in ("+/-", "+-", "±") else match["sign"]
        value = parse_number(match["value"], what, hint=f"write {RULE_GRAMMAR}")
        return Rule(text.strip(), metric, sign, value, percent=match["pct"] is not None, origin=origin,
                    magnitude=magnitude, aggregate=aggregate, scope=scope)
    raise UsageError(f"{origin}: cannot parse rule '{text}'", hint=f"write {RULE_GRAMMAR}")


__all__ = ["RULE_GRAMMAR", "RULE_HELP", "Rule", "parse_rule"]
