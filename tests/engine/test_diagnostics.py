"""The `diag/` keys, quantiles, histograms and worst sequences against independent float64 numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import batch_from_padded
from test_chunking import split
from test_numpy_reference import random_dump

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.analysis import BatchAccumulator
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.runner import run

SIGNED = {"log_ratio_p001": 0.001, "log_ratio_p01": 0.01, "log_ratio_p50": 0.5, "log_ratio_median": 0.5,
          "log_ratio_p99": 0.99, "log_ratio_p999": 0.999}
ABSOLUTE = {"abs_log_ratio_p50": 0.5, "abs_log_ratio_p90": 0.9, "abs_log_ratio_p99": 0.99, "abs_log_ratio_p999": 0.999}
DIAG_KEYS = {
    "logprob_abs_diff_mean", "logprob_abs_diff_max", "token_mult_prob_error", "log_ratio_mean", "log_ratio_median",
    "log_ratio_neg_fraction", "prob_abs_diff_mean", "prob_abs_diff_max", "prob_abs_diff_std", "prob_pearson_corr",
    "log_ratio_p001", "log_ratio_p01", "log_ratio_p50", "log_ratio_p99", "log_ratio_p999", "abs_log_ratio_p50",
    "abs_log_ratio_p90", "abs_log_ratio_p99", "abs_log_ratio_p999", "ess_token", "ess_seq_kish", "sequences",
    "valid_tokens", "empty_rows", "rounds", "nonfinite_tokens", "sentinel_tokens",
    # The bug signatures' keys (checked against numpy in tests/findings/test_signatures_engine.py).
    "bitwise_equal_fraction", "temperature_slope", "best_fit_temperature", "shift_residual_ratio",
    "constant_fill_fraction_old", "constant_fill_fraction_rollout", "k3_k1_ratio", "temperature_estimate",
    "ratio_mean", "ratio_mean_se",
}


def dirty_dump(seed: int):
    """A random padded dump with NaN and -9999 on a few valid tokens (excluded and counted)."""
    old, rollout, mask = random_dump(seed, rows=41, width=29)
    rng = np.random.default_rng(seed + 100)
    valid = np.argwhere(mask > 0)
    picks = valid[rng.choice(len(valid), size=4, replace=False)]
    old[tuple(picks[0])] = np.nan
    rollout[tuple(picks[1])] = np.inf
    old[tuple(picks[2])] = -9999.0
    rollout[tuple(picks[3])] = -1e4
    return old, rollout, mask


def bracket_ok(got: float, values: np.ndarray, q: float, rel: float = 0.005) -> bool:
    """|got - exact quantile| <= rel * the larger neighbouring order statistic (sound near zero too)."""
    ordered = np.sort(values)
    position = q * (ordered.size - 1)
    low, high = ordered[math.floor(position)], ordered[math.ceil(position)]
    return abs(got - np.quantile(values, q)) <= rel * max(abs(low), abs(high)) + 1e-300


def reference(old, rollout, mask) -> dict[str, float]:
    """Every diag/ key by its definition (SPEC §3.4), in float64 numpy and plain loops."""
    with np.errstate(invalid="ignore"):
        keep = (mask > 0) & np.isfinite(old) & np.isfinite(rollout) & (old > -9000) & (rollout > -9000)
    masked = mask > 0
    delta = (old - rollout)[keep]
    p_old, p_rollout = np.exp(old[keep]), np.exp(rollout[keep])
    prob_diff = np.abs(p_old - p_rollout)
    ratio = np.exp(np.clip(delta, -20, 20))
    n = delta.size
    mean_w = ratio.sum() / (n + 1e-8)
    ess_token = 1.0 / (((ratio / (mean_w + 1e-8)) ** 2).sum() / (n + 1e-8))  # verl: 1 / MM((w / MM(w))^2)
    row_sums = [sum(float(old[i, t] - rollout[i, t]) for t in range(old.shape[1]) if keep[i, t])
                for i in range(old.shape[0]) if keep[i].any()]
    weights = np.exp(np.clip(np.array(row_sums), -20, 20))
    rounds = sum(int(np.sum(np.diff(np.concatenate([[0], row.astype(int)])) == 1)) for row in masked)
    capped = np.exp(np.minimum(delta, 1.0))
    return {
        "ratio_mean": capped.mean(),
        "ratio_mean_se": capped.std(ddof=1) / math.sqrt(n),
        "logprob_abs_diff_mean": np.abs(delta).mean(),
        "logprob_abs_diff_max": np.abs(delta).max(),
        "token_mult_prob_error": np.exp(np.abs(delta)).mean(),
        "log_ratio_mean": delta.mean(),
        "log_ratio_neg_fraction": float((delta < 0).mean()),
        "prob_abs_diff_mean": prob_diff.mean(),
        "prob_abs_diff_max": prob_diff.max(),
        "prob_abs_diff_std": prob_diff.std(ddof=1),
        "prob_pearson_corr": np.corrcoef(p_old, p_rollout)[0, 1],
        "ess_token": ess_token,
        "ess_seq_kish": weights.sum() ** 2 / (weights.size * (weights**2).sum()),
        "sequences": float(old.shape[0]),
        "valid_tokens": float(n),
        "empty_rows": float((~keep.any(axis=1)).sum()),
        "rounds": float(rounds),
        "nonfinite_tokens": float((masked & ~(np.isfinite(old) & np.isfinite(rollout))).sum()),
        "sentinel_tokens": float((masked & np.isfinite(old) & np.isfinite(rollout)
                                  & ((old <= -9000) | (rollout <= -9000))).sum()),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_diag_key_against_numpy(seed: int) -> None:
    old, rollout, mask = dirty_dump(seed)
    result = run([batch_from_padded(old, rollout, mask)], resolve(CorrectionConfig()), device="cpu",
                 dtype="float64")
    metrics = {k[len("diag/"):]: v for k, v in result.overall.metrics.items() if k.startswith("diag/")}
    assert set(metrics) == DIAG_KEYS
    want = reference(old, rollout, mask)
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    with np.errstate(invalid="ignore"):
        keep = (mask > 0) & np.isfinite(old) & np.isfinite(rollout) & (old > -9000) & (rollout > -9000)
    delta = (old - rollout)[keep]
    for key, q in SIGNED.items():
        assert bracket_ok(metrics[key], delta, q), key
    for key, q in ABSOLUTE.items():
        assert bracket_ok(metrics[key], np.abs(delta), q), key
    # 1 / the extreme quantile of rollout / old over tokens with old < -1, on the side the slope points; the
    # histogram's bins are 4 / 2048 wide.
    tail = (old[keep] < -1)
    share = (rollout[keep][tail] / old[keep][tail])
    slope = metrics["temperature_slope"]
    want_q = np.quantile(share, 0.999 if slope > 1 else 0.001)
    if tail.sum() >= 100:
        assert 1 / metrics["temperature_estimate"] == pytest.approx(want_q, abs=4 / 2048 + 1e-3 * abs(want_q))
    else:
        assert metrics["temperature_estimate"] is None


def test_float32_run_is_close_to_float64_numpy() -> None:
    old, rollout, mask = dirty_dump(5)
    result = run([batch_from_padded(old.astype(np.float32), rollout.astype(np.float32), mask)],
                 resolve(CorrectionConfig()), device="cpu", dtype="float32")
    want = reference(old.astype(np.float32).astype(np.float64), rollout.astype(np.float32).astype(np.float64), mask)
    for key, value in want.items():
        assert result.overall.metrics["diag/" + key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_quantiles_within_one_percent_on_20m_values() -> None:
    """20M tokens through the engine (streamed in bounded chunks): sketch vs numpy's exact quantiles."""
    rng = np.random.default_rng(11)
    n, width = 20_000_000, 1000
    rollout = -rng.exponential(0.5, size=n).astype(np.float32)
    old = (rollout + (0.002 + 0.01 * rng.standard_t(3, size=n))).astype(np.float32)
    batch = Batch(old_log_probs=old, rollout_log_probs=rollout, response_mask=np.ones(n, dtype=bool),
                  offsets=np.arange(0, n + 1, width, dtype=np.int64), source="big")
    result = run([batch], resolve(CorrectionConfig()), device="cpu", dtype="float32")
    delta = old.astype(np.float64) - rollout.astype(np.float64)
    levels = list(SIGNED.values())
    for (key, _), want in zip(SIGNED.items(), np.quantile(delta, levels), strict=True):
        assert abs(result.overall.metrics["diag/" + key] - want) <= 0.01 * abs(want), key
    np.abs(delta, out=delta)
    levels = list(ABSOLUTE.values()) + [0.9999]
    want_abs = np.quantile(delta, levels)
    for (key, _), want in zip(ABSOLUTE.items(), want_abs[:-1], strict=True):
        assert abs(result.overall.metrics["diag/" + key] - want) <= 0.01 * want, key
    assert abs(result.overall.quantiles["abs_log_ratio"]["0.9999"] - want_abs[-1]) <= 0.01 * want_abs[-1]
    histogram = result.overall.histograms["log_ratio"]
    assert sum(histogram["negative"]) + sum(histogram["positive"]) + histogram["zero"] == n


