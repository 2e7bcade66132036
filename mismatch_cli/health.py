"""The health summary: the registry's documented bands applied to a metrics map."""

from __future__ import annotations

from typing import Any

from mismatch_cli.metrics import Band, aliases_of, lookup

# The checks, in table order; each is the registry's band of that key, also held by the older families'
# key of the same quantity (`mismatch/mismatch_kl` for `rollout_corr/kl`).
CHECKS = (
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_eff_sample_size",
    "diag/ess_token",  # only when IS is off: the ESS of the raw ratios stands in for the IS weights'
    "rollout_corr/rollout_is_std",
    "rollout_corr/kl",
    "rollout_corr/chi2_token",
)
IS_ESS = ("rollout_corr/rollout_is_eff_sample_size", *aliases_of("rollout_corr/rollout_is_eff_sample_size"))


def band_of(key: str) -> Band:
    """The registry's band of a health check."""
    metric = lookup(key)
    if metric is None or metric.band is None:
        raise KeyError(f"{key} has no band in the metric registry")
    return metric.band


def summarize(metrics: dict[str, float | None]) -> dict[str, Any]:
    """Apply the bands to whichever of their metrics are present; status is `healthy` or `warning`."""
    checks = []
    has_is = any(metrics.get(k) is not None for k in IS_ESS)
    for key in CHECKS:
        if key == "diag/ess_token" and has_is:
            continue
        metric = next((k for k in (key, *aliases_of(key)) if metrics.get(k) is not None), None)
        if metric is None:
            continue
        band, value = band_of(key), metrics[metric]
        checks.append(
            {
                "metric": metric,
                "label": lookup(key).title,  # type: ignore[union-attr]
                "value": value,
                "healthy_range": band.describe(),
                "ok": band.healthy(value),
            }
        )
    status = "healthy" if all(c["ok"] for c in checks) else "warning"
    return {"status": status, "checks": checks}
