"""The fused CPU sweep (engine/kernels/sweep.py) gives what the numpy passes give, on every kind of chunk."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from helpers import assert_same_tree

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.accumulators.signatures import FILL_LOG_RATIO, SLOPE_BINS, SLOPE_RANGE, TAIL_NATS, token_sums
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.kernels import sweep
from mismatch_cli.engine.runner import run

pytestmark = pytest.mark.skipif(not sweep.available(), reason="numba is not installed")


def dirty_batch(seed: int, rows: int = 90, steps: bool = False, turns: int = 0) -> Batch:
    """float32 rows of 0-150 positions with every kind of token the sums treat apart; `turns`: rows of at most
    that many rounds (masked-out gaps between them), else random gaps (rows of many rounds)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 150, size=rows)
    lengths[rng.integers(0, rows, size=3)] = 0  # empty rows
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    rollout = -rng.exponential(0.6, size=n)
    old = rollout + rng.normal(0.0, 0.05, size=n) * (1 + np.abs(rollout))
    pick = rng.random(n)
    old[pick < 0.02] -= rng.uniform(3, 30, size=int((pick < 0.02).sum()))  # spikes (exp|d| past float32: inf)
    old[(pick > 0.02) & (pick < 0.04)] = 0.0  # one side exactly 0.0 (fills when far)
    rollout[(pick > 0.04) & (pick < 0.05)] = 0.0
    repeat = np.flatnonzero((pick > 0.05) & (pick < 0.09))
    repeat = repeat[repeat > 0]
    old[repeat] = old[repeat - 1]  # a side repeating its previous token (fills when far and the other moves)
    rollout[(pick > 0.09) & (pick < 0.10)] = old[(pick > 0.09) & (pick < 0.10)]  # bitwise equal
    old[(pick > 0.10) & (pick < 0.11)] = 0.003  # positive log-probs (kept)
    old[(pick > 0.11) & (pick < 0.115)] = np.nan  # excluded tokens
    rollout[(pick > 0.115) & (pick < 0.12)] = -9999.0
    mask = rng.random(n) > 0.15  # multi-turn gaps
    if turns:
        mask[:] = True
        for start, stop in zip(offsets[:-1], offsets[1:], strict=True):  # turns - 1 gaps of 1-5 positions
            for gap in rng.integers(start, max(stop, start + 1), size=turns - 1):
                mask[gap:min(gap + int(rng.integers(1, 6)), stop)] = False
    return Batch(old_log_probs=old.astype(np.float32), rollout_log_probs=rollout.astype(np.float32),
                 response_mask=mask, offsets=offsets, source="dirty.parquet",
                 steps=np.repeat(np.arange(3), [rows // 3, rows // 3, rows - 2 * (rows // 3)]) if steps else None)


TABLES = ("metrics", "rounds", "rounds_from_end", "intervals", "quantiles", "histograms", "worst_sequences",
          "what_if", "signatures", "notes")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("config", [{}, {"rollout_is": "token", "rollout_is_threshold": 2.0,
                                         "rollout_rs": "seq_mean_k1,token_k3", "rollout_rs_threshold": "1.01,0.5"},
                                     {"rollout_rs": "token_k1,token_k2,seq_max_k2",
                                      "rollout_rs_threshold": "0.9_1.1,0.01,0.5"},
                                     {"rollout_is": "token", "rollout_is_threshold": "0.8_1.2",
                                      "rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "3.0"}],
                         ids=["default", "full", "token_rs", "icepop"])
def test_sweep_gives_the_numpy_passes_results(seed: int, config: dict) -> None:
    batches = [dirty_batch(seed, steps=True), dirty_batch(seed + 10, rows=7, steps=True),
               dirty_batch(seed + 20, steps=True, turns=4), dirty_batch(seed + 30, rows=40, turns=1)]
    correction = resolve(CorrectionConfig(**config))
    with sweep.forced(False):
        numpy_path = run(batches, correction, device="cpu", by_step=True)
    with sweep.forced(True):
        fused = run(batches, correction, device="cpu", by_step=True)
    for name in TABLES:
        assert_same_tree(getattr(numpy_path.overall, name), getattr(fused.overall, name), 1e-9, name)
    assert numpy_path.steps.keys() == fused.steps.keys()
    for step, result in numpy_path.steps.items():
        assert_same_tree(result.metrics, fused.steps[step].metrics, 1e-9, f"step {step}")


@pytest.mark.parametrize("config", [{}, {"rollout_is": "token", "rollout_is_threshold": 2.0},
                                    {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
                                    {"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "0.9_1.1,0.5"}],
                         ids=["default", "token_is", "sequence_is", "rs"])
def test_the_kernels_preloaded_for_a_configuration_are_those_its_run_calls(monkeypatch, config: dict) -> None:
    # --jobs loads these in the parent before it forks; one missing would be loaded again in every worker.
    called: set[str] = set()
    compiled = sweep._compiled
    monkeypatch.setattr(sweep, "_compiled", lambda name: called.add(name) or compiled(name))
    correction = resolve(CorrectionConfig(**config))
    with sweep.forced(True):
        run([dirty_batch(5, steps=True), dirty_batch(6, turns=4)], correction, device="cpu", by_step=True)
    assert called == set(sweep.kernels_for(bool(correction.rs_options), correction.is_level == "token"))


def test_the_sweep_on_the_callers_thread_gives_the_threads_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # --jobs N on N cores runs each process's token sweep inline: no thread is started, and no number moves.
    batches = [dirty_batch(7, steps=True), dirty_batch(8, turns=4)]
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    with sweep.forced(True):
        threaded = run(batches, correction, device="cpu", by_step=True)
        started: list[str] = []
        real_start = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or real_start(self))
        with sweep.inline(True):
            inline = run(batches, correction, device="cpu", by_step=True)
    assert "mismatch-sweep" not in started
    assert not sweep._INLINE[0]  # restored on leaving
    for name in TABLES:
        assert_same_tree(getattr(threaded.overall, name), getattr(inline.overall, name), 0.0, name)


def test_sweep_sums_match_float64_by_hand() -> None:
    # Two rows (3 and 2 valid tokens, one masked-out position between), values chosen so each count is known.
    old = np.array([-1.0, 0.0, -2.0, 5.0, -0.5, -0.5], dtype=np.float32)
    rollout = np.array([-1.0, -1.5, -2.0, 7.0, -3.0, -0.25], dtype=np.float32)
    mask = np.array([1, 1, 1, 0, 1, 1], dtype=bool)
    batch = Batch(old_log_probs=old, rollout_log_probs=rollout, response_mask=mask,
                  offsets=np.array([0, 4, 6]), source="hand")
    chunk = make_chunk(batch, torch.device("cpu"), torch.float32)
    with sweep.forced(True):
        sums = token_sums(chunk)
    assert sums is not None
    o = np.array([-1.0, 0.0, -2.0, -0.5, -0.5])
    r = np.array([-1.0, -1.5, -2.0, -3.0, -0.25])
    d = o - r
    got = sums.sums
    assert got["bitwise_equal"] == 2 and got["negative"] == 1
    assert got["zero_old"] == 1 and got["fill_old"] == 1  # old 0.0 against -1.5: |d| = 1.5 > ln 2
    assert got["repeat_old"] == 1 and got["fill_old"] == 1  # row 2 repeats -0.5, |d| 0.25: not far
    assert got["zero_rollout"] == got["repeat_rollout"] == got["fill_rollout"] == 0
    assert got["shift_aligned"] == pytest.approx(d[0] ** 2 + d[1] ** 2 + d[3] ** 2)  # pairs within rows only
    assert got["shift_forward"] == pytest.approx((o[0] - r[1]) ** 2 + (o[1] - r[2]) ** 2 + (o[3] - r[4]) ** 2)
    assert got["shift_backward"] == pytest.approx((o[1] - r[0]) ** 2 + (o[2] - r[1]) ** 2 + (o[4] - r[3]) ** 2)
    assert got["old_rollout"] == pytest.approx((o * r).sum())
    # The sums of |d|, d, old and rollout come from the row-sum kernel, which seeds the chunk's totals once.
    assert "sum_abs" not in got and chunk.total(chunk.abs_log_ratio).item() == pytest.approx(np.abs(d).sum())
    assert chunk.total(chunk.log_ratio).item() == pytest.approx(d.sum())
    assert chunk.total(chunk.old).item() == pytest.approx(o.sum()) and chunk.total(chunk.rollout).item() == r.sum()
    p = np.exp(o) - np.exp(r)
    assert got["max_abs_d"] == pytest.approx(np.abs(p).max(), rel=1e-6)
    assert got["abs_d"] == pytest.approx(np.abs(p).sum(), rel=1e-6)
    # Position bins of 32: every valid token sits in bin 0; the tail histogram holds old < -1 only (one token).
    assert sums.position_tokens.tolist() == [5] and sums.position_sums[0].item() == pytest.approx(np.abs(d).sum())
    assert sums.slopes.sum().item() == 1
    assert int(sums.slopes.argmax()) == int(1.0 * SLOPE_BINS / SLOPE_RANGE)  # rollout / old = 1 at old = -2
    assert int(sums.sketch.sum()) == 5 and sums.octaves[0].sum().item() == 5
    assert TAIL_NATS == 1.0 and FILL_LOG_RATIO == pytest.approx(math.log(2))


def test_sweep_is_taken_only_where_it_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert token_sums(make_chunk(dirty_batch(4), cpu, torch.float32, fused=True)) is not None
    assert token_sums(make_chunk(dirty_batch(4), cpu, torch.float32)) is None  # not asked: a small input
    with sweep.forced(True):
        assert token_sums(make_chunk(dirty_batch(4), cpu, torch.float64, fused=True)) is None  # float64: numpy
    monkeypatch.delenv("MISMATCH_FUSED", raising=False)
    assert sweep.worth_it(sweep.MIN_INPUT_BYTES) and not sweep.worth_it(sweep.MIN_INPUT_BYTES - 1)
    monkeypatch.setenv("MISMATCH_FUSED", "always")
    assert sweep.worth_it(0)
    code = ("import sys, mismatch_cli; mismatch_cli.analyze('sample_data/single_turn.parquet'); "
            "assert 'numba' not in sys.modules, 'numba imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env={k: v for k, v in os.environ.items()
                                                                  if k != "MISMATCH_FUSED"})


def test_the_one_time_compile_is_said_once_and_quiet_under_q(tmp_path) -> None:
    env = {**os.environ, "MISMATCH_FUSED": "always", "MISMATCH_CACHE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "mismatch_cli", "analyze", "sample_data/single_turn.parquet", "--format", "json",
               "-o", str(tmp_path / "report.json")]
    quiet = subprocess.run([*command, "-q"], env=env, capture_output=True, text=True, check=True)
    assert quiet.stderr == ""
    (tmp_path / "numba").joinpath(next(p.name for p in (tmp_path / "numba").iterdir() if p.name.startswith("sweep-"))
                                  ).unlink()  # as if the compile had not been said yet
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert first.stderr.splitlines()[0] == f"mismatch: compiling the fused CPU sweep once (cached in {tmp_path}/numba)"
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert "compiling" not in again.stderr


def test_the_sweep_buckets_as_the_accumulators_do() -> None:
    from mismatch_cli.engine.accumulators import diagnostics, signatures

    assert sweep.POSITION_BIN == diagnostics.POSITION_BIN
    assert sweep.OCTAVES == 2 * signatures.NUM_BUCKETS and 1 << (32 - sweep.OCTAVE_SHIFT) == sweep.OCTAVES
    values = torch.tensor([0.0, -0.0, 1e-30, -3.5, 7.25, 1e30, -2e-3], dtype=torch.float32)
    bits = values.numpy().view(np.uint32)
    assert ((bits >> sweep.OCTAVE_SHIFT).astype(np.int64) == signatures.signed_octaves(values).numpy()).all()
    assert ((bits >> 16) & (sweep.SKETCH_SIZE - 1) == diagnostics.signed_buckets(values).numpy()).all()


def test_a_token_rs_option_in_one_pass_matches_float64_by_hand() -> None:
    # Three rows (3, 0 and 2 tokens). 0.1 is not a float32: a token at float32(0.1) sits on the band's edge, and
    # torch compares a float32 tensor with a Python float in float32, so it is kept (a float64 test would not).
    edge = float(np.float32(0.1))
    stat = np.array([-0.5, edge, 0.3, 0.05, -0.2], dtype=np.float32)
    lengths = torch.tensor([3, 0, 2])
    got = sweep.option_sums(torch.from_numpy(stat), lengths, -0.25, 0.1, True)
    x = stat.astype(np.float64)
    low, high = float(np.float32(-0.25)), edge
    reject = (x < low) | (x > high)
    assert got.reject.tolist() == reject.tolist() == [True, False, True, False, False]
    assert got.row_rejects.tolist() == [2, 0, 0]
    assert got.row_sums.tolist() == pytest.approx([x[:3].sum(), 0.0, x[3:].sum()], rel=1e-15)
    clamped = np.clip(x, low, high)
    expected = {"sum": x.sum(), "sum_c": clamped.sum(), "sum_c_sq": (clamped ** 2).sum(), "count_high": 1,
                "count_low": 1, "rejected_tokens": 2, "max": x.max(), "min": x.min()}
    assert got.sums == pytest.approx(expected, rel=1e-15)
    one_sided = sweep.option_sums(torch.from_numpy(stat), lengths, 0.0, 0.1, False)
    assert one_sided.reject.tolist() == [False, False, True, False, False] and one_sided.sums["count_high"] == 1


@pytest.mark.parametrize("lower", [None, 0.8])
def test_token_is_weights_in_one_pass_are_torchs(lower: float | None) -> None:
    chunk = make_chunk(dirty_batch(5), torch.device("cpu"), torch.float32)
    raw = chunk.ratio_safe
    upper = 1.2 if lower else 2.0
    expected = raw.clamp(max=upper) if lower is None else torch.where((raw >= lower) & (raw <= upper), raw, 0.0)
    weight, row_sums, sums = sweep.is_weights(raw, chunk.lengths, upper, lower, lower or 1 / upper)
    assert torch.equal(weight, expected)  # the decision the rounds and the bootstrap read, bit for bit
    w = expected.double().numpy()
    assert sums["sum_w"] == pytest.approx(w.sum(), rel=1e-12) and sums["sum_w_sq"] == pytest.approx((w * w).sum())
    assert sums["count_high"] == int((raw > upper).sum()) and sums["max_w"] == w.max() and sums["min_w"] == w.min()
    assert row_sums.numpy() == pytest.approx(chunk.row_sum(expected).numpy(), rel=1e-12, abs=1e-12)


def test_a_nan_statistic_or_ratio_is_treated_as_torch_treats_it() -> None:
    # Unreachable for valid tokens (their statistics are finite), but the kernels mirror the reference anyway.
    nan = np.array([np.nan, 0.05], dtype=np.float32)
    lengths = torch.tensor([2])
    assert sweep.option_sums(torch.from_numpy(nan), lengths, -0.1, 0.1, True).reject.tolist() == [True, False]
    for lower in (None, 0.8):
        weight, _, _ = sweep.is_weights(torch.from_numpy(nan), lengths, 2.0, lower, lower or 0.5)
        raw = torch.from_numpy(nan)
        expected = raw.clamp(max=2.0) if lower is None else torch.where((raw >= lower) & (raw <= 2.0), raw, 0.0)
        assert torch.equal(weight.isnan(), expected.isnan()) and weight[1] == expected[1]


def _chunk_fields(chunk) -> dict:  # noqa: ANN001
    """Everything make_chunk hands the accumulators, as plain lists."""
    layout, runs = chunk.layout, chunk.runs
    fields = {"old": chunk.old, "rollout": chunk.rollout, "advantages": chunk.advantages, "lengths": chunk.lengths,
              "keep": layout.keep,
              "starts": layout.starts, "rounds_per_row": layout.rounds_per_row,
              **{f"run_{k}": getattr(runs, k) for k in (
                  "start", "row", "index", "index_from_end", "valid_tokens", "rounds_per_row")}}
    out = {k: None if v is None else v.numpy().tobytes() + str(v.dtype).encode() for k, v in fields.items()}
    out.update(quality=chunk.quality, counts=(int(layout.num_valid), int(layout.num_runs), int(layout.max_rounds),
                                              runs.count, runs.max_per_row))
    return out


def edge_batch() -> Batch:
    """Rows the dirty batches rarely hold: all masked, masked at either end, infinities and sentinels on either
    side, a one-position row, and a row that is one valid token between masked ones."""
    inf, nan = np.inf, np.nan
    old = [-1, -2, -3, 0, -inf, -9500, -0.5, 0.25, -1, -1, -1, -1, nan, -2, -1, inf, -1]
    rollout = [-1, -2, -3, -1, -1, -1, -9000, -0.25, -1, -1, -1, -1, -1, -2, -1, -1, -1]
    mask = [0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0]
    return Batch(old_log_probs=np.array(old, dtype=np.float32), rollout_log_probs=np.array(rollout, dtype=np.float32),
                 response_mask=np.array(mask, dtype=bool), offsets=np.array([0, 3, 3, 8, 9, 13, 17]), source="edge")


@pytest.mark.parametrize("seed", [5, 6])
def test_the_fused_layout_is_make_chunks_numpy_passes(seed: int) -> None:
    cpu = torch.device("cpu")
    advantaged = dirty_batch(seed, turns=2)
    advantaged = dataclasses.replace(advantaged, advantages=np.arange(advantaged.num_positions, dtype=np.float32))
    for batch in (dirty_batch(seed), dirty_batch(seed, turns=4), dirty_batch(seed, rows=3), edge_batch(), advantaged,
                  dirty_batch(seed).select_rows(np.zeros(90, dtype=bool))):
        with sweep.forced(False):
            reference = _chunk_fields(make_chunk(batch, cpu, torch.float32, fused=True))
        with sweep.forced(True):
            fused = make_chunk(batch, cpu, torch.float32, fused=True)
        assert fused.layout.found_runs is not None  # the fused pass ran
        assert _chunk_fields(fused) == reference


def test_the_fused_layout_by_hand() -> None:
    with sweep.forced(True):
        chunk = make_chunk(edge_batch(), torch.device("cpu"), torch.float32, fused=True)
    # Row 2 (positions 3-7): 0/-1 kept (one side zero), -inf out, -9500 and -9000 sentinels, 0.25 kept (positive);
    # row 4 (9-12): two rounds, the second ending in a NaN; row 5 (13-16): one round of -1 and +inf.
    assert chunk.quality == {"positions": 17, "masked_tokens": 10, "nonfinite_tokens": 3, "sentinel_tokens": 2,
                             "positive_logprob_tokens": 1, "one_side_zero_tokens": 1}
    assert chunk.lengths.tolist() == [0, 0, 2, 0, 2, 1]
    assert chunk.old.tolist() == [0.0, 0.25, -1.0, -1.0, -1.0]
    assert np.flatnonzero(chunk.layout.keep.numpy()).tolist() == [3, 7, 9, 11, 14]
    runs = chunk.runs
    assert runs.start.tolist() == [3, 9, 11, 14] and runs.row.tolist() == [2, 4, 4, 5]
    assert runs.index.tolist() == [0, 0, 1, 0] and runs.index_from_end.tolist() == [0, 1, 0, 0]
    assert runs.valid_tokens.tolist() == [2, 1, 1, 1] and runs.max_per_row == 2


def test_the_row_sum_kernel_derives_torchs_tensors_bit_for_bit() -> None:
    batch = dirty_batch(8, turns=3)
    batch.old_log_probs[::7] -= np.float32(40.0)  # exp(d) under exp(-20): the clamp's lower side
    batch.rollout_log_probs[::11] -= np.float32(120.0)  # exp(d) past float32: inf, k3 inf, the clamp's upper side
    cpu = torch.device("cpu")
    reference = make_chunk(batch, cpu, torch.float32)
    with sweep.forced(True):
        chunk = make_chunk(batch, cpu, torch.float32, fused=True)
        chunk.fuse_row_sums()
    assert torch.isinf(reference.k3).any() and (reference.ratio_safe == reference.ratio_safe.min()).sum() > 1
    for name in sweep.DERIVED:
        assert getattr(reference, name).numpy().tobytes() == getattr(chunk, name).numpy().tobytes(), name
    for name in ("old", "k3", "ratio_safe_sq", "abs_log_ratio"):  # float64 sums per row, against numpy's
        values = getattr(reference, name).numpy().astype(np.float64)
        ends = np.cumsum(reference.lengths.numpy())
        want = np.array([values[e - n:e].sum() for e, n in zip(ends, reference.lengths.numpy(), strict=True)])
        np.testing.assert_allclose(chunk.row_sum(getattr(chunk, name)).numpy(), want, rtol=1e-12, err_msg=name)


def test_the_what_if_candidates_in_one_pass_match_float64_by_hand() -> None:
    rng = np.random.default_rng(3)
    abs_log_ratio = np.abs(rng.normal(0, 0.3, 5000)).astype(np.float32)
    abs_log_ratio[17] = np.float32(0.25)  # on the bound: not above it, as torch's float32 gt has it
    ratio = np.exp(abs_log_ratio).astype(np.float32)
    ratio[abs_log_ratio > 0.6] = np.float32(4e8)  # huge candidate weights: the others are summed directly
    with sweep.forced(True):
        index, rest, rest_sq = sweep.candidates(torch.from_numpy(abs_log_ratio), torch.from_numpy(ratio), 0.25)
    above = abs_log_ratio > np.float32(0.25)
    assert index.tolist() == np.flatnonzero(above).tolist() and 17 not in index.tolist()
    others = ratio[~above].astype(np.float64)
    assert rest.item() == pytest.approx(others.sum(), rel=1e-13)
    assert rest_sq.item() == pytest.approx((ratio[~above] * ratio[~above]).astype(np.float64).sum(), rel=1e-13)


def test_the_rounds_catastrophic_count_takes_torchs_float32_boundary() -> None:
    from mismatch_cli.engine.accumulators.rounds import CATASTROPHIC_LOG_RATIO
    from mismatch_cli.engine.kernels.ops import count_in_segments

    edge = np.float32(CATASTROPHIC_LOG_RATIO)  # torch compares a float32 tensor against the float rounded so
    values = np.array([np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(np.inf)), 0.5, 30.0,
                       edge, 12.0], dtype=np.float32)
    run_tokens = torch.tensor([2, 0, 4, 1])
    with sweep.forced(True):
        _, _, over = sweep.round_sketches(torch.from_numpy(values), run_tokens, torch.tensor([0, 1, 0, 1]),
                                          torch.tensor([1, 0, 1, 0]), 2, CATASTROPHIC_LOG_RATIO)
    want = count_in_segments(torch.from_numpy(values) > CATASTROPHIC_LOG_RATIO, run_tokens)
    assert over.tolist() == [0, 0, 2, 1] and want.tolist() == [0.0, 0.0, 2.0, 1.0]


def test_a_safe_log_ratio_is_the_log_ratio_only_where_the_clamp_changes_nothing() -> None:
    from mismatch_cli.engine.accumulators.rejection import token_statistic

    cpu = torch.device("cpu")
    batch = dirty_batch(9, turns=2)
    np.maximum(batch.old_log_probs, batch.rollout_log_probs - np.float32(19), out=batch.old_log_probs)  # no spike
    inside = make_chunk(batch, cpu, torch.float32)
    assert inside.log_ratio.abs().max() <= 20 and inside.log_ratio_safe is inside.log_ratio
    inside.row_sum(inside.log_ratio)  # the k1 row sums then come from these, negated
    k1 = token_statistic(inside, "k1")
    assert torch.equal(inside.known_row_sum(k1), -inside.row_sum(inside.log_ratio))
    ends = np.cumsum(inside.lengths.numpy())
    by_hand = [(-inside.log_ratio.numpy()[e - n:e].astype(np.float64)).sum()
               for e, n in zip(ends, inside.lengths.numpy(), strict=True)]
    np.testing.assert_allclose(inside.row_sum(k1).numpy(), by_hand, rtol=1e-12)
    batch.old_log_probs[3] = np.float32(-40.0)  # one token past the bound: the clamp is taken
    outside = make_chunk(batch, cpu, torch.float32)
    assert outside.log_ratio_safe is not outside.log_ratio
    assert torch.equal(outside.log_ratio_safe, outside.log_ratio.clamp(-20, 20))
    assert outside.known_row_sum(token_statistic(outside, "k1")) is None  # no sums of the clamped values yet


def test_the_k3_statistic_reuses_the_chunks_exp_only_where_nothing_is_clamped() -> None:
    from mismatch_cli.engine.accumulators.rejection import token_statistic

    batch = dirty_batch(10, turns=3)
    np.maximum(batch.old_log_probs, batch.rollout_log_probs - np.float32(19), out=batch.old_log_probs)
    for spike in (False, True):
        if spike:
            batch.old_log_probs[5] = np.float32(-45.0)
        chunk = make_chunk(batch, torch.device("cpu"), torch.float32)
        safe = chunk.log_ratio.clamp(-20, 20)
        verl = torch.exp(safe) - 1.0 - safe  # verl's expression, on the clamped values
        assert token_statistic(chunk, "k3").numpy().tobytes() == verl.numpy().tobytes()


@pytest.mark.skipif(not sweep.available(), reason="numba is not installed")
def test_segment_sums_are_the_same_on_a_process_first_call(tmp_path) -> None:
    # With reassociated float64 sums, the first call of the segment kernel in a fresh process summed some rows of
    # this chunk (a synth dump's first, 300k tokens over 4 turns) in another order than every later call: one ulp
    # in log_ppl_diff between --jobs 1 and --jobs 2. The kernel now sums in token order.
    from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
    from mismatch_cli.synth import SynthSpec, write_synthetic_dump

    write_synthetic_dump(tmp_path / "d.parquet", SynthSpec(tokens=300_000, turns=4, seed=3, steps=100))
    batch = next(iter(iter_batches(discover_inputs([str(tmp_path / "d.parquet")]), ReadOptions())))
    chunk = make_chunk(batch, torch.device("cpu"), torch.float32, False)
    np.savez(tmp_path / "chunk.npz", old=chunk.old.numpy(), rollout=chunk.rollout.numpy(), ratio=chunk.ratio.numpy(),
             lengths=chunk.runs.valid_tokens.numpy())
    code = ("import sys, numpy as np; d = np.load(sys.argv[1]); from mismatch_cli.engine.kernels import sweep; "
            "args = (d['old'], d['rollout'], d['ratio'], 2e-9, 5e8, d['lengths']); "
            "first, second = (sweep.segment_sums(*args)[0] for _ in range(2)); "
            "assert first.tobytes() == second.tobytes(), 'the first call summed differently'")
    env = {**os.environ, "MISMATCH_FUSED": "always"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "chunk.npz")], check=True, timeout=120, env=env)