def test_exact_zeros_and_signs() -> None:
    """Equal log-probs give delta == 0 exactly: the median is 0, the zero bin counts them, signs split."""
    old = [[-1.0, -2.0, -0.5, -0.25, -3.0, -1.5, -0.75]]
    rollout = [[-1.0, -2.0, -0.5, -0.25, -2.0, -1.0, -1.0]]
    result = run([batch_from_padded(old, rollout, [[1] * 7])], resolve(CorrectionConfig()), device="cpu",
                 dtype="float64")
    metrics = result.overall.metrics
    assert metrics["diag/log_ratio_median"] == 0.0
    assert metrics["diag/log_ratio_neg_fraction"] == pytest.approx(2 / 7)
    histogram = result.overall.histograms["log_ratio"]
    assert histogram["zero"] == 4 and sum(histogram["negative"]) == 2 and sum(histogram["positive"]) == 1
    assert metrics["diag/log_ratio_p001"] == pytest.approx(-1.0, rel=0.005)
    assert metrics["diag/log_ratio_p999"] == pytest.approx(0.994 * 0.25, rel=0.005)  # 0.999 * 6 = 5.994


def _same(one, other, rel: float = 1e-12) -> None:
    if isinstance(one, dict):
        assert one.keys() == other.keys()
        for key in one:
            _same(one[key], other[key], rel)
    elif isinstance(one, list):
        assert len(one) == len(other)
        for a, b in zip(one, other, strict=True):
            _same(a, b, rel)
    elif isinstance(one, float) and isinstance(other, float):
        assert other == pytest.approx(one, rel=rel, abs=1e-15)
    else:
        assert one == other


