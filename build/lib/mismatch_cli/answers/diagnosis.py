"""The answer a report leads with: a bug in the dump or config, then a precision gap, then a correction.

`diagnose` reads the health summary, the recommendation and the findings (no torch, no I/O) and returns
them with `summary["diagnosis"]` set, and, when a bug explains the mismatch, the verdict `bug` and a
recommendation that fixes the bug instead of correcting it: no importance weight cures log-probs that are
not the engine's (docs/report.md, "A bug first, a correction second").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mismatch_cli.answers.health import MULT_PROB_ERROR, PROB_DIFF, RATIO_MEAN

# Bug findings, the one that explains the rest first: identical sides leave nothing to measure, a fill or a
# shift makes the other signatures meaningless, processed log-probs and a temperature are config bugs.
BUG_CODES = ("identical_sides", "constant_fill", "shifted_streams", "processed_logprobs", "temperature_mismatch")
PRECISION_CHECKS = (PROB_DIFF, MULT_PROB_ERROR)
PRECISION_FIX = (
    "compute the engine's lm_head / logits in fp32 and match the trainer's kernels (verl FAQ: actor_rollout_ref."
    "rollout.engine_kwargs.vllm.disable_cascade_attn=True), or run both sides in one precision")
RATIO_FIX = (
    "check what the engine reports as the rollout log-prob: it must be the log-prob of the distribution the "
    "token was sampled from (after temperature, before any renormalization), aligned with the trainer's tokens")


def _failing(checks: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[Mapping[str, Any]]:
    return [c for c in checks if c["metric"] in keys and not c["ok"]]


def _value(check: Mapping[str, Any]) -> str:
    value = check["value"]
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def diagnose(summary: dict[str, Any], recommendation: dict[str, Any] | None,
             findings: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The summary with its diagnosis, and the recommendation with the fix a bug or a precision gap needs first."""
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
        fix = bug["fix"] if bug else RATIO_FIX
        summary.update(status="bug", diagnosis={"kind": "bug", "code": code, "title": title, "fix": fix})
        if recommendation is not None or bug is not None:
            base = dict(recommendation or {})
            base.update(scenario=None, flags=None, fields=None, preset=None, cost=None, health_after=None,
                        alternatives=[], best_partial=None, fix={"code": code, "text": fix},
                        reason=f"fix the bug first ({title}); a correction reweights real log-probs and cannot "
                               "repair these, so no correction is recommended until the dump is right")
            recommendation = base
        return summary, recommendation
    if precision:
        names = ", ".join(f"{c['label']} {_value(c)} (healthy: {c['healthy_range']})" for c in precision)
        summary["diagnosis"] = {"kind": "precision", "code": "precision_gap",
                                "title": f"the engines' log-probs disagree beyond the documented band: {names}",
                                "fix": PRECISION_FIX}
        if recommendation is not None:
            recommendation = {**recommendation, "fix": {"code": "precision_gap", "text": PRECISION_FIX}}
        return summary, recommendation
    kind = "healthy" if summary.get("status") == "healthy" else "correctable"
    summary["diagnosis"] = {"kind": kind, "code": None, "title": None, "fix": None}
    return summary, recommendation


__all__ = ["BUG_CODES", "diagnose"]
