"""Values only a bug allows: compare never calls one better or best, and check never lets a rule pass on one.

The rollout log-probs are the sampler's own, so for any correct pair of log-prob streams E_rollout[ratio] = 1
(ratio = pi_train / pi_rollout), hence χ² = E[ratio²] − 1 = Var(ratio) >= 0. Three things break that identity
and only a bug in the dump or its config can: a run whose own report says BUG (every value of it), a χ² below
0 beyond noise, a token ratio mean below 1 beyond noise (the report's own ratio-mean test). A top-p bug
(rollout log-probs renormalized over the nucleus) gives all three: χ² −0.14, which looks "better" than any
clean run's, and a ratio mean 0.926.

compare marks a change `B` where a bug's value would make it look better (never where it looks worse: a bug
that makes a run worse is still worse), and a run with one is never best; check fails a rule that passes on
a χ² or ratio mean only a bug allows, and warns on every other rule that passes on a BUG run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mismatch_cli.gate.thresholds import CheckResult
from mismatch_cli.metrics.catalog import ratio_mean_broken, ratio_mean_z
from mismatch_cli.report import Report

BUG = "B"
BUG_WHY = ("its run's report says BUG, or it is a χ² below 0 or a token ratio mean below 1 beyond noise, which no "
           "correct pair of log-prob streams gives: E_rollout[ratio] = 1 makes χ² = E[ratio²] − 1 >= 0")
BUG_LEGEND = f"looks better only because of a bug's value ({BUG_WHY}): neither better nor worse"
RATIO_MEAN, RATIO_MEAN_SE = "diag/ratio_mean", "diag/ratio_mean_se"
CHI2_SUFFIXES = ("chi2_token", "chi2_seq")  # verl's, slime's and ms-swift's χ² keys end so
BUG_PASS = "only on a bug's value"  # in the message of a rule failed for passing on one (render/compare reads it)


def bug_title(report: Report) -> str | None:
    """The title of the report's own BUG diagnosis, or None when its verdict is not BUG."""
    if report.summary.get("status") != "bug":
        return None
    diagnosis = report.summary.get("diagnosis") or {}
    return str(diagnosis.get("title") or diagnosis.get("code") or "its report's verdict is BUG")


def _finite(report: Report, key: str) -> float | None:
    value = report.metrics.get(key)
    return value if value is not None and math.isfinite(value) else None


def _ratio_mean_low(report: Report) -> bool | None:
    """Whether the token ratio mean is below 1 beyond noise (the report's own test); None without one."""
    mean = _finite(report, RATIO_MEAN)
    if mean is None:
        return None
    return mean < 1.0 and ratio_mean_broken(mean, _finite(report, RATIO_MEAN_SE))


def impossible_value(report: Report, metric: str) -> str | None:
    """Why the report's value of `metric` is one no correct pair of log-prob streams gives, or None."""
    value = _finite(report, metric)
    if value is None:
        return None
    if metric.rsplit("/", 1)[-1].endswith(CHI2_SUFFIXES) and value < 0:
        interval = report.intervals.get(metric)
        if interval:
            return f"χ² below 0 beyond its 95 % interval (upper end {interval[1]:.3g})" if interval[1] < 0 else None
        # Without an interval a χ² just below 0 is sampling noise (the fp32 arm's chi2_seq is −1.2e-6):
        # the ratio-mean test, whose standard error every report carries, tells noise from the bug.
        low = _ratio_mean_low(report)
        if low is None:
            return "χ² below 0 (no interval to tell noise)"
        return "χ² below 0 while the token ratio mean is below 1 beyond noise" if low else None
    if metric == RATIO_MEAN and _ratio_mean_low(report):
        error = _finite(report, RATIO_MEAN_SE)
        return f"token ratio mean below 1 by {ratio_mean_z(value, error):.3g} standard errors"
    return None


def bug_value_reason(report: Report, metric: str) -> str | None:
    """Why the report's value of `metric` is a bug's (impossible, or of a run whose report says BUG), or None."""
    title = bug_title(report)
    reasons = [impossible_value(report, metric), None if title is None else f"the run's report says BUG: {title}"]
    return "; ".join(reason for reason in reasons if reason) or None


def bug_clause(who: str, title: str | None, reasons: Mapping[str, str]) -> str | None:
    """`WHO has a bug in its dump or config: …`, naming its BUG title or else its bug values; None without either."""
    if title is None and not reasons:
        return None
    values = ", ".join(f"{metric.removeprefix('rollout_corr/')} ({why})" for metric, why in reasons.items())
    return f"{who} has a bug in its dump or config: {title or values}"


def fail_bug_passes(result: CheckResult, candidate: Report, baseline: Report | None = None) -> None:
    """Fail each rule that passed (or was held back) on a value only a bug allows, saying why; warn on every other
    rule that passed on a BUG run, and on a relative rule whose baseline value is a bug's."""
    title = bug_title(candidate)
    for outcome in result.outcomes:
        metric = outcome.metric or outcome.rule.metric
        passed = outcome.status in ("pass", "held")
        # A per-step / per-group value is not the overall one: only the run's own BUG verdict speaks for it.
        if passed and outcome.rule.scope is None and impossible_value(candidate, metric) is not None:
            outcome.status = "fail"
            outcome.severity = math.inf  # the verdict names this breach first
            outcome.message = (f"{outcome.message}; that passes {BUG_PASS} ({bug_value_reason(candidate, metric)}): "
                               "fix the dump or its config before trusting this limit")
        elif passed and title is not None:
            outcome.warnings.append(f"the run's report says BUG ({title}): this value may be the bug's, not the "
                                    "engines' drift")
        base_reason = None if baseline is None or outcome.baseline is None else bug_value_reason(baseline, metric)
        if base_reason is not None:
            outcome.warnings.append(f"the baseline's {metric} is a bug's value ({base_reason}); a limit relative "
                                    "to it says little: make the baseline from a clean run")


__all__ = ["BUG", "BUG_LEGEND", "BUG_PASS", "BUG_WHY", "bug_clause", "bug_title", "bug_value_reason",
           "fail_bug_passes", "impossible_value"]
