"""The health summary: verl's documented warning bands applied to a metrics map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Band:
    """A metric, what it means, and the range verl's docs call healthy."""

    metric: str
    label: str
    low: float | None
    high: float | None
    absolute: bool = False
    aliases: tuple[str, ...] = ()  # the same quantity under an older family's key

    def describe(self) -> str:
        """The healthy range in words."""
        name = "|value|" if self.absolute else "value"
        if self.low is not None and self.high is not None:
            return f"{self.low} <= {name} <= {self.high}"
        if self.low is not None:
            return f"{name} >= {self.low}"
        return f"{name} <= {self.high}"

    def healthy(self, value: float) -> bool:
        """True when the value lies inside the band."""
        value = abs(value) if self.absolute else value
        if self.low is not None and value < self.low:
            return False
        return not (self.high is not None and value > self.high)


BANDS = (
    Band("rollout_corr/rollout_is_mean", "IS weight mean", 0.5, 2.0, aliases=("mismatch/rollout_is_mean",)),
    Band("rollout_corr/rollout_is_eff_sample_size", "IS effective sample size", 0.3, None,
         aliases=("mismatch/rollout_is_eff_sample_size",)),
    Band("diag/ess_token", "ESS of raw token ratios", 0.3, None),
    Band("rollout_corr/rollout_is_std", "IS weight std", None, 1.0, aliases=("mismatch/rollout_is_std",)),
    Band("rollout_corr/kl", "KL(rollout || train), k1", None, 0.1, absolute=True, aliases=("mismatch/mismatch_kl",)),
    Band("rollout_corr/chi2_token", "chi-squared, token", None, 1.0),
)


def summarize(metrics: dict[str, float | None]) -> dict[str, Any]:
    """Apply the bands to whichever of their metrics are present; status is `healthy` or `warning`."""
    checks = []
    has_is = any(metrics.get(k) is not None for k in ("rollout_corr/rollout_is_eff_sample_size",
                                                        "mismatch/rollout_is_eff_sample_size"))
    for band in BANDS:
        if band.metric == "diag/ess_token" and has_is:
            continue
        metric = next((k for k in (band.metric, *band.aliases) if metrics.get(k) is not None), None)
        if metric is None:
            continue
        value = metrics[metric]
        checks.append(
            {
                "metric": metric,
                "label": band.label,
                "value": value,
                "healthy_range": band.describe(),
                "ok": band.healthy(value),
            }
        )
    status = "healthy" if all(c["ok"] for c in checks) else "warning"
    return {"status": status, "checks": checks}
