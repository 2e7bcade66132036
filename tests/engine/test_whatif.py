"""The what-if ladder against an independent float64 numpy computation and against the real IS / RS runs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch_from_padded
from test_numpy_reference import random_dump

from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.accumulators.whatif import LADDER
from mismatch_cli.engine.runner import run


def spiky_dump(seed: int):
    """random_dump plus large positive and negative log-ratios (TIS, IcePop, veto and the +-20 clamp all act)."""
    old, rollout, mask = random_dump(seed, rows=48, width=31)
    rng = np.random.default_rng(seed + 7)
    spikes = (rng.random(old.shape) < 0.02) & (mask > 0)
    old = np.where(spikes, rollout + rng.choice([-30.0, -8.0, -0.8, 0.6, 1.2, 3.0, 25.0], size=old.shape), old)
    return old, rollout, mask


def ess(weight_sum: float, weight_sq_sum: float, count: float) -> float | None:
    """verl's ESS, 1 / MM((w / (MM(w) + 1e-8))^2), from sums."""
    mean, mean_sq = weight_sum / (count + 1e-8), weight_sq_sum / (count + 1e-8)
    return (mean + 1e-8) ** 2 / mean_sq if mean_sq > 0 else None


def assert_close(got: float | None, want: float | None, rel: float, abs_: float, where: tuple) -> None:
    if want is None:
        assert got is None, where
    else:
        assert got == pytest.approx(want, rel=rel, abs=abs_), where


def reference(old, rollout, mask, k1_bounds: str = "verl") -> dict[str, dict]:
    """Each ladder row computed directly on the padded arrays (float64)."""
    valid = mask > 0
    delta = np.where(valid, old - rollout, 0.0)
    safe = np.clip(delta, -20.0, 20.0)
    ratio = np.where(valid, np.exp(safe), 0.0)
    tokens = valid.sum()
    row_tokens = valid.sum(axis=1)
    valid_rows = row_tokens > 0
    seq_raw = np.exp(np.clip(delta.sum(axis=1), -20.0, 20.0))
    out: dict[str, dict] = {}
    kl_all = -delta.sum() / (tokens + 1e-8)  # verl's k1 kl: IS settings never change the mask

    def rows_dropped(name: str, rejected_rows: np.ndarray) -> None:
        kept = valid & ~rejected_rows[:, None]
        out[name] = {"masked_token_fraction": (valid & rejected_rows[:, None]).sum() / tokens,
                     "masked_seq_fraction": rejected_rows.sum() / valid_rows.sum(),
                     "ess": ess(ratio[kept].sum(), (ratio[kept] ** 2).sum(), kept.sum()),
                     "kl": -delta[kept].sum() / (kept.sum() + 1e-8) if kept.any() else None}  # nothing kept

    out["no correction"] = {"ess": ess(ratio.sum(), (ratio**2).sum(), tokens), "masked_token_fraction": 0.0,
                            "kl": kl_all}
    for scenario in LADDER:
        name, threshold = scenario.name, scenario.threshold
        if scenario.family == "tis" and scenario.level == "token":
            upper = float(threshold)
            weight = np.where(valid, np.minimum(ratio, upper), 0.0)
            out[name] = {"truncated_token_fraction": ((ratio > upper) & valid).sum() / tokens,
                         "is_weight_mean": weight.sum() / (tokens + 1e-8),
                         "ess": ess(weight.sum(), (weight**2).sum(), tokens), "masked_token_fraction": 0.0}
        elif scenario.family == "tis":
            upper = float(threshold)
            weight = np.minimum(seq_raw, upper)
            out[name] = {"truncated_token_fraction": row_tokens[seq_raw > upper].sum() / tokens,
                         "ess": ess((weight * row_tokens).sum(), (weight**2 * row_tokens).sum(), tokens)}
        elif scenario.family == "icepop" and scenario.level == "token":
            lower, upper = (float(x) for x in threshold.split("_"))
            zeroed = valid & ~((ratio >= lower) & (ratio <= upper))
            weight = np.where(zeroed, 0.0, ratio)
            out[name] = {"masked_token_fraction": zeroed.sum() / tokens,
                         "masked_seq_fraction": zeroed.any(axis=1).sum() / valid_rows.sum(),
                         "ess": ess(weight.sum(), (weight**2).sum(), tokens)}
        elif scenario.family == "icepop":
            lower, upper = (float(x) for x in threshold.split("_"))
            zeroed = valid_rows & ~((seq_raw >= lower) & (seq_raw <= upper))
            weight = np.where(zeroed, 0.0, seq_raw)
            out[name] = {"masked_token_fraction": row_tokens[zeroed].sum() / tokens,
                         "masked_seq_fraction": zeroed.sum() / valid_rows.sum(),
                         "ess": ess((weight * row_tokens).sum(), (weight**2 * row_tokens).sum(), tokens)}
        elif scenario.family == "rs":
            k1 = -(safe * valid).sum(axis=1)
            k3 = ((np.exp(safe) - 1.0 - safe) * valid).sum(axis=1)
            if scenario.option == "seq_mean_k3":
                keep = k3 / (row_tokens + 1e-8) <= float(threshold)
            else:
                lower, upper = (float(x) for x in threshold.split("_"))
                stat = k1 / (row_tokens + 1e-8) if scenario.option == "seq_mean_k1" else k1
                # verl compares k1 = -log(ratio) with [log L, log U]; the corrected rule keeps L <= ratio <= U.
                low, high = (np.log(lower), np.log(upper)) if k1_bounds == "verl" else (-np.log(upper),
                                                                                        -np.log(lower))
                keep = (stat >= low) & (stat <= high)
            rows_dropped(name, valid_rows & ~keep)
        elif scenario.family == "veto":
            bound = float(np.log(np.float32(float(threshold))))  # verl 0.6/0.7: log(veto) as a float32 scalar
            rows_dropped(name, (valid & (delta < bound)).any(axis=1))
    for scenario in LADDER:
        if scenario.family in ("tis", "icepop"):
            out[scenario.name]["kl"] = kl_all
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ladder_against_numpy(seed: int) -> None:
    old, rollout, mask = spiky_dump(seed)
    rows = run([batch_from_padded(old, rollout, mask)], resolve(CorrectionConfig()), device="cpu",
               dtype="float64").overall.what_if
    assert [r["name"] for r in rows] == [s.name for s in LADDER]
    want = reference(old, rollout, mask)
    for row in rows:
        for key, value in want[row["name"]].items():
            assert_close(row[key], value, 1e-9, 1e-12, (row["name"], key))


