"""Drift across steps: per headline metric, the trend, its 95 % interval, bands left and the first level shift.

For each headline metric (the health checks' keys plus verl's k3 KL), over the steps where it is
finite (x = the step number, y = the step's value):

* the ordinary least-squares slope b, with the 95 % interval b ± t(0.975, n − 2) · s / sqrt(Sxx), where
  s² = Σ residual² / (n − 2) and Sxx = Σ (x − x̄)²;
* `bad_steps`: the steps whose value is outside the registry's band; `first_out_of_band_step` the first;
* `change_point_step`: the first step of a level shift on top of the trend. Each split k (at least two
  steps on each side) fits y = a + b·x + δ·[x ≥ x_k]; the split with the smallest residual sum is kept
  when the t-test of δ (n − 3 degrees of freedom) has p · (number of splits) < 0.05 (Bonferroni, since
  the best of many splits is tested). Needs five steps.

The t distribution is computed here (regularized incomplete beta by continued fraction), without scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mismatch_cli.answers.health import CHECKS
from mismatch_cli.metrics import aliases_of, lookup

HEADLINE = (*CHECKS, "rollout_corr/k3_kl")  # k1 is `kl`, χ² is `chi2_token`
MIN_STEPS = 3
MIN_CHANGE_POINT_STEPS = 5
LEVEL = 0.05  # two-sided 95 % interval; change-point family-wise level


# ------------------------------------------------------------------------------------ t distribution


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        for numerator in (even, odd):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0 < p < 1), by bisection on `t_cdf` to ~1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must lie strictly between 0 and 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


# ------------------------------------------------------------------------------------------ fits


def trend(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """OLS slope of y on x with its 95 % t interval (n >= 3 distinct x)."""
    n = x.size
    xc = x - x.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean())) / sxx
    intercept = float(y.mean() - slope * x.mean())
    residual = y - (intercept + slope * x)
    sse = float(residual @ residual)
    se = math.sqrt(sse / (n - 2) / sxx)
    half = t_quantile(1.0 - LEVEL / 2.0, n - 2) * se
    return {"slope": slope, "slope_interval": [slope - half, slope + half], "intercept": intercept,
            "slope_stderr": se, "sse": sse}


def change_point(x: np.ndarray, y: np.ndarray, trend_sse: float) -> tuple[int | None, float | None]:
    """(index where the level shift starts, shift size), or (None, None) when no split is significant."""
    n = x.size
    splits = range(2, n - 1)  # at least two points on each side
    if n < MIN_CHANGE_POINT_STEPS or trend_sse <= 0.0:
        return None, None
    best = None
    for k in splits:
        design = np.column_stack([np.ones(n), x, (np.arange(n) >= k).astype(np.float64)])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - design @ coef
        sse = float(residual @ residual)
        if best is None or sse < best[1]:
            best = (k, sse, float(coef[2]), design)
    k, sse, shift, design = best  # type: ignore[misc]
    df = n - 3
    if trend_sse - sse <= 1e-12 * trend_sse:
        return None, None
    if sse <= 0.0:  # an exact step on a line: the shift explains every residual
        return k, shift
    covariance = np.linalg.inv(design.T @ design) * (sse / df)
    t = shift / math.sqrt(float(covariance[2, 2]))
    p = 2.0 * (1.0 - t_cdf(abs(t), df))
    return (k, shift) if p * len(splits) < LEVEL else (None, None)


# ------------------------------------------------------------------------------------------ drift


def _series(steps: Sequence[Mapping[str, Any]], key: str) -> tuple[str, np.ndarray, np.ndarray] | None:
    for name in (key, *aliases_of(key)):
        points = [(int(s["step"]), float(s["metrics"][name])) for s in steps
                  if isinstance(s.get("metrics", {}).get(name), (int, float))
                  and math.isfinite(s["metrics"][name])]
        if len(points) >= MIN_STEPS:
            points.sort()
            return name, np.array([p[0] for p in points], dtype=np.float64), np.array([p[1] for p in points])
    return None


def metric_drift(key: str, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """One metric's trend, interval, out-of-band steps and first level shift over its steps."""
    metric = lookup(key)
    fit = trend(x, y)
    band = metric.band if metric is not None else None
    bad = [int(s) for s, v in zip(x, y, strict=True) if band is not None and not band.healthy(float(v))]
    index, shift = change_point(x, y, fit["sse"])
    unit = metric.unit if metric is not None else "value"
    return {
        "slope": fit["slope"],
        "slope_interval": fit["slope_interval"],
        "unit_per_step": f"{unit} per step",
        "first_out_of_band_step": bad[0] if bad else None,
        "change_point_step": int(x[index]) if index is not None else None,
        "change_point_shift": shift,
        "bad_steps": bad,
        "steps": int(x.size),
        "healthy_range": band.describe() if band is not None else None,
    }


def drift(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per headline metric present in at least three steps: its drift (empty with fewer steps)."""
    if len(steps) < MIN_STEPS:
        return {}
    out = {}
    for key in HEADLINE:
        series = _series(steps, key)
        if series is not None:
            name, x, y = series
            entry = metric_drift(name, x, y)
            if all(math.isfinite(v) for v in (entry["slope"], *entry["slope_interval"])):  # no overflow
                out[name] = entry
    return out
