"""The streaming Poisson bootstrap: hash, weights, replicate formulas, chunking invariance and coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import batch_from_padded
from test_chunking import split
from test_numpy_reference import random_dump

from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.analysis import BatchAccumulator
from mismatch_cli.engine.core import bootstrap as bs
from mismatch_cli.engine.core.bootstrap import BootstrapAccumulator, poisson_weights, source_key
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.core.protocol import ChunkDecisions
from mismatch_cli.engine.runner import run

CPU = torch.device("cpu")
MASK64 = (1 << 64) - 1


def splitmix_reference(x: int) -> int:
    """splitmix64's finalizer in plain Python integers."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def test_mix64_is_splitmix64_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    values = [int(v) for v in rng.integers(0, 2**63, size=500, dtype=np.int64)] + [0, 1, 2**63 - 1]
    values += [(v << 1) | 1 for v in values[:100]]  # patterns with the top bit set
    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in (v & MASK64 for v in values)]
    torch_out = bs.mix64(torch.tensor(signed, dtype=torch.int64)).tolist()
    numpy_out = bs._mix_numpy(np.array([v & MASK64 for v in values], dtype=np.uint64)).tolist()
    expected = [splitmix_reference(v) for v in values]
    assert [t & MASK64 for t in torch_out] == expected
    assert numpy_out == expected


def test_numpy_and_torch_paths_draw_the_same_uniforms() -> None:
    for key, first, count, k in ((-5, 3, 257, 197), (2**62 + 7, 10**9, 31, 200), (0, 0, 1, 1)):
        rows = np.arange(first, first + count)
        a = bs._uniforms_numpy(key, rows, k).astype(np.int64)
        b = bs._uniforms_torch(key, rows, k, CPU).numpy()
        assert np.array_equal(a, b)
        scattered = rows[::3]  # an interleaved --by part's rows: copied to the device, not made there
        assert np.array_equal(bs._uniforms_torch(key, scattered, k, CPU).numpy(), a[::3])


def test_weights_are_poisson_one() -> None:
    w = poisson_weights(source_key(0, "x.parquet"), np.arange(20_000), 200).numpy().ravel()  # 4M draws
    se = 1.0 / math.sqrt(w.size)
    assert abs(w.mean() - 1.0) < 5 * se
    assert abs(w.var() - 1.0) < 10 * se
    for k in range(5):
        p = math.exp(-1.0) / math.factorial(k)
        assert abs(np.mean(w == k) - p) < 5 * math.sqrt(p * (1 - p) / w.size) + 1e-5, k
    assert w.min() == 0 and w.max() >= 6


def test_weights_are_a_pure_function_of_seed_file_and_row() -> None:
    key = source_key(0, "dumps/a.parquet")
    whole = poisson_weights(key, np.arange(100), 200)
    assert torch.equal(poisson_weights(key, np.arange(37, 57), 200), whole[37:57])
    assert torch.equal(poisson_weights(key, np.array([90, 3, 41]), 200), whole[[90, 3, 41]])  # scattered rows
    assert torch.equal(poisson_weights(key, np.arange(5, 15), 50), whole[5:15, :50])  # a replicate does not depend on K
    assert torch.equal(poisson_weights(source_key(0, "./dumps//a.parquet"), np.arange(100), 200), whole)
    assert not torch.equal(poisson_weights(source_key(0, "dumps/b.parquet"), np.arange(100), 200), whole)
    assert not torch.equal(poisson_weights(source_key(1, "dumps/a.parquet"), np.arange(100), 200), whole)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_weights_equal_cpu_weights() -> None:
    key = source_key(3, "f.safetensors")
    cpu = poisson_weights(key, np.arange(1000, 6000), 200, CPU)
    cuda = poisson_weights(key, np.arange(1000, 6000), 200, torch.device("cuda"))
    assert torch.equal(cuda.cpu(), cpu)


# ------------------------------------------------------------------------------ replicates against numpy


def _row_sums(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask > 0, values, 0.0).sum(axis=1)