def test_sketch_histograms_worst_and_what_if_do_not_depend_on_chunking() -> None:
    old, rollout, mask = random_dump(4, rows=60)
    whole = batch_from_padded(old, rollout, mask)
    correction = resolve(CorrectionConfig())
    one = run([whole], correction, device="cpu", dtype="float64").overall
    rng = np.random.default_rng(3)
    for count in (59, 7):
        cuts = sorted(rng.choice(np.arange(1, 60), size=count, replace=False).tolist())
        many = run(split(whole, cuts), correction, device="cpu", dtype="float64").overall
        for name in ("quantiles", "histograms", "worst_sequences", "what_if"):
            _same(getattr(one, name), getattr(many, name))


def test_shards_merge_in_any_order() -> None:
    old, rollout, mask = random_dump(6, rows=50)
    whole = batch_from_padded(old, rollout, mask)
    correction = resolve(CorrectionConfig())
    device = torch.device("cpu")
    single = BatchAccumulator(correction, device)
    single.update(make_chunk(whole, device, torch.float64))
    shards = []
    for part in split(whole, [9, 21, 22, 40]):
        shard = BatchAccumulator(correction, device)
        shard.update(make_chunk(part, device, torch.float64))
        shards.append(shard)
    merged = shards[4]
    for shard in (shards[2], shards[0], shards[3], shards[1]):
        merged.merge(shard)
    a, b = single.compute(), merged.compute()
    assert torch.equal(single.diagnostics.counts, merged.diagnostics.counts)
    _same(a.metrics, b.metrics, rel=1e-12)
    for name in ("quantiles", "histograms", "worst_sequences", "what_if"):
        _same(getattr(a, name), getattr(b, name))


def test_worst_sequences_against_a_plain_loop() -> None:
    old, rollout, mask = random_dump(8, rows=45)
    batch = batch_from_padded(old, rollout, mask, source="dump.parquet")
    batch = Batch(**{**batch.__dict__, "sequence_ids": np.array([f"uid-{i}" for i in range(45)]),
                     "first_row": 100})
    worst = run([batch], resolve(CorrectionConfig()), device="cpu", dtype="float64").overall.worst_sequences
    scores = []
    for i in range(45):
        deltas = [old[i, t] - rollout[i, t] for t in range(old.shape[1]) if mask[i, t] > 0]
        if deltas:
            scores.append((i, abs(sum(deltas) / len(deltas)), max(abs(d) for d in deltas), len(deltas),
                           max(deltas)))
    for criterion, column in (("abs_mean_log_ratio", 1), ("max_abs_log_ratio", 2), ("max_log_ratio", 4)):
        expected = sorted(scores, key=lambda s, c=column: (-s[c], s[0]))[:10]
        got = [w for w in worst if w["criterion"] == criterion]
        assert [w["rank"] for w in got] == list(range(1, 11))
        assert [w["row"] for w in got] == [100 + s[0] for s in expected]
        assert [w["id"] for w in got] == [f"uid-{s[0]}" for s in expected]
        assert all(w["file"] == "dump.parquet" and w["tokens"] == s[3] for w, s in zip(got, expected, strict=True))
        assert [w[criterion] for w in got] == pytest.approx([s[column] for s in expected], rel=1e-12)


def test_position_profile_against_a_plain_loop() -> None:
    old, rollout, mask = random_dump(9, rows=30, width=70)
    profile = run([batch_from_padded(old, rollout, mask)], resolve(CorrectionConfig()), device="cpu",
                  dtype="float64").overall.histograms["position"]
    width = profile["bin_width"]
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if mask[i, t] > 0:
                sums[t // width] = sums.get(t // width, 0.0) + abs(old[i, t] - rollout[i, t])
                counts[t // width] = counts.get(t // width, 0) + 1
    assert profile["tokens"] == [counts.get(b, 0) for b in range(len(profile["tokens"]))]
    for b, mean in enumerate(profile["abs_log_ratio_mean"]):
        assert mean == (pytest.approx(sums[b] / counts[b], rel=1e-12) if counts.get(b) else None)
