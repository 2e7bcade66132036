"""Causes of a failing health check: how much of the metric comes from how few tokens, and where they are.

concentrated_divergence fires when a check that the token ratio's second moment decides fails (chi2_token,
the ESS of the raw ratios or of the IS weights, the IS weight std: ESS = 1 / (1 + chi2) for the raw ratios)
and the chi2_token excess (sum of ratio^2 - 1) is concentrated: the fewest top octaves of d = old - rollout
that carry 90 % of it hold at most 1 % of the valid tokens. Spread evenly, 1 % of the tokens would carry
about 1 % of it. Only d > 0 adds to that excess (ratio^2 = exp(2 d) > 1); a token with d << 0 takes at most
1 away, so the octaves are walked down from the largest positive d and the cause names the largest-d token.
NeMo-RL's token_mult_prob_error (the token-mean of exp|d|) is judged the same way on its own excess, the sum
of exp|d| - 1, which either sign feeds: its octaves are of |d| and it names the largest-|d| token (one
whose exp|d| overflows carries the whole excess).
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.answers.findings.model import Finding, percent
from mismatch_cli.correction import SAFETY_BOUND

SECOND_MOMENT_CHECKS = ("chi2_token", "ess_token", "eff_sample_size", "rollout_is_std")
MULT_CHECK = "token_mult_prob_error"
# Per basis: the bucket sum its excess is read from, what it is the excess of, the score that orders its
# tokens (a key of the signature table's token entries and of the worst-sequences criteria) and the table's
# token with the largest score.
EXCESS_OF = {"chi2": ("chi2_terms", "χ²_token"), "mult": ("exp_abs_sum", "token_mult_prob_error − 1")}
SCORE_OF = {"chi2": ("log_ratio", "max_log_ratio_token", "Δ"), "mult": ("abs_log_ratio", "worst_token", "|Δ|")}
CARRIED_SHARE = 0.9
MAX_TOKEN_SHARE = 0.01
ROUND_SHARE = 0.1  # rounds named: those carrying at least this share of the excess


def _octaves(table: dict[str, Any], basis: str) -> list[dict[str, Any]]:
    """The octaves the basis' tokens are ordered by, ascending: d >= 0 only for chi2, both signs merged for mult."""
    field = EXCESS_OF[basis][0]
    buckets = [b for b in table.get("buckets") or [] if field in b]
    if basis == "chi2":  # d < 0 carries none of the excess (each such token's ratio^2 - 1 lies in (-1, 0))
        return [b for b in buckets if b.get("sign", 1) > 0]
    merged: dict[float, dict[str, Any]] = {}
    for b in buckets:
        entry = merged.setdefault(b["low"], {"low": b["low"], "tokens": 0, field: 0.0})
        entry["tokens"] += b["tokens"]
        entry[field] += b[field]
    return sorted(merged.values(), key=lambda b: b["low"])


def token_excess(token: dict[str, Any], basis: str) -> float:
    """One token's term of the basis' excess: ratio^2 - 1 with verl's clamp (chi2), exp|d| - 1 (mult)."""
    if basis == "chi2":
        return math.expm1(2 * min(max(token["log_ratio"], -SAFETY_BOUND), SAFETY_BOUND))
    return math.expm1(token["abs_log_ratio"]) if token["abs_log_ratio"] < 709 else math.inf