def test_replicates_match_an_independent_numpy_computation() -> None:
    old, rollout, mask = random_dump(4, rows=50)
    batch = batch_from_padded(old, rollout, mask, source="case.parquet")
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    accumulator = BatchAccumulator(correction, CPU, bootstrap=200)
    accumulator.update(make_chunk(batch, CPU, torch.float64))
    ours = accumulator.bootstrap.replicate_metrics()

    w = poisson_weights(source_key(0, "case.parquet"), np.arange(50), 200).numpy()  # [rows, K]
    delta = old - rollout
    n = (mask > 0).sum(axis=1).astype(float)
    s = _row_sums(delta, mask)
    ratio = np.exp(np.clip(delta, -20, 20))
    tokens = w.T @ n + 1e-8
    kl = w.T @ _row_sums(-delta, mask) / tokens
    chi2 = w.T @ _row_sums(ratio**2, mask) / tokens - 1
    rows = w.sum(axis=0)
    chi2_seq = w.T @ np.exp(2 * np.clip(s, -20, 20)) / rows - 1
    log_ppl_diff = -s / (n + 1e-8)
    ppl_ratio = w.T @ np.exp(log_ppl_diff) / rows
    mean_ratio = w.T @ _row_sums(ratio, mask) / tokens
    ess = (mean_ratio + 1e-8) ** 2 / (w.T @ _row_sums(ratio**2, mask) / tokens)
    is_weight = np.minimum(ratio, 2.0)
    is_mean = w.T @ _row_sums(is_weight, mask) / tokens
    is_sq = w.T @ _row_sums(is_weight**2, mask) / tokens
    valid = n > 0
    seq_w = np.exp(np.clip(s, -20, 20)) * valid
    kish = (w.T @ seq_w) ** 2 / ((w.T @ valid.astype(float)) * (w.T @ seq_w**2))
    expected = {
        "rollout_corr/kl": kl,
        "rollout_corr/chi2_token": chi2,
        "rollout_corr/chi2_seq": chi2_seq,
        "rollout_corr/ppl_ratio": ppl_ratio,
        "rollout_corr/log_ppl_abs_diff": w.T @ np.abs(log_ppl_diff) / rows,
        "diag/logprob_abs_diff_mean": w.T @ _row_sums(np.abs(delta), mask) / (w.T @ n),
        "diag/ess_token": ess,
        "diag/ess_seq_kish": kish,
        "rollout_corr/rollout_is_mean": is_mean,
        "rollout_corr/rollout_is_eff_sample_size": 1 / (is_sq / (is_mean + 1e-8) ** 2),
        "rollout_corr/rollout_is_std": np.sqrt(np.maximum(is_sq - is_mean**2, 0)),
    }
    for key, values in expected.items():
        np.testing.assert_allclose(ours[key], values, rtol=1e-10, atol=1e-14, err_msg=key)


