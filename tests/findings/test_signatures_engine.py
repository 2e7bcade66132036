"""The signatures accumulator against float64 numpy, and the same numbers however the dump is chunked."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import batch_from_padded

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.accumulators.signatures import SignaturesAccumulator
from mismatch_cli.engine.accumulators.worst_token import WorstTokens
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.core.protocol import ChunkDecisions
from mismatch_cli.engine.runner import run

pytestmark = pytest.mark.usefixtures("separate_chunks")  # batches split to cross chunk boundaries

SIGNATURE_KEYS = ("bitwise_equal_fraction", "temperature_slope", "best_fit_temperature", "shift_residual_ratio",
                  "constant_fill_fraction_old", "constant_fill_fraction_rollout", "k3_k1_ratio")


def dump(seed: int, rows: int = 40, width: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ragged rows with gaps, an empty row, NaN-excluded tokens, catastrophic tokens, zeros and constant runs."""
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(0.5, size=(rows, width))
    old = rollout + rng.normal(0.0, 0.05, size=(rows, width))
    old[rng.random((rows, width)) < 0.02] -= 12.0
    lengths = rng.integers(0, width + 1, size=rows)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int8)
    mask[rng.random((rows, width)) < 0.15] = 0
    mask[3] = 0
    old[rng.random((rows, width)) < 0.03] = np.nan
    rollout[rng.random((rows, width)) < 0.05] = 0.0  # one side exactly 0.0
    old[rng.random((rows, width)) < 0.02] = 0.0
    same = rng.random((rows, width)) < 0.05
    old[same] = rollout[same]  # bitwise equal tokens
    mask[5, :10] = mask[7, :5] = 1
    rollout[5, 1:10], old[5, 1:10] = -3.0, -rng.exponential(0.3, size=9)  # a run of one constant, rollout side
    old[7, 0:5], rollout[7, 0:5] = -4.0, -rng.exponential(0.3, size=5)  # and on the old side
    return old, rollout, mask