def test_ladder_follows_the_k1_bounds_setting() -> None:
    old, rollout, mask = spiky_dump(4)
    config = CorrectionConfig(k1_bounds="ratio")
    rows = run([batch_from_padded(old, rollout, mask)], resolve(config), device="cpu", dtype="float64").overall.what_if
    want = reference(old, rollout, mask, k1_bounds="ratio")
    for row in rows:
        for key, value in want[row["name"]].items():
            assert_close(row[key], value, 1e-9, 1e-12, (row["name"], key))


def _rows_for(family: str, level: str, threshold: str) -> dict:
    return next(s for s in LADDER if (s.family, s.level, s.threshold) == (family, level, threshold))


@pytest.mark.parametrize("level,threshold", [("token", "2.0"), ("sequence", "5.0"), ("token", "0.5_5.0"),
                                             ("sequence", "0.5_2.0")])
def test_is_rows_match_running_that_configuration(level: str, threshold: str) -> None:
    """A ladder row equals verl's own IS keys when the dump is analyzed with that setting."""
    old, rollout, mask = spiky_dump(5)
    batch = batch_from_padded(old, rollout, mask)
    family = "icepop" if "_" in threshold else "tis"
    name = _rows_for(family, level, threshold).name
    row = next(r for r in run([batch], resolve(CorrectionConfig()), device="cpu", dtype="float64").overall.what_if
               if r["name"] == name)
    config = CorrectionConfig(rollout_is=level, rollout_is_threshold=float(threshold) if family == "tis" else threshold)
    metrics = run([batch], resolve(config), device="cpu", dtype="float64").overall.metrics
    assert row["ess"] == pytest.approx(metrics["rollout_corr/rollout_is_eff_sample_size"], rel=1e-9)
    assert row["is_weight_mean"] == pytest.approx(metrics["rollout_corr/rollout_is_mean"], rel=1e-9)
    if family == "icepop" and level == "token":
        assert row["masked_token_fraction"] == pytest.approx(metrics["rollout_corr/rollout_is_oob_ratio"], rel=1e-9)
    if family == "tis" and level == "token":
        high = metrics["rollout_corr/rollout_is_ratio_fraction_high"]
        assert row["truncated_token_fraction"] == pytest.approx(high, rel=1e-9)


@pytest.mark.parametrize("option,threshold", [("seq_mean_k1", "0.999_1.001"), ("seq_mean_k1", "0.99_1.01"),
                                              ("seq_sum_k1", "0.5_2.0"), ("seq_mean_k3", "0.01")])
def test_rs_rows_match_running_that_configuration(option: str, threshold: str) -> None:
    old, rollout, mask = spiky_dump(6)
    batch = batch_from_padded(old, rollout, mask)
    name = next(s.name for s in LADDER if (s.option, s.threshold) == (option, threshold))
    row = next(r for r in run([batch], resolve(CorrectionConfig()), device="cpu", dtype="float64").overall.what_if
               if r["name"] == name)
    config = CorrectionConfig(rollout_rs=option, rollout_rs_threshold=threshold)
    metrics = run([batch], resolve(config), device="cpu", dtype="float64").overall.metrics
    prefix = f"rollout_corr/rollout_rs_{option}_"
    assert row["masked_token_fraction"] == pytest.approx(metrics[prefix + "masked_fraction"], rel=1e-9, abs=1e-12)
    assert row["masked_seq_fraction"] == pytest.approx(metrics[prefix + "seq_masked_fraction"], rel=1e-9, abs=1e-12)


def test_float32_is_close_to_float64() -> None:
    old, rollout, mask = spiky_dump(7)
    old32, rollout32 = old.astype(np.float32), rollout.astype(np.float32)
    rows = run([batch_from_padded(old32, rollout32, mask)], resolve(CorrectionConfig()), device="cpu",
               dtype="float32").overall.what_if
    want = reference(old32.astype(np.float64), rollout32.astype(np.float64), mask)
    for row in rows:
        for key, value in want[row["name"]].items():
            assert_close(row[key], value, 1e-4, 1e-7, (row["name"], key))
