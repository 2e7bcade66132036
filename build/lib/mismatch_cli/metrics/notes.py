"""What a strange-looking value means: one short line for a number that seems impossible or contradicts its band.

Each rule follows from the metric's definition (docs/metrics.md, "Numbers that look wrong"):
χ² = E[ratio²] − 1 is ≥ 0 in expectation only while the mean ratio is 1, so a negative χ² says the
sample's mean ratio is below 1; k3 = exp(d) − d − 1 is ≥ 0 for every token, so a negative k3 is float32
rounding of near-equal log-probs; k1 estimates KL(rollout || train) ≥ 0, so a negative k1 is sampling
noise (or a rollout side that is not the distribution it sampled from); an interval that holds 0 cannot
tell the value from no mismatch at all; a mean probability difference between verl's "normal" 0.005 and its
"problem" 0.01 is in band but worth watching. A sequence-level quantity (χ²_seq, the rows' ESS) is
exp(2·Σ log-ratio) over a whole row, so a few long rows dominate it: outside the band of its token-level
sibling it still decides nothing unless the correction is sequence-level (then the rows' ESS is checked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mismatch_cli.metrics import lookup
from mismatch_cli.metrics.catalog import ratio_mean_broken

RATIO_MEAN = "diag/ratio_mean"
PROB_DIFF_NORMAL, PROB_DIFF_PROBLEM = 0.005, 0.01  # verl docs/faq/faq.rst on rollout_probs_diff_mean
KL_NOISE = 0.1  # verl's KL band: a k1 further below 0 than this is no longer noise around 0
# A row-level quantity and the token-level key whose band it is read against when it looks out of band.
SEQUENCE_SIBLINGS = {"chi2_seq": "rollout_corr/chi2_token", "ess_seq_kish": "diag/ess_token"}


def _ratio_off(metrics: Mapping[str, Any]) -> bool | None:
    """Whether the token ratio mean is significantly below 1 (None when unknown)."""
    mean, error = metrics.get(RATIO_MEAN), metrics.get(RATIO_MEAN + "_se")
    if not isinstance(mean, (int, float)) or not isinstance(error, (int, float)) or not error > 0:
        return None
    return mean < 1.0 and ratio_mean_broken(mean, error)


def explain(key: str, value: Any, metrics: Mapping[str, Any], interval: Sequence[float] | None = None,
            sequence_level: bool | None = None) -> str | None:
    """One short line on what a negative, below-1 or 0-straddling value of `key` means, or on why a row-level
    value out of its token sibling's band does not decide a verdict that is not `sequence_level`; or None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    name = key.split("/")[-1]
    sibling = lookup(SEQUENCE_SIBLINGS[name]) if name in SEQUENCE_SIBLINGS else None
    if sequence_level is False and sibling is not None and sibling.band is not None and \
            not sibling.band.healthy(value):
        return "few long rows dominate it; checked only for a sequence-level correction"
    off = _ratio_off(metrics)
    if name in ("chi2_token", "chi2_seq") and value < 0:
        if off:
            return "negative: only a token ratio mean below 1 allows it (see the ratio mean)"
        return "negative: a mean ratio a hair below 1 (float32 residue, noise); read 0"
    if name in ("k3_kl", "mismatch_k3_kl") and value < 0:
        return "negative: float32 rounding (k3 >= 0 on every token); read 0"
    if name in ("kl", "mismatch_kl") and value < 0:
        if off or value < -KL_NOISE:
            return "negative beyond noise: the rollout side is not the distribution its tokens were sampled from"
        return "negative: sampling noise around 0 (k1 estimates a KL, which is >= 0)"
    if name == "ratio_mean" and value < 1:
        if off:
            return "below 1 beyond noise: not the distribution the tokens were sampled from"
    if name == "prob_abs_diff_mean" and PROB_DIFF_NORMAL < value <= PROB_DIFF_PROBLEM:
        return "in band, but above the 0.005 that verl's FAQ calls normal: watch it"
    if interval is not None and len(interval) >= 2 and interval[0] < 0 < interval[1]:
        return "the interval holds 0: not distinguishable from no mismatch"
    return None


__all__ = ["explain"]