def reference(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> dict:
    """Everything the accumulator reports, straight from the definitions, row by row in float64."""
    xs, ys, pairs, aligned, forward, backward = [], [], 0, 0.0, 0.0, 0.0
    fills = {"zero_old": 0, "zero_rollout": 0, "repeat_old": 0, "repeat_rollout": 0, "fill_old": 0,
             "fill_rollout": 0}
    for o_row, r_row, m_row in zip(old, rollout, mask, strict=True):  # a reference, not the engine
        keep = (m_row > 0) & np.isfinite(o_row) & np.isfinite(r_row)
        o, r = o_row[keep], r_row[keep]
        xs.append(o)
        ys.append(r)
        far = np.abs(o - r) > math.log(2)
        for name, side, other in (("old", o, r), ("rollout", r, o)):
            zero = (side == 0) & (other != 0)
            mine = np.concatenate(([False], side[1:] == side[:-1]))
            theirs = np.concatenate(([False], other[1:] == other[:-1]))
            repeat = mine & ~theirs
            fills[f"zero_{name}"] += int(zero.sum())
            fills[f"repeat_{name}"] += int(repeat.sum())
            fills[f"fill_{name}"] += int(((zero | repeat) & far).sum())
        if o.size > 1:
            pairs += o.size - 1
            aligned += float(((o[:-1] - r[:-1]) ** 2).sum())
            forward += float(((o[:-1] - r[1:]) ** 2).sum())
            backward += float(((o[1:] - r[:-1]) ** 2).sum())
    x, y = np.concatenate(xs), np.concatenate(ys)
    d = x - y
    n = x.size
    # Octave of |d|: 2^(e - 127) <= |d| < 2^(e - 126), as float32's exponent field; 0 holds zeros; d < 0 in
    # buckets 256 + e.
    mantissa_exponent = np.frexp(np.abs(d))[1]
    bucket = np.where(np.abs(d) == 0, 0, np.clip(mantissa_exponent + 126, 0, 255)) + 256 * (d < 0)
    ratio = np.exp(np.clip(d, -20, 20))
    chi2_terms = ratio**2
    k3 = np.exp(d) - d - 1
    slope = np.cov(x, y, bias=True)[0, 1] / np.var(x)
    return {
        "tokens": n,
        "bucket_tokens": np.bincount(bucket, minlength=512),
        "bucket_chi2": np.bincount(bucket, weights=chi2_terms, minlength=512),
        "bucket_ratio": np.bincount(bucket, weights=ratio, minlength=512),
        "bucket_exp_abs": np.bincount(bucket, weights=np.exp(np.abs(d)), minlength=512),
        "k3": k3.sum(), "k1": (-d).sum(),
        "pairs": pairs,
        **fills,
        "metrics": {
            "bitwise_equal_fraction": float(np.mean(x == y)),
            "temperature_slope": slope,
            "best_fit_temperature": 1 / slope,
            "shift_residual_ratio": min(forward, backward) / aligned,
            "constant_fill_fraction_old": fills["fill_old"] / n,
            "constant_fill_fraction_rollout": fills["fill_rollout"] / n,
            "k3_k1_ratio": k3.sum() / (-d).sum(),
        },
        "worst": int(np.argmax(np.abs(d))),
        "largest": int(np.argmax(d)),
        "x": x, "y": y,
    }


def split(batch: Batch) -> list[Batch]:
    """One chunk per row."""
    return [batch.slice_rows(i, i + 1) for i in range(batch.num_rows)]


def analyze(batches: list[Batch]) -> tuple[dict, dict]:
    result = run(batches, resolve(CorrectionConfig()), device="cpu", dtype="float64", bootstrap=0)
    return result.overall.metrics, result.overall.signatures


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_signatures_match_float64_numpy(seed: int) -> None:
    old, rollout, mask = dump(seed)
    ref = reference(old, rollout, mask)
    metrics, table = analyze([batch_from_padded(old, rollout, mask)])
    assert table["tokens"] == ref["tokens"]
    buckets = table["buckets"]
    # Ascending |d|, and in one octave d < 0 before d >= 0.
    occupied = sorted(np.flatnonzero(ref["bucket_tokens"]).tolist(), key=lambda i: (i % 256, -i))
    assert [b["tokens"] for b in buckets] == ref["bucket_tokens"][occupied].tolist()
    assert [(b["low"], b["sign"]) for b in buckets] == [(0.0 if i % 256 == 0 else 2.0 ** (i % 256 - 127),
                                                         -1 if i >= 256 else 1) for i in occupied]
    assert len({b["low"] for b in buckets}) < len(buckets)  # some octaves hold both signs, in two buckets
    for bucket in buckets:  # every token lies in its octave
        assert bucket["high"] == 2 * bucket["low"] or (bucket["low"] == 0 and bucket["high"] == 2.0**-126)
    for name, key in (("chi2_terms", "bucket_chi2"), ("ratio_sum", "bucket_ratio"), ("exp_abs_sum", "bucket_exp_abs")):
        np.testing.assert_allclose([b[name] for b in buckets], ref[key][occupied], rtol=1e-12, atol=1e-12)
    assert table["k3"] == pytest.approx(ref["k3"], rel=1e-12) and table["k1"] == pytest.approx(ref["k1"], rel=1e-12)
    assert table["pairs"] == ref["pairs"]
    for key in ("zero_old", "zero_rollout", "repeat_old", "repeat_rollout", "fill_old", "fill_rollout"):
        assert table[key] == ref[key], key
    assert table["fill_rollout"] >= 8 and table["fill_old"] >= 4  # the constant runs are found
    for key, value in ref["metrics"].items():
        assert metrics["diag/" + key] == pytest.approx(value, rel=1e-10, abs=1e-14), key
    worst = table["worst_token"]
    assert worst["abs_log_ratio"] == pytest.approx(abs(ref["x"] - ref["y"])[ref["worst"]], rel=1e-15)
    # The position names the token in the padded row: its values are there.
    assert old[worst["row"], worst["position"]] == pytest.approx(worst["old_log_prob"], rel=1e-15)
    assert rollout[worst["row"], worst["position"]] == pytest.approx(worst["rollout_log_prob"], rel=1e-15)
    row_mask = mask[worst["row"], : worst["position"] + 1] > 0
    assert worst["round"] == int((row_mask & ~np.concatenate(([False], row_mask[:-1]))).sum()) - 1
    # The largest d = old - rollout (what chi2_token's largest term comes from), placed the same way.
    largest = table["max_log_ratio_token"]
    d = ref["x"] - ref["y"]
    assert largest["log_ratio"] == pytest.approx(d[ref["largest"]], rel=1e-15) and largest["log_ratio"] > 0
    assert old[largest["row"], largest["position"]] == pytest.approx(largest["old_log_prob"], rel=1e-15)
    assert rollout[largest["row"], largest["position"]] == pytest.approx(largest["rollout_log_prob"], rel=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_row_per_chunk_gives_the_same_signatures(dtype: str) -> None:
    old, rollout, mask = dump(5)
    whole = batch_from_padded(old, rollout, mask)
    result_one = run([whole], resolve(CorrectionConfig()), device="cpu", dtype=dtype, bootstrap=0)
    result_many = run(split(whole), resolve(CorrectionConfig()), device="cpu", dtype=dtype, bootstrap=0)
    one, many = result_one.overall, result_many.overall
    for key in SIGNATURE_KEYS:
        a, b = one.metrics["diag/" + key], many.metrics["diag/" + key]
        assert b == pytest.approx(a, rel=1e-9, abs=1e-15), key
    for a, b in zip(one.signatures["buckets"], many.signatures["buckets"], strict=True):
        assert a["tokens"] == b["tokens"]
        for name in ("chi2_terms", "ratio_sum"):
            assert b[name] == pytest.approx(a[name], rel=1e-9, abs=1e-12)
    assert one.signatures["worst_token"] == many.signatures["worst_token"]
    assert one.signatures["max_log_ratio_token"] == many.signatures["max_log_ratio_token"]


def test_merging_shards_equals_one_pass() -> None:
    old, rollout, mask = dump(9)
    whole = batch_from_padded(old, rollout, mask)
    device, dtype = torch.device("cpu"), torch.float64
    one = SignaturesAccumulator(device)
    one.update(make_chunk(whole, device, dtype), ChunkDecisions())
    left, right = SignaturesAccumulator(device), SignaturesAccumulator(device)
    for i, part in enumerate(split(whole)):
        (left if i % 2 else right).update(make_chunk(part, device, dtype), ChunkDecisions())
    right.merge(left)
    a, b = one.compute(), right.compute()
    for key, value in a.metrics.items():
        assert b.metrics[key] == (None if value is None else pytest.approx(value, rel=1e-9, abs=1e-15)), key
    assert a.signatures["tail_slopes"] == b.signatures["tail_slopes"]
    assert a.signatures["worst_token"] == b.signatures["worst_token"]
    assert a.signatures["max_log_ratio_token"] == b.signatures["max_log_ratio_token"]


def test_shift_pairs_never_cross_a_row() -> None:
    # Two rows whose rollout is the old side shifted by one token inside each row; a cross-row pair would
    # add (old[last of row 0] - rollout[first of row 1])^2, which is large here.
    old = np.array([[-1.0, -2.0, -3.0, -4.0], [-9.0, -8.0, -7.0, -6.0]])
    rollout = np.array([[-0.5, -1.0, -2.0, -3.0], [-30.0, -9.0, -8.0, -7.0]])
    metrics, table = analyze([batch_from_padded(old, rollout, np.ones_like(old))])
    assert table["pairs"] == 6
    assert table["shift_forward"] == 0.0  # old[t] == rollout[t + 1] within each row
    assert metrics["diag/shift_residual_ratio"] == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_torch_kernels_give_the_numpy_kernels_sums(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    # The CPU folds with numpy in work buffers, a GPU with torch; run torch's path on the CPU to pin them equal.
    old, rollout, mask = dump(11)
    device = torch.device("cpu")
    chunks = [make_chunk(part, device, dtype) for part in split(batch_from_padded(old, rollout, mask))]
    host = SignaturesAccumulator(device)
    for chunk in chunks:
        host.update(chunk, ChunkDecisions())
    monkeypatch.setattr(SignaturesAccumulator, "_host_sums", SignaturesAccumulator._device_sums)
    monkeypatch.setattr(WorstTokens, "_host_picks", staticmethod(WorstTokens._device_picks))
    torch_path = SignaturesAccumulator(device)
    for chunk in chunks:
        torch_path.update(chunk, ChunkDecisions())
    a, b = host.table(), torch_path.table()
    assert a["zero_old"] + a["repeat_rollout"] + a["fill_old"] > 0  # the dump exercises the fills
    assert a["worst_token"]["log_ratio"] < 0 < a["max_log_ratio_token"]["log_ratio"]  # two different tokens
    for key, value in a.items():
        if isinstance(value, float):
            assert b[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
        elif key == "buckets":  # numpy's and torch's exp (in the chunk's dtype) differ in the last bit
            last_bit = 1e-6 if dtype == torch.float32 else 1e-13
            assert b[key] == [{**bucket, "exp_abs_sum": pytest.approx(bucket["exp_abs_sum"], rel=last_bit)}
                              for bucket in value], key
            assert [x["exp_abs_sum"] for x in b[key]] == pytest.approx([x["exp_abs_sum"] for x in value],
                                                                       rel=last_bit)
        else:
            assert b[key] == value, key