def concentration(table: dict[str, Any], basis: str = "chi2") -> dict[str, Any] | None:
    """The highest edge of the basis' score (d for chi2, |d| for mult) whose tokens at or above it carry
    CARRIED_SHARE of the basis' excess (over every valid token), with their count and exact share."""
    field = EXCESS_OF[basis][0]
    at_least = SCORE_OF[basis][0] + "_at_least"
    buckets = [b for b in table.get("buckets") or [] if field in b]
    octaves = _octaves(table, basis)
    n = table.get("tokens") or 0
    if not octaves or n == 0:
        return None
    overflow = [b for b in octaves if not math.isfinite(b[field])]
    if overflow:  # exp|d| overflowed: those tokens carry the whole (infinite) excess
        count = sum(b["tokens"] for b in overflow)
        return {at_least: overflow[0]["low"], "tokens": int(count), "token_fraction": count / n,
                "share": 1.0, "excess_per_token": math.inf}
    total = sum(b[field] - b["tokens"] for b in buckets)  # the metric's own sum, both signs
    if not total > 0:
        return None
    tokens = excess = 0.0
    for bucket in reversed(octaves):
        tokens += bucket["tokens"]
        excess += bucket[field] - bucket["tokens"]
        if excess >= CARRIED_SHARE * total:
            return {at_least: bucket["low"], "tokens": int(tokens), "token_fraction": tokens / n,
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


def _places(report: Any, basis: str, edge: float, token: dict[str, Any] | None,
            total_excess: float) -> dict[str, Any]:
    """Rows, steps and rounds that hold the tokens whose score (d for chi2, |d| for mult) is >= edge."""
    score = SCORE_OF[basis][0]
    criterion = "max_" + score  # the worst-sequences criterion by the row's largest score
    rows = [{"file": e["file"], "row": e["row"], "step": e.get("step"), criterion: e[criterion]}
            for e in report.worst_sequences if e.get("criterion") == criterion and e[criterion] >= edge]
    if basis == "mult":
        steps = [s["step"] for s in report.steps if (s["metrics"].get("diag/logprob_abs_diff_max") or 0) >= edge]
    else:  # the per-step max is of |d|: the steps of the rows (and of the token) that hold d >= edge instead
        held = [r["step"] for r in rows] + ([token.get("step")] if token is not None else [])
        steps = sorted({step for step in held if step is not None})
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


def _where(token: dict[str, Any], basis: str, total_excess: float) -> str:
    """`file:row:position (round, step, d or |d|, both log-probs, the token's share of the excess)`."""
    name, symbol = EXCESS_OF[basis][1], SCORE_OF[basis][2]
    parts = [f"round {token['round']}"] if token.get("round") is not None else []
    parts += [f"step {token['step']}"] if token.get("step") is not None else []
    value = f"{token['log_ratio']:+.3g}" if basis == "chi2" else f"{token['abs_log_ratio']:.3g}"
    parts.append(f"{symbol} {value}: old {token['old_log_prob']:.4g}, rollout {token['rollout_log_prob']:.4g}")
    if math.isfinite(total_excess) and total_excess > 0:
        parts.append(f"{percent(token_excess(token, basis) / total_excess)} of {name}")
    return f"{token['file']}:{token['row']}:{token['position']} ({', '.join(parts)})"


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
    score, token_key, symbol = SCORE_OF[basis]
    failing = [*(failing if "chi2" in concentrated else []), *(mult if "mult" in concentrated else [])]
    edge, count = found[score + "_at_least"], found["tokens"]
    total_excess = found["excess_per_token"] * table["tokens"]
    token = table.get(token_key)  # the largest term of the basis' excess
    places = _places(report, basis, edge, token, total_excess if basis == "chi2" else 0.0)
    reason = _explanation(token, findings)
    noun = "token" if count == 1 else "tokens"
    verb = "carries" if count == 1 else "carry"
    title = (f"{count} {noun} ({percent(found['token_fraction'])}) with {symbol} ≥ {edge:g} {verb} "
             f"{percent(found['share'])} of {name}")
    named = {"chi2_share": found["share"], "chi2_token": found["excess_per_token"]} if basis == "chi2" else {}
    share = token_excess(token, basis) / total_excess if token is not None and total_excess > 0 else None
    evidence: dict[str, Any] = {**found, **named, "basis": name, "failing_checks": failing, **places,
                                "token": token, "token_share": share if share is None or math.isfinite(share)
                                else None, "worst_token": table.get("worst_token"), "explained_by": reason}
    where = f"; the largest is {_where(token, basis, total_excess)}" if token is not None else ""
    because = f"explained by {reason}" if reason else "not explained by any data-quality finding"
    detail = (f"{count} of {table['tokens']} valid tokens {verb} "
              f"{percent(found['share'])} of {name} = {found['excess_per_token']:.3g}, failing "
              f"{', '.join(failing)}{where}; {because}.")
    return [Finding("concentrated_divergence", "warning", title, evidence, detail)]


__all__ = ["concentrated_divergence", "concentration", "few_tokens", "token_excess"]
