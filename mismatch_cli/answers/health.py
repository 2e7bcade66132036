"""The health summary: the registry's documented bands applied before and after a correction.

`before` looks at the dump as it is: the raw token ratios (their ESS, verl's k1 `kl` and `chi2_token`).
`after` looks at what the trainer's loss sees once the run's correction is applied: the IS weights'
mean, ESS and std (verl's IS keys describe the applied weights) and the KL of the tokens left in the
mask. χ²_token has no separate `after` check: χ² of the corrected weights, normalized to mean 1, is
1/ESS − 1, which the ESS band already judges. `agreement` judges the log-probs themselves, which no
correction changes: verl's FAQ band on the mean probability difference, NeMo-RL's limit on
token_mult_prob_error, and the ratio-mean identity E[ratio] = 1, which holds at any precision and fails
when the rollout side is not the distribution its tokens were sampled from. The verdict (`status`,
`checks`) is `agreement` plus `after` when the run applied a correction whose effect is known, else plus
`before` (docs/report.md, "The health summary"). Whatever a run's correction removes from the gradient (every
reported key the registry marks `removes`, of any family) is held to the drop band among the `after` checks, so a
correction that drops most of the batch is never called healthy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from mismatch_cli.answers import corrections
from mismatch_cli.metrics import Band, aliases_of, lookup
from mismatch_cli.metrics.catalog import RATIO_MEAN_MIN_Z, ratio_mean_broken, ratio_mean_z

# Every check, in table order; each is the registry's band of that key, also held by the older families'
# key of the same quantity (`mismatch/mismatch_kl` for `rollout_corr/kl`).
CHECKS = (
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_eff_sample_size",
    "diag/ess_token",  # the raw token ratios' ESS: `before`, and `after` a correction that has no IS weights
    "rollout_corr/rollout_is_std",
    "rollout_corr/kl",
    "rollout_corr/chi2_token",
)
RAW_CHECKS = ("diag/ess_token", "rollout_corr/kl", "rollout_corr/chi2_token")
IS_MEAN, IS_ESS, IS_STD, RAW_ESS, KL = (CHECKS[0], CHECKS[1], CHECKS[3], CHECKS[2], CHECKS[4])
IS_CHECKS = (IS_MEAN, IS_ESS, IS_STD)
IS_ESS_KEYS = (IS_ESS, *aliases_of(IS_ESS))
SEQ_ESS = "diag/ess_seq_kish"  # checked before a correction when the run's correction is sequence-level
PROB_DIFF, MULT_PROB_ERROR, RATIO_MEAN = "diag/prob_abs_diff_mean", "diag/token_mult_prob_error", "diag/ratio_mean"
AGREEMENT_CHECKS = (PROB_DIFF, MULT_PROB_ERROR, RATIO_MEAN)
# The basis of a check's value: what it was computed from.
RAW = "raw token ratios"
APPLIED = "the applied IS weights"
KEPT = "the tokens the correction keeps"
UNCHANGED = "unchanged by IS weights (the mask keeps every token)"
LOG_PROBS = "the log-probs themselves (no correction changes them)"
REMOVED = "what the correction removes from the gradient"


def band_of(key: str) -> Band:
    """The registry's band of a health check."""
    metric = lookup(key)
    if metric is None or metric.band is None:
        raise KeyError(f"{key} has no band in the metric registry")
    return metric.band


def check(key: str, value: float, basis: str, metric: str | None = None) -> dict[str, Any]:
    """One check: the band of `key` applied to `value`, saying what the value was computed from."""
    band = band_of(key)
    return {
        "metric": metric or key,
        "label": lookup(key).title,  # type: ignore[union-attr]
        "value": value,
        "healthy_range": band.describe(),
        "ok": band.healthy(value),
        "basis": basis,
    }