@pytest.mark.parametrize("config", [
    {"rollout_is": "sequence", "rollout_is_threshold": 3.0},
    {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.7_1.6,0.01"},
    {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.3"},
])
def test_unit_weights_reproduce_the_point_metrics(config: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every weight 1, each replicate is the reported metric itself (same ratio of the same sums)."""
    old, rollout, mask = random_dump(9, rows=40)
    batch = batch_from_padded(old, rollout, mask)
    monkeypatch.setattr(bs, "poisson_weights", lambda key, rows, k, device=None: torch.ones(
        len(rows), k, dtype=torch.float64))
    accumulator = BatchAccumulator(resolve(CorrectionConfig(**config)), CPU, bootstrap=3)
    accumulator.update(make_chunk(batch, CPU, torch.float64))
    metrics = accumulator.compute().metrics
    replicates = accumulator.bootstrap.replicate_metrics()
    assert len(replicates) >= 10
    for key, values in replicates.items():
        rel = 1e-7 if key.endswith("seq_masked_fraction") else 1e-9  # verl rounds that one to float32
        assert values == pytest.approx([metrics[key]] * 3, rel=rel, abs=1e-12), key


# ----------------------------------------------------------------------- chunking, merging, settings


@pytest.mark.parametrize("config", [
    {},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "token_k2,seq_sum_k1",
     "rollout_rs_threshold": "0.02,0.3_2.5"},
])
def test_intervals_do_not_depend_on_chunking(config: dict) -> None:
    old, rollout, mask = random_dump(11, rows=60)
    whole = batch_from_padded(old, rollout, mask, source="w.parquet")
    correction = resolve(CorrectionConfig(**config))
    one = run([whole], correction, device="cpu", dtype="float64").overall.intervals
    assert "rollout_corr/kl" in one and "diag/ess_token" in one
    for cuts in (list(range(1, 60)), [7, 30, 31]):  # single rows; a few uneven chunks
        many = run(split(whole, cuts), correction, device="cpu", dtype="float64").overall.intervals
        assert many.keys() == one.keys()
        for key, (low, high) in one.items():
            assert many[key] == pytest.approx([low, high], rel=1e-11, abs=1e-15), key


def test_merged_shards_equal_one_pass() -> None:
    old, rollout, mask = random_dump(3, rows=50)
    whole = batch_from_padded(old, rollout, mask)
    single = BootstrapAccumulator(200, CPU)
    single.update(make_chunk(whole, CPU, torch.float64), ChunkDecisions())
    shards = []
    for part in split(whole, [9, 25, 26]):
        shard = BootstrapAccumulator(200, CPU)
        shard.update(make_chunk(part, CPU, torch.float64), ChunkDecisions())
        shards.append(shard)
    merged = shards[2]
    for shard in (shards[0], shards[3], shards[1]):
        merged.merge(shard)
    torch.testing.assert_close(merged.sums, single.sums, rtol=1e-12, atol=1e-12)


def test_zero_replicates_disables_the_bootstrap() -> None:
    old, rollout, mask = random_dump(1, rows=20)
    result = run([batch_from_padded(old, rollout, mask)], resolve(CorrectionConfig()), device="cpu", bootstrap=0)
    assert result.overall.intervals == {}


# ------------------------------------------------------------------------------------------- coverage


def coverage(trials: int = 200, rows: int = 300, mu: float = 0.01, sigma: float = 0.1) -> dict[str, float]:
    """How often the 95 % interval covers the true value, over independent synthetic datasets.

    Token log-ratios are iid N(mu, sigma^2), so kl = -mu, chi2_token = exp(2 mu + 2 sigma^2) - 1 and
    ess_token = exp(-sigma^2) (up to verl's 1e-8 terms) whatever the row lengths.
    """
    truth = {
        "rollout_corr/kl": -mu,
        "rollout_corr/chi2_token": math.exp(2 * mu + 2 * sigma**2) - 1,
        "diag/ess_token": math.exp(-(sigma**2)),
    }
    covered = dict.fromkeys(truth, 0)
    rng = np.random.default_rng(2024)
    for trial in range(trials):
        lengths = rng.integers(5, 41, size=rows)
        width = int(lengths.max())
        rollout = -rng.exponential(0.5, size=(rows, width))
        old = rollout + rng.normal(mu, sigma, size=(rows, width))
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(float)
        accumulator = BootstrapAccumulator(200, CPU)
        accumulator.update(make_chunk(batch_from_padded(old, rollout, mask, source=f"trial{trial}"), CPU,
                                      torch.float64), ChunkDecisions())
        intervals = accumulator.compute().intervals
        for key, value in truth.items():
            low, high = intervals[key]
            covered[key] += low <= value <= high
    return {key: count / trials for key, count in covered.items()}


def test_bootstrap_interval_covers_the_truth_at_the_nominal_rate() -> None:
    rates = coverage()
    # 200 trials: the binomial standard error at 95 % is 1.5 points; percentile intervals run a little narrow.
    for key, rate in rates.items():
        assert 0.89 <= rate <= 0.99, (key, rate)


def test_too_few_replicates_give_no_interval_and_say_so() -> None:
    """A 95 % percentile interval of 5 replicates is single draws that may miss the estimate: none, with a note."""
    old, rollout, mask = random_dump(4, rows=30)
    batch = batch_from_padded(old, rollout, mask)
    few = BatchAccumulator(resolve(CorrectionConfig()), CPU, bootstrap=bs.MIN_INTERVAL_REPLICATES - 1)
    enough = BatchAccumulator(resolve(CorrectionConfig()), CPU, bootstrap=bs.MIN_INTERVAL_REPLICATES)
    for accumulator in (few, enough):
        accumulator.update(make_chunk(batch, CPU, torch.float64))
    assert few.compute().intervals == {}
    assert any("too few for 95 % intervals" in note for note in few.compute().notes)
    assert enough.compute().intervals
