"""Drift across steps: the t distribution, the OLS trend against numpy, bands left and level shifts on dumps."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.answers.drift import change_point, drift, t_cdf, t_quantile, trend
from mismatch_cli.api import analyze
from mismatch_cli.report import Report

# Two-sided 95 % critical values of Student's t (printed tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T_975 = {1: 12.7062047361747, 2: 4.30265272974946, 5: 2.57058183563631, 10: 2.22813885198627,
         28: 2.04840714179525, 100: 1.98397151852355}
ROWS_PER_STEP, WIDTH, STEPS = 20, 100, 30


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_the_tables(df: int) -> None:
    assert t_quantile(0.975, df) == pytest.approx(T_975[df], rel=1e-9)
    assert t_quantile(0.025, df) == pytest.approx(-T_975[df], rel=1e-9)


@pytest.mark.parametrize("t", [-30.0, -2.0, -0.3, 0.0, 0.7, 4.0])
def test_t_cdf_matches_closed_forms(t: float) -> None:
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2.0 * math.sqrt(2.0 + t * t)), abs=1e-12)


def _hand_trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """numpy's polyfit slope and the textbook interval b ± t · sqrt(SSE / (n - 2) / Sxx)."""
    slope, intercept = np.polyfit(x, y, 1)
    sse = float(((y - (intercept + slope * x)) ** 2).sum())
    se = math.sqrt(sse / (x.size - 2) / float(((x - x.mean()) ** 2).sum()))
    return slope, slope - T_975[x.size - 2] * se, slope + T_975[x.size - 2] * se


def test_trend_against_polyfit() -> None:
    rng = np.random.default_rng(3)
    x = np.arange(30, dtype=np.float64) * 2 + 5  # steps need not start at 0 nor be contiguous
    y = 0.3 - 0.01 * x + rng.normal(0, 0.05, x.size)
    fit = trend(x, y)
    slope, low, high = _hand_trend(x, y)
    assert fit["slope"] == pytest.approx(slope, rel=1e-10)
    assert fit["slope_interval"] == pytest.approx([low, high], rel=1e-9)


def test_change_point_finds_a_level_shift_on_a_trend() -> None:
    rng = np.random.default_rng(4)
    x = np.arange(20, dtype=np.float64)
    y = 0.001 * x + np.where(x >= 12, 0.05, 0.0) + rng.normal(0, 0.005, x.size)
    index, shift = change_point(x, y, trend(x, y)["sse"])
    assert index == 12 and shift == pytest.approx(0.05, abs=0.01)
    straight = 0.001 * x + rng.normal(0, 0.005, x.size)  # a trend alone is no level shift
    assert change_point(x, straight, trend(x, straight)["sse"]) == (None, None)


# ------------------------------------------------------------------------------------ dumps with steps