def verdict(checks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """`healthy` when every check passes or is out through a few tokens only (or there is none), else `warning`."""
    passing = all(c["ok"] or c.get("few_tokens") for c in checks)
    return {"status": "healthy" if passing else "warning", "checks": checks, **extra}


def _present(metrics: Mapping[str, float | None], key: str) -> str | None:
    return next((k for k in (key, *aliases_of(key)) if _finite(metrics.get(k))), None)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def before(metrics: Mapping[str, float | None], config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The dump as it is: the raw token ratios' ESS, k1 KL and χ²_token (and the rows' ESS for a sequence-level run)."""
    keys = RAW_CHECKS + ((SEQ_ESS,) if sequence_level(config or {}) else ())
    checks = []
    for key in keys:
        metric = _present(metrics, key)
        if metric is not None:
            checks.append(check(key, float(metrics[metric]), RAW, metric))  # type: ignore[arg-type]
    return verdict(checks, basis=RAW)


def sequence_level(config: Mapping[str, Any]) -> bool:
    """Whether the run's IS or RS works on whole sequences (verl's `sequence` IS, `seq_*` / `geometric` RS)."""
    level = config.get("rollout_is") if "rollout_is_level" not in config else config.get("rollout_is_level")
    options = str(config.get("rollout_rs") or "").split(",")
    return level in ("sequence", "geometric") or any(o.startswith(("seq_", "sequence", "geometric")) for o in options)


def agreement(metrics: Mapping[str, float | None], few_tokens: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The log-probs themselves: mean probability difference, token_mult_prob_error and the ratio-mean identity.

    `few_tokens` maps a check to the count of tokens that carry its excess when they are at most 1 % of the
    valid tokens (findings/causes.py): out of band through those alone, it is the correction's business (the
    χ² / ESS checks judge it), not the engines' agreement, and does not decide the verdict.
    """
    checks = []
    for key in AGREEMENT_CHECKS:
        if not _finite(metrics.get(key)):
            continue
        entry = check(key, float(metrics[key]), LOG_PROBS)  # type: ignore[arg-type]
        if key == RATIO_MEAN:
            error = metrics.get(RATIO_MEAN + "_se")
            z = ratio_mean_z(entry["value"], error)  # type: ignore[arg-type]
            entry["z"] = z if math.isfinite(z) else None
            entry["ok"] = not ratio_mean_broken(entry["value"], error)  # type: ignore[arg-type]
            entry["healthy_range"] += f" or < {RATIO_MEAN_MIN_Z:g} SE from 1"
        if not entry["ok"] and (few_tokens or {}).get(key):
            entry["few_tokens"] = int(few_tokens[key])  # type: ignore[index]
        checks.append(entry)
    return verdict(checks, basis=LOG_PROBS)


def after_is(metrics: Mapping[str, float | None], notes: Iterable[str] = ()) -> dict[str, Any] | None:
    """The run's own IS correction, from its IS keys (None when the run has none)."""
    present = {key: _present(metrics, key) for key in IS_CHECKS}
    if not any(present.values()):
        return None
    checks = [check(key, float(metrics[metric]), APPLIED, metric)  # type: ignore[arg-type]
              for key, metric in present.items() if metric is not None]
    kl = _present(metrics, KL)
    if kl is not None:
        checks.append(check(KL, float(metrics[kl]), UNCHANGED, kl))  # type: ignore[arg-type]
    return verdict(checks, basis=APPLIED, notes=list(notes))


def after_what_if(row: Mapping[str, Any]) -> dict[str, Any]:
    """The health a what-if ladder row predicts: IS mean / ESS / std of its weights, or the kept tokens' ESS; KL."""
    checks = []
    ess, mean = row.get("ess"), row.get("is_weight_mean")
    if row.get("family") in ("tis", "icepop"):
        if _finite(mean):
            checks.append(check(IS_MEAN, mean, APPLIED))
        if _finite(ess) and ess > 0:
            checks.append(check(IS_ESS, ess, APPLIED))
        if _finite(mean) and _finite(ess) and ess > 0:
            checks.append(check(IS_STD, weight_std(mean, ess), APPLIED))
        kl_basis = UNCHANGED
    else:
        if _finite(ess):
            checks.append(check(RAW_ESS, ess, f"{RAW} of {KEPT}"))
        kl_basis = KEPT
    if _finite(row.get("kl")):
        checks.append(check(KL, row["kl"], kl_basis))
    return verdict(checks, basis=f"what-if: {row.get('name')}")


