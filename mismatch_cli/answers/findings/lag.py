"""Policy lag: the gap per lag, from the policy versions a dump stamps on its rows, and whether it grows with it.

A row's lag is its lag column's value, or, from a version column, the newest version among the rows of its
step minus its own (versions behind the freshest sample of that step; a constant offset from the trainer's
own count changes no conclusion). Per lag: tokens, rows, the token-mean |p_old - p_rollout| with its standard
error, NeMo-RL's token_mult_prob_error and k1.

policy_lag fires when the gap grows with the lag: at the largest lag (with >= MIN_LAG_TOKENS tokens) mean
|p_old - p_rollout| is at least GROWTH times, and MIN_Z standard errors above, the one at the smallest lag.
Precision noise does not depend on how old the weights were, so lag-0 rows disagreeing as much as the oldest
ones rule the lag out as the cause.
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.answers.findings.model import Finding

MIN_LAG_TOKENS = 100
GROWTH = 1.5
MIN_Z = 5.0


def lag_table(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Per lag, ascending: tokens, rows, mean |Δp| with its standard error, token_mult_prob_error, k1."""
    entries, kind = table.get("policy_versions") or [], table.get("version_kind")
    newest: dict[int, float] = {}
    for entry in entries:
        newest[entry["step"]] = max(newest.get(entry["step"], -math.inf), entry["version"])
    sums: dict[float, dict[str, float]] = {}
    for entry in entries:
        lag = entry["version"] if kind == "lag" else newest[entry["step"]] - entry["version"]
        into = sums.setdefault(lag, dict.fromkeys(("tokens", "rows", "abs_prob_sum", "abs_prob_sq_sum",
                                                   "exp_abs_sum", "log_ratio_sum"), 0.0))
        for key in into:
            into[key] += entry[key]
    rows = []
    for lag in sorted(sums):
        s = sums[lag]
        n = s["tokens"]
        mean = s["abs_prob_sum"] / n
        variance = max(s["abs_prob_sq_sum"] / n - mean * mean, 0.0) * n / (n - 1) if n > 1 else math.nan
        rows.append({"lag": int(lag) if float(lag).is_integer() else lag, "tokens": int(n), "rows": int(s["rows"]),
                     "prob_abs_diff_mean": mean, "prob_abs_diff_mean_se": math.sqrt(variance / n),
                     "token_mult_prob_error": s["exp_abs_sum"] / n, "kl": -s["log_ratio_sum"] / n})
    return rows


def lag_growth(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest and largest lag with enough tokens, and whether the gap grows between them (None: < 2 lags)."""
    usable = [r for r in rows if r["tokens"] >= MIN_LAG_TOKENS]
    if len(usable) < 2:
        return None
    low, high = usable[0], usable[-1]
    error = math.hypot(low["prob_abs_diff_mean_se"], high["prob_abs_diff_mean_se"])
    difference = high["prob_abs_diff_mean"] - low["prob_abs_diff_mean"]
    z = difference / error if error > 0 else math.inf if difference > 0 else 0.0
    grows = high["prob_abs_diff_mean"] >= GROWTH * low["prob_abs_diff_mean"] and z >= MIN_Z
    return {"low": low, "high": high, "z": z, "grows": grows}


def policy_lag(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """The gap grows with the policy lag the dump stamps on its rows (or, as info, it does not)."""
    rows = lag_table(table)
    growth = lag_growth(rows)
    if growth is None:
        return []
    low, high = growth["low"], growth["high"]
    between = (f"mean |p_train − p_rollout| {low['prob_abs_diff_mean']:.3g} at lag {low['lag']}, "
               f"{high['prob_abs_diff_mean']:.3g} at lag {high['lag']}")
    evidence = {"lags": rows, "z": growth["z"], "version_kind": table.get("version_kind")}
    if not growth["grows"]:
        return [Finding(
            "lag_ruled_out", "info", f"the gap does not grow with the policy lag: {between}", evidence,
            f"Rows at lag {low['lag']} disagree about as much as rows {high['lag']} versions behind: the weights' age "
            "is not what drives this gap.")]
    kind = "lag column" if table.get("version_kind") == "lag" else "policy versions"
    return [Finding(
        "policy_lag", "warning", f"the gap grows with the policy lag: {between}", evidence,
        f"By the dump's {kind}, rows {high['lag']} versions behind disagree "
        f"{high['prob_abs_diff_mean'] / max(low['prob_abs_diff_mean'], 1e-300):.3g} times as much as rows at lag "
        f"{low['lag']} ({growth['z']:.3g} standard errors apart): the weights the engine "
        "sampled with were older than the trainer's, and precision noise does not grow with age.",
        fix="bound the staleness (fewer versions between sampling and training), and correct what remains: a lag "
            "is a real off-policy gap, the case an importance-sampling correction is for")]


__all__ = ["GROWTH", "MIN_LAG_TOKENS", "lag_growth", "lag_table", "policy_lag"]
