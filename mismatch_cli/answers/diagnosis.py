"""The answer a report leads with: a bug in the dump or config, then a correction that drops too much, then a
precision gap, then a correction.

`diagnose` reads the health summary, the recommendation and the findings (no torch, no I/O) and returns
them with `summary["diagnosis"]` set, and, when a bug explains the mismatch, the verdict `bug` and a
recommendation that fixes the bug instead of correcting it: no importance weight cures log-probs that are
not the engine's (docs/report.md, "A bug first, a correction second"). Every fix is said in the report's trainer
(answers/advice.py): `recommendation["fixes"]` holds them in order, each with its settings' upstream sources.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mismatch_cli.answers.advice import fix_entry, fix_text
from mismatch_cli.answers.findings.degenerate import CODE as DEGENERATE
from mismatch_cli.answers.findings.drops import CODE as DROPS
from mismatch_cli.answers.health import MULT_PROB_ERROR, PROB_DIFF, RATIO_MEAN, band_of

# Bug findings, the one that explains the rest first: identical sides leave nothing to measure, a fill or a
# shift makes the other signatures meaningless, processed log-probs and a temperature are config bugs.
BUG_CODES = ("identical_sides", "mask_covers_prompt", "constant_fill", "shifted_streams", "processed_logprobs",
             "logit_processor", "temperature_mismatch")
PRECISION_CHECKS = (PROB_DIFF, MULT_PROB_ERROR)
PRECISION_FIX = ("compute the engine's lm_head / logits in fp32 and match the trainer's kernels (cascade attention "
                 "off, deterministic kernels), or run both sides in one precision")
# Without a policy version per sample, a gap from weights older than the trainer's looks like precision noise.
TELL_APART = ("weights older than the trainer's look the same in log-probs; to tell them apart, analyze a step "
              "dumped right after a weight sync, or stamp each sample's policy version (a policy_version column): "
              "precision stays at lag 0, staleness grows with the lag")
LAG_REASON = ("the raw ratios' checks are in band, so the weights need no correction yet; a lag is a real "
              "off-policy gap, which an importance-sampling correction answers once the checks leave their bands")
RATIO_FIX = (
    "check what the engine reports as the rollout log-prob: it must be the log-prob of the distribution the "
    "token was sampled from (after temperature, before any renormalization), aligned with the trainer's tokens")


def _failing(checks: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[Mapping[str, Any]]:
    return [c for c in checks if c["metric"] in keys and not c["ok"]]


def _value(check: Mapping[str, Any]) -> str:
    value = check["value"]
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def diagnose(summary: dict[str, Any], recommendation: dict[str, Any] | None, findings: Sequence[Mapping[str, Any]],
             config: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The summary with its diagnosis, and the recommendation with the fixes a bug, a correction that drops too
    much or a precision gap needs first, in the report's trainer."""
    config = config or {}
    agreement = (summary.get("agreement") or {}).get("checks", [])
    bugs = sorted((f for f in findings if f.get("code") in BUG_CODES and f.get("fix")),
                  key=lambda f: BUG_CODES.index(f["code"]))
    ratio = _failing(agreement, (RATIO_MEAN,))
    precision = _failing(agreement, PRECISION_CHECKS)
    precision = [c for c in precision if not c.get("few_tokens")]  # a few tokens: the correction's business
    summary = dict(summary)
    if bugs or ratio:
        bug = bugs[0] if bugs else None
        code = bug["code"] if bug else "ratio_mean"
        title = bug["title"] if bug else (f"the token ratio mean is {_value(ratio[0])}, not 1: the rollout side is "
                                          "not the distribution its tokens were sampled from")
        fix = bug["fix"] if bug else fix_text(RATIO_FIX, "ratio_mean", config)
        entry = fix_entry(code, fix, config, bug.get("evidence") if bug else None)
        summary.update(status="bug", diagnosis={"kind": "bug", "code": code, "title": title, "fix": fix})
        if recommendation is not None or bug is not None:
            base = dict(recommendation or {})
            base.update(scenario=None, flags=None, fields=None, native=None, preset=None, cost=None,
                        health_after=None, alternatives=[], best_partial=None, recipe=None, fix=entry, fixes=[entry],
                        reason=f"fix the bug first ({title}); a correction reweights real log-probs and cannot "
                               "repair these, so no correction is recommended until the dump is right")
            recommendation = base
        return summary, recommendation
    fixes, diagnosis = [], None
    for code in (DEGENERATE, DROPS):  # the run's own correction: degenerate first, then one that drops too much
        for finding in (f for f in findings if f.get("code") == code):
            fixes.append(fix_entry(code, finding["fix"], config, title=finding["title"]))
            diagnosis = diagnosis or {"kind": "correction", "code": code, "title": finding["title"],
                                      "fix": finding["fix"]}
    if diagnosis is not None and summary.get("status") == "healthy":
        summary["status"] = "warning"  # a correction that means something else, or drops the batch, is not healthy
    if precision:
        found, more = _precision_or_lag(precision, findings, config)
        fixes += found
        diagnosis = diagnosis or more
    if diagnosis is None:
        kind = "healthy" if summary.get("status") == "healthy" else "correctable"
        diagnosis = {"kind": kind, "code": None, "title": None, "fix": None}
    summary["diagnosis"] = diagnosis
    if recommendation is not None:
        recommendation = {**recommendation, "fix": fixes[0] if fixes else None, "fixes": fixes}
        if not precision or diagnosis.get("kind") == "lag":  # the low-precision recipe answers precision only
            recommendation["recipe"] = None
        if diagnosis.get("kind") == "lag" and not recommendation.get("scenario"):
            recommendation["reason"] = LAG_REASON
    return summary, recommendation


def _precision_or_lag(precision: Sequence[Mapping[str, Any]], findings: Sequence[Mapping[str, Any]],
                      config: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fixes and diagnosis of failing log-prob checks: a policy lag when the gap grows with the dump's policy
    versions, precision when it does not, and otherwise both, with the measurement that tells them apart."""
    names = ", ".join(f"{c['label']} {_value(c)} (healthy: {c['healthy_range']})" for c in precision)
    title = f"the engines' log-probs disagree beyond the documented band: {names}"
    lag = next((f for f in findings if f.get("code") == "policy_lag"), None)
    flat = next((f for f in findings if f.get("code") == "lag_ruled_out"), None)
    source = fix_text(PRECISION_FIX, "precision_gap", config)
    if lag is not None:
        text = lag["fix"]  # in the trainer's words already (findings.find)
        fixes = [fix_entry("policy_lag", text, config, lag.get("evidence"), title=lag["title"])]
        fresh = lag["evidence"]["lags"][0]["prob_abs_diff_mean"]
        if not band_of(PROB_DIFF).healthy(fresh):  # the freshest rows are out of band on their own
            fixes.append(fix_entry("precision_gap", source, config))
        return fixes, {"kind": "lag", "code": "policy_lag", "title": lag["title"], "fix": text}
    fixes = [fix_entry("precision_gap", source, config)]
    if flat is not None:
        title += f"; not the policy lag ({flat['title'].split(': ', 1)[1]})"
    else:
        title += "; a precision gap or a policy lag, which log-probs alone cannot tell apart"
        fixes.append(fix_entry("lag_or_precision", fix_text(TELL_APART, "lag_or_precision", config), config))
    return fixes, {"kind": "precision", "code": "precision_gap", "title": title, "fix": source}


__all__ = ["BUG_CODES", "diagnose"]
