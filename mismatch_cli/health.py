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
    Band("rollout_corr/rollout_is_mean", "IS weight mean", 0.5, 2.0),
    Band("rollout_corr/rollout_is_eff_sample_size", "IS effective sample size", 0.3, None),
    Band("diag/ess_token", "ESS of raw token ratios", 0.3, None),
    Band("rollout_corr/rollout_is_std", "IS weight std", None, 1.0),
    Band("rollout_corr/kl", "KL(rollout || train), k1", None, 0.1, absolute=True),
    Band("rollout_corr/chi2_token", "chi-squared, token", None, 1.0),
)


def summarize(metrics: dict[str, float | None]) -> dict[str, Any]:
    """Apply the bands to whichever of their metrics are present; status is `healthy` or `warning`."""
    checks = []
    has_is = metrics.get("rollout_corr/rollout_is_eff_sample_size") is not None
    for band in BANDS:
        if band.metric == "diag/ess_token" and has_is:
            continue
        value = metrics.get(band.metric)
        if value is None:
            continue
        checks.append(
            {
                "metric": band.metric,
                "label": band.label,
                "value": value,
                "healthy_range": band.describe(),
                "ok": band.healthy(value),
            }
        )
    status = "healthy" if all(c["ok"] for c in checks) else "warning"
    return {"status": status, "checks": checks}
