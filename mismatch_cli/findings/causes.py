"""Causes of a failing health check: how much of the metric comes from how few tokens, and where they are.

concentrated_divergence fires when a check that the token ratio's second moment decides fails (chi2_token,
the ESS of the raw ratios or of the IS weights, the IS weight std: ESS = 1 / (1 + chi2) for the raw ratios)
and the chi2_token excess (sum of ratio^2 - 1) is concentrated: the fewest top-|d| buckets that carry 90 % of
it hold at most 1 % of the valid tokens. Spread evenly, 1 % of the tokens would carry about 1 % of it.
NeMo-RL's token_mult_prob_error (the token-mean of exp|d|) is judged the same way on its own excess,
the sum of exp|d| - 1, which one token with an overflowing |d| carries whole.
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.findings.model import Finding, percent

SECOND_MOMENT_CHECKS = ("chi2_token", "ess_token", "eff_sample_size", "rollout_is_std")
MULT_CHECK = "token_mult_prob_error"
# The per-|d|-octave sum each failing check's excess is read from: (bucket field, what it is the excess of).
EXCESS_OF = {"chi2": ("chi2_terms", "χ²_token"), "mult": ("exp_abs_sum", "token_mult_prob_error − 1")}
CARRIED_SHARE = 0.9
MAX_TOKEN_SHARE = 0.01
ROUND_SHARE = 0.1  # rounds named: those carrying at least this share of the excess


def concentration(table: dict[str, Any], basis: str = "chi2") -> dict[str, Any] | None:
    """The highest |d| edge whose tokens at or above it carry CARRIED_SHARE of the basis' excess, with counts."""
    field = EXCESS_OF[basis][0]
    buckets = [b for b in table.get("buckets") or [] if field in b]
    n = table.get("tokens") or 0
    if not buckets or n == 0:
        return None
    overflow = [b for b in buckets if not math.isfinite(b[field])]
    if overflow:  # exp|d| overflowed: those tokens carry the whole (infinite) excess
        count = sum(b["tokens"] for b in overflow)
        return {"abs_log_ratio_at_least": overflow[0]["low"], "tokens": int(count), "token_fraction": count / n,
                "share": 1.0, "excess_per_token": math.inf}
    total = sum(b[field] - b["tokens"] for b in buckets)
    if not total > 0:
        return None
    tokens = excess = 0.0
    for bucket in reversed(buckets):
        tokens += bucket["tokens"]
        excess += bucket[field] - bucket["tokens"]
        if excess >= CARRIED_SHARE * total:
            return {"abs_log_ratio_at_least": bucket["low"], "tokens": int(tokens), "token_fraction": tokens / n,
                    "share": excess / total, "excess_per_token": total / n}
    return None


def few_tokens(table: dict[str, Any]) -> dict[str, int]:
    """token_mult_prob_error → how many tokens carry its excess, when they are at most MAX_TOKEN_SHARE of them."""
    found = concentration(table, "mult") if table else None
    if found is None or found["token_fraction"] > MAX_TOKEN_SHARE:
        return {}
    return {"diag/" + MULT_CHECK: found["tokens"]}


def _failing(summary: dict[str, Any], ends: tuple[str, ...]) -> list[str]:
    return [c["metric"] for c in summary.get("checks", []) if not c.get("ok", True) and c["metric"].endswith(ends)]


def _places(report: Any, edge: float, total_excess: float) -> dict[str, Any]:
    """Rows, steps and rounds that hold the tokens with |d| >= edge (from the report's tables)."""
    rows = [{"file": e["file"], "row": e["row"], "step": e.get("step"), "max_abs_log_ratio": e["max_abs_log_ratio"]}
            for e in report.worst_sequences
            if e.get("criterion") == "max_abs_log_ratio" and e["max_abs_log_ratio"] >= edge]
    steps = [s["step"] for s in report.steps if (s["metrics"].get("diag/logprob_abs_diff_max") or 0) >= edge]
    rounds = []
    for entry in report.rounds:
        chi2, tokens = entry.get("chi2_token"), entry.get("tokens") or 0
        if chi2 is not None and total_excess > 0 and chi2 * tokens >= ROUND_SHARE * total_excess:
            rounds.append(entry["round"])
    return {"rows": rows, "steps": steps, "rounds": rounds}


def _explanation(worst: dict[str, Any] | None, findings: list[Finding]) -> str | None:
    """A data-quality reason for the worst token, if there is one."""
    if any(f.code in ("constant_fill", "shifted_streams") for f in findings):
        return next(f.code for f in findings if f.code in ("constant_fill", "shifted_streams"))
    if worst is None:
        return None
    old, rollout = worst["old_log_prob"], worst["rollout_log_prob"]
    if (old == 0) != (rollout == 0):
        return "one_side_zero"
    if old > 0 or rollout > 0:
        return "positive_logprob"
    return None


def concentrated_divergence(report: Any, table: dict[str, Any], findings: list[Finding]) -> list[Finding]:
    """The failing second-moment checks, when a few tokens carry them: how few, how much, and where."""
    failing = _failing(report.summary, SECOND_MOMENT_CHECKS)
    mult = _failing(report.summary, (MULT_CHECK,))
    by_basis = {basis: concentration(table, basis) for basis, checks in (("chi2", failing), ("mult", mult)) if checks}
    concentrated = {b: f for b, f in by_basis.items() if f is not None and f["token_fraction"] <= MAX_TOKEN_SHARE}
    if not concentrated:
        return []
    basis = "chi2" if "chi2" in concentrated else "mult"
    found, name = concentrated[basis], EXCESS_OF[basis][1]
    failing = [*(failing if "chi2" in concentrated else []), *(mult if "mult" in concentrated else [])]
    edge, count = found["abs_log_ratio_at_least"], found["tokens"]
    worst = table.get("worst_token")
    places = _places(report, edge, found["excess_per_token"] * table["tokens"] if basis == "chi2" else 0.0)
    reason = _explanation(worst, findings)
    noun = "token" if count == 1 else "tokens"
    verb = "carries" if count == 1 else "carry"
    title = (f"{count} {noun} ({percent(found['token_fraction'])}) with |Δ| ≥ {edge:g} {verb} "
             f"{percent(found['share'])} of {name}")
    named = {"chi2_share": found["share"], "chi2_token": found["excess_per_token"]} if basis == "chi2" else {}
    evidence: dict[str, Any] = {**found, **named, "basis": name, "failing_checks": failing, **places,
                                "worst_token": worst,
                                "explained_by": reason}
    where = ""
    if worst is not None:
        parts = [f"round {worst['round']}"] if worst.get("round") is not None else []
        parts += [f"step {worst['step']}"] if worst.get("step") is not None else []
        parts.append(f"|Δ| {worst['abs_log_ratio']:.3g}: old {worst['old_log_prob']:.4g}, rollout "
                     f"{worst['rollout_log_prob']:.4g}")
        where = f"; the worst is {worst['file']}:{worst['row']}:{worst['position']} ({', '.join(parts)})"
    because = f"explained by {reason}" if reason else "not explained by any data-quality finding"
    detail = (f"{count} of {table['tokens']} valid tokens {verb} "
              f"{percent(found['share'])} of {name} = {found['excess_per_token']:.3g}, failing "
              f"{', '.join(failing)}{where}; {because}.")
    return [Finding("concentrated_divergence", "warning", title, evidence, detail)]


__all__ = ["concentrated_divergence", "concentration", "few_tokens"]