def _dump(path, kl_per_step: np.ndarray, seed: int, noise: float = 0.05) -> np.ndarray:
    """A parquet dump whose step s has token log-ratios −kl[s] + N(0, noise); returns each step's exact k1 kl."""
    rng = np.random.default_rng(seed)
    steps = np.repeat(np.arange(kl_per_step.size), ROWS_PER_STEP)
    rollout = (-rng.exponential(0.5, (steps.size, WIDTH)) - 1e-3).astype(np.float32)
    old = (rollout + (-kl_per_step[steps][:, None] + rng.normal(0, noise, rollout.shape))).astype(np.float32)
    mask = np.ones(rollout.shape, dtype=np.int8)
    mask[:, -7:] = rng.random((steps.size, 7)) < 0.5  # some padding
    pq.write_table(pa.table({
        "old_log_probs": pa.array(list(old), type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array(list(rollout), type=pa.list_(pa.float32())),
        "response_mask": pa.array(list(mask), type=pa.list_(pa.int8())),
        "step": pa.array(steps, type=pa.int64()),
    }), path)
    # verl's k1 kl per step, in float64 from the float32 values written: -(sum of old - rollout) / tokens.
    delta = old.astype(np.float64) - rollout.astype(np.float64)
    return np.array([-(delta[steps == s] * mask[steps == s]).sum() / mask[steps == s].sum()
                     for s in range(kl_per_step.size)])


def _kl_drift(tmp_path, kl_per_step: np.ndarray, seed: int) -> tuple[dict, np.ndarray]:
    path = tmp_path / "steps.parquet"
    exact = _dump(path, kl_per_step, seed)
    report = analyze([str(path)], by_step=True, bootstrap=0, hash_inputs=False)
    assert [s["step"] for s in report.steps] == list(range(kl_per_step.size))
    return report.drift["rollout_corr/kl"], exact


def test_drifting_run_has_a_positive_slope(tmp_path) -> None:
    """The issue's run: k1 0.011 → 0.036 over 30 steps. Inside |kl| <= 0.1 throughout: no step out of band."""
    entry, exact = _kl_drift(tmp_path, np.linspace(0.011, 0.036, STEPS), seed=0)
    slope, low, high = _hand_trend(np.arange(STEPS, dtype=np.float64), exact)
    assert entry["slope"] == pytest.approx(slope, rel=1e-5)
    assert entry["slope_interval"] == pytest.approx([low, high], rel=1e-4)
    assert 0.0 < entry["slope_interval"][0] and entry["slope"] == pytest.approx(0.025 / 29, rel=0.1)
    assert entry["unit_per_step"] == "nats per step"
    assert np.abs(exact).max() < 0.1
    assert entry["first_out_of_band_step"] is None and entry["bad_steps"] == []
    assert entry["change_point_step"] is None  # a steady trend, not a level shift


def test_drift_out_of_band_step(tmp_path) -> None:
    """k1 0.02 → 0.2: the first step with |kl| > 0.1 (computed from the dump) is the first out-of-band step."""
    entry, exact = _kl_drift(tmp_path, np.linspace(0.02, 0.2, STEPS), seed=1)
    bad = [s for s in range(STEPS) if abs(exact[s]) > 0.1]
    assert bad and entry["bad_steps"] == bad and entry["first_out_of_band_step"] == bad[0]
    assert entry["slope_interval"][0] > 0


def test_flat_run_has_no_trend_and_no_change_point(tmp_path) -> None:
    entry, exact = _kl_drift(tmp_path, np.full(STEPS, 0.011), seed=2)
    slope, low, high = _hand_trend(np.arange(STEPS, dtype=np.float64), exact)
    assert entry["slope_interval"] == pytest.approx([low, high], rel=1e-4, abs=1e-9)
    assert entry["slope_interval"][0] < 0.0 < entry["slope_interval"][1]
    assert entry["change_point_step"] is None and entry["first_out_of_band_step"] is None


def test_level_shift_run(tmp_path) -> None:
    entry, _ = _kl_drift(tmp_path, np.where(np.arange(STEPS) >= 17, 0.03, 0.011), seed=3)
    assert entry["change_point_step"] == 17
    assert entry["change_point_shift"] == pytest.approx(0.019, abs=0.003)


def test_drift_needs_three_steps_and_survives_json(tmp_path) -> None:
    steps = [{"step": s, "metrics": {"rollout_corr/kl": 0.01 * s, "rollout_corr/chi2_token": None}} for s in range(2)]
    assert drift(steps) == {}
    steps.append({"step": 2, "metrics": {"rollout_corr/kl": 0.5, "rollout_corr/chi2_token": None}})
    entry = drift(steps)["rollout_corr/kl"]
    assert list(drift(steps)) == ["rollout_corr/kl"]  # a metric with no finite value is left out
    assert entry["bad_steps"] == [2] and entry["change_point_step"] is None  # too few steps for a split
    path = tmp_path / "steps.parquet"
    _dump(path, np.linspace(0.01, 0.02, 4), seed=5)
    report = analyze([str(path)], by_step=True, bootstrap=0, hash_inputs=False)
    assert Report.from_dict(report.to_dict()).drift == report.drift
    assert set(report.drift) >= {"rollout_corr/kl", "rollout_corr/chi2_token", "rollout_corr/k3_kl",
                                 "diag/ess_token"}
