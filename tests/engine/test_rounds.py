"""Multi-turn rounds: hand-computed edge cases, a plain-Python loop reference, chunking invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_chunking import assert_same, split

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.core.segments import find_runs
from mismatch_cli.engine.runner import run

METRICS_ONLY = resolve(CorrectionConfig())


def ragged(rows: list[tuple[list[float], list[float], list[int]]], steps=None) -> Batch:
    """A Batch from explicit ragged rows (old, rollout, mask)."""
    lengths = [len(r[2]) for r in rows]
    return Batch(
        old_log_probs=np.array([x for r in rows for x in r[0]], dtype=np.float64),
        rollout_log_probs=np.array([x for r in rows for x in r[1]], dtype=np.float64),
        response_mask=np.array([x for r in rows for x in r[2]], dtype=bool),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        source="case",
        steps=None if steps is None else np.asarray(steps, dtype=np.int64),
    )


def test_find_runs_edges() -> None:
    # row 0 starts with 0s and ends with 1s; row 1 has one-token rounds; row 2 has no round;
    # row 3 is a single 1; row 4 has zero positions.
    mask = np.array([0, 0, 1, 1, 0, 1] + [1, 0, 1, 0, 1] + [0, 0] + [1], dtype=bool)
    offsets = np.array([0, 6, 11, 13, 14, 14])
    runs = find_runs(mask, offsets)
    assert runs.row.tolist() == [0, 0, 1, 1, 1, 3]
    assert runs.index.tolist() == [0, 1, 0, 1, 2, 0]
    assert runs.index_from_end.tolist() == [1, 0, 2, 1, 0, 0]
    assert runs.valid_tokens.tolist() == [2, 1, 1, 1, 1, 1]
    assert runs.rounds_per_row.tolist() == [2, 3, 0, 1, 0]


def test_runs_do_not_cross_row_boundaries() -> None:
    mask = np.array([1, 1, 1, 1], dtype=bool)
    runs = find_runs(mask, np.array([0, 2, 4]))
    assert runs.row.tolist() == [0, 1] and runs.index.tolist() == [0, 0]


def test_pr5229_keys_hand_computed() -> None:
    # PR #5229's own test shape: two rounds with |diff| 0 and 1, token counts 5 and 2.
    old = [-1.0] * 5 + [0.0, 0.0] + [-2.0, -2.0]
    rollout = [-1.0] * 5 + [0.0, 0.0] + [-1.0, -3.0]
    mask = [1, 1, 1, 1, 1, 0, 0, 1, 1]
    result = run([ragged([(old, rollout, mask)])], METRICS_ONLY, device="cpu", dtype="float64")
    m = result.overall.metrics
    assert m["per_round/total_rounds"] == 2
    assert m["per_round/round_0_abs_diff_mean"] == 0.0
    assert m["per_round/round_0_token_count"] == 5
    assert m["per_round/round_1_abs_diff_mean"] == 1.0
    assert m["per_round/round_1_token_count"] == 2
    assert m["per_round/max_round_diff"] == 1
    assert m["per_round/max_diff_value"] == 1.0
    assert m["diag/rounds"] == 2
    last, first = result.overall.rounds_from_end
    assert last["round_from_end"] == 0 and last["tokens"] == 2 and first["tokens"] == 5
    assert result.overall.rounds[1]["abs_diff_share"] == 1.0
    assert result.overall.rounds[1]["catastrophic_fraction"] == 0.0


def test_no_rounds_anywhere_when_every_row_is_empty_but_one() -> None:
    rows = [([-1.0, -1.0], [-1.5, -1.0], [0, 0]), ([-0.5], [-0.25], [1])]
    m = run([ragged(rows)], METRICS_ONLY, device="cpu", dtype="float64").overall.metrics
    assert m["per_round/total_rounds"] == 1
    assert m["per_round/round_0_abs_diff_mean"] == 0.25


def loop_reference(old, rollout, mask, lengths, is_threshold=None, rs_seq_threshold=None):
    """Plain-Python loops over rows and tokens: the rounds and their numbers, float64."""
    tables: dict[str, dict[int, dict[str, list]]] = {"start": {}, "end": {}}
    position = 0
    row_rounds = []
    for length in lengths:
        runs, current = [], []
        for t in range(length):
            if mask[position + t]:
                current.append(position + t)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        row_rounds.append(len(runs))
        if rs_seq_threshold is not None:
            valid = [p for run in runs for p in run]
            n = len(valid)
            k1_mean = sum(-max(min(old[p] - rollout[p], 20), -20) for p in valid) / (n + 1e-8) if n else 0.0
            lo, hi = math.log(1 / rs_seq_threshold), math.log(rs_seq_threshold)
            row_rejected = not (lo <= k1_mean <= hi)
        for k, segment in enumerate(runs):
            for table, key in (("start", k), ("end", len(runs) - 1 - k)):
                entry = tables[table].setdefault(key, {"rows": 0, "d": [], "w": [], "rej": []})
                entry["rows"] += 1
                for p in segment:
                    d = old[p] - rollout[p]
                    entry["d"].append(d)
                    if is_threshold is not None:
                        entry["w"].append(min(math.exp(max(min(d, 20), -20)), is_threshold))
                    if rs_seq_threshold is not None:
                        entry["rej"].append(1.0 if row_rejected else 0.0)
        position += length
    total_abs = sum(abs(d) for e in tables["start"].values() for d in e["d"])
    out = {}
    for table, entries in tables.items():
        rows = []
        for key in sorted(entries):
            e = entries[key]
            ds = e["d"]
            n = len(ds)
            row = {
                "rows": e["rows"], "tokens": n,
                "abs_diff_mean": sum(abs(d) for d in ds) / n,
                "abs_diff_p99": float(np.quantile(np.abs(ds), 0.99)),
                "kl": sum(-d for d in ds) / n,
                "k3_kl": sum(math.exp(d) - d - 1 for d in ds) / n,
                "chi2_token": sum(math.exp(max(min(d, 20), -20)) ** 2 for d in ds) / n - 1,
                "ratio_mean": sum(math.exp(max(min(d, 20), -20)) for d in ds) / n,
                "catastrophic_fraction": sum(abs(d) > math.log(1e4) for d in ds) / n,
                "abs_diff_share": sum(abs(d) for d in ds) / total_abs,
            }
            if is_threshold is not None:
                row["is_weight_mean"] = sum(e["w"]) / n
            if rs_seq_threshold is not None:
                row["rs_masked_fraction"] = sum(e["rej"]) / n
            rows.append(row)
        out[table] = rows
    out["max_rounds"] = max(row_rounds)
    return out


def multi_turn_dump(seed: int, rows: int = 80):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, size=rows)
    total = int(lengths.sum())
    rollout = -rng.exponential(0.3, total)
    old = rollout + rng.normal(0, 0.05, total)
    old[rng.random(total) < 0.005] -= 12.0  # catastrophic tokens
    mask = rng.random(total) < 0.7  # many short rounds, rows starting / ending with either value
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    steps = rng.integers(0, 3, size=rows)
    batch = Batch(old, rollout, mask, offsets, source="random", steps=steps)
    return batch, lengths


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rounds_match_loop_reference(seed: int) -> None:
    batch, lengths = multi_turn_dump(seed)
    config = CorrectionConfig(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="seq_mean_k1",
                              rollout_rs_threshold=1.02)
    result = run([batch], resolve(config), device="cpu", dtype="float64")
    want = loop_reference(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, lengths,
                          is_threshold=1.5, rs_seq_threshold=1.02)
    assert result.overall.metrics["per_round/total_rounds"] == want["max_rounds"]
    for table, got_rows in (("start", result.overall.rounds), ("end", result.overall.rounds_from_end)):
        assert len(got_rows) == len(want[table])
        for got, expected in zip(got_rows, want[table], strict=True):
            for key, value in expected.items():
                tolerance = 0.01 if key == "abs_diff_p99" else 1e-9
                assert abs(got[key] - value) <= tolerance * abs(value) + 1e-12, (table, key, got[key], value)
    for k, expected in enumerate(want["start"]):
        m = result.overall.metrics
        assert m[f"per_round/round_{k}_token_count"] == expected["tokens"]
        assert abs(m[f"per_round/round_{k}_abs_diff_mean"] - expected["abs_diff_mean"]) <= 1e-9 * expected[
            "abs_diff_mean"]


def test_per_round_numbers_do_not_depend_on_chunking() -> None:
    batch, _ = multi_turn_dump(5, rows=60)
    correction = resolve(CorrectionConfig(rollout_is="sequence", rollout_rs="token_k2,seq_max_k3",
                                          rollout_rs_threshold="0.01,0.5"))
    one = run([batch], correction, device="cpu", dtype="float64", by_step=True)
    rng = np.random.default_rng(0)
    for count in (59, 7):
        cuts = sorted(rng.choice(np.arange(1, 60), size=count, replace=False).tolist())
        many = run(split(batch, cuts), correction, device="cpu", dtype="float64", by_step=True)
        assert_same(one.overall.metrics, many.overall.metrics)
        for ours, theirs in ((one.overall.rounds, many.overall.rounds),
                             (one.overall.rounds_from_end, many.overall.rounds_from_end)):
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs, strict=True):
                assert_same(a, b)
        for step in one.steps:
            for a, b in zip(one.steps[step].rounds, many.steps[step].rounds, strict=True):
                assert_same(a, b)


def test_by_step_rounds_equal_each_step_alone() -> None:
    batch, _ = multi_turn_dump(9, rows=50)
    result = run([batch], METRICS_ONLY, device="cpu", dtype="float64", by_step=True)
    for step, step_result in result.steps.items():
        rows = np.flatnonzero(batch.steps == step)
        pieces = split(batch, sorted(set(range(1, batch.num_rows))))
        alone = run([pieces[i] for i in rows], METRICS_ONLY, device="cpu", dtype="float64")
        for a, b in zip(step_result.rounds, alone.overall.rounds, strict=True):
            assert_same(a, b)


def test_excluded_tokens_stay_in_their_round() -> None:
    old = [-1.0, float("nan"), -1.0, 0.0, -2.0]
    rollout = [-1.5, -1.0, -1.0, 0.0, -2.5]
    mask = [1, 1, 1, 0, 1]
    result = run([ragged([(old, rollout, mask)])], METRICS_ONLY, device="cpu", dtype="float64")
    first, second = result.overall.rounds
    assert first["tokens"] == 2 and first["abs_diff_mean"] == 0.25
    assert second["tokens"] == 1 and second["abs_diff_mean"] == 0.5