def weight_std(mean: float, ess: float) -> float:
    """verl's token-weighted std of the applied weights, from their mean and verl's ESS = (mean + 1e-8)² / ⟨w²⟩."""
    mean_sq = (mean + 1e-8) ** 2 / ess
    return math.sqrt(max(mean_sq - mean * mean, 0.0))


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def matching_row(config: Mapping[str, Any], what_if: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ladder row that is exactly the run's RS-only, veto-only or IS-only (TIS or IcePop, no batch
    normalization) correction, if the ladder has it."""
    option, threshold = config.get("rollout_rs"), config.get("rollout_rs_threshold")
    veto = config.get("rollout_token_veto_threshold")
    level = None if option is not None or veto is not None or config.get("rollout_is_batch_normalize") \
        else config.get("rollout_is")
    for row in what_if:
        if row.get("family") in ("tis", "icepop") and level is not None and row.get("level") == level and \
                _same(config.get("rollout_is_threshold"), row.get("threshold")):
            return row
        if row.get("family") == "rs" and option == row.get("option") and veto is None and \
                _same(threshold, row.get("threshold")):
            return row
        if row.get("family") == "veto" and option is None and veto is not None and \
                _number(veto) == _number(row.get("threshold")):
            return row
    return None


def _same(threshold: Any, other: Any) -> bool:
    return str(threshold) == str(other) or (_number(threshold) is not None and _number(threshold) == _number(other))


def removal_checks(metrics: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """Every reported share of tokens or sequences a correction removes, held to the registry's drop band."""
    checks = []
    for key, value in metrics.items():
        metric = lookup(key)
        if metric is not None and metric.removes and metric.band is not None and _finite(value):
            checks.append(check(key, float(value), REMOVED))  # type: ignore[arg-type]
    return checks


def applies_correction(config: Mapping[str, Any]) -> bool:
    """Whether a report's config turns on IS, RS or a veto (verl's and the older families' fields, or a replayed
    trainer's correction)."""
    if corrections.is_replayed(str(config.get("semantics"))):
        return corrections.applies(config)
    if "rollout_is_level" in config:  # verl 0.6.0 / xtuner: nothing (veto included) runs without a threshold
        return config.get("rollout_is_threshold") is not None
    is_on = config.get("rollout_is") not in (None, False) and config.get("rollout_is_threshold") is not None
    return is_on or any(config.get(f) not in (None, False) for f in ("rollout_rs", "rollout_token_veto_threshold"))


def summarize(metrics: Mapping[str, float | None], config: Mapping[str, Any] | None = None,
              what_if: Iterable[Mapping[str, Any]] = (), few_tokens: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The health before and after the run's correction and of the log-probs; `status` / `checks` are the verdict."""
    config = config or {}
    raw = before(metrics, config)
    agreed = agreement(metrics, few_tokens)
    rs_on = config.get("rollout_rs") is not None
    notes = [f"RS ({config.get('rollout_rs')}) also drops tokens; the IS keys are over every valid token"] \
        if rs_on else []
    applied = after_is(metrics, notes)
    corrected = bool(config) and applies_correction(config)
    if applied is None and corrected:
        row = matching_row(config, what_if) or corrections.matching_row(config, what_if)
        if row is not None:
            applied = after_what_if(row)
        else:
            applied = {"status": "unknown", "checks": [], "basis": "unknown", "notes": [
                "this correction has no IS weights and is not a what-if setting, so its effect is not computed; "
                "the verdict is the raw one"]}
    removed = removal_checks(metrics) if corrected else []
    if applied is not None and removed:
        known = applied["checks"] + removed
        applied = {**verdict(known, basis=applied["basis"] if applied["checks"] else REMOVED),
                   "notes": applied.get("notes", []) if applied["checks"] else []}
    chosen = applied if applied is not None and applied["checks"] else raw
    checks = agreed["checks"] + chosen["checks"]
    return {**verdict(checks), "before": raw, "after": applied, "agreement": agreed}
