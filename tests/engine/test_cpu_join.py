"""The CPU joins consecutive small reader batches of a file into one chunk (engine/runner.py), and the numbers are
those of folding every batch as it comes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_same_tree
from test_chunking import _with_columns
from test_sweep import TABLES, dirty_batch

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine import runner
from mismatch_cli.engine.kernels import sweep
from mismatch_cli.engine.runner import Analysis, run


@pytest.fixture(autouse=True)
def _chunks_as_made() -> None:
    """Here the CPU joins small batches, as outside the tests (the other engine tests fold them as made)."""


def _pieces(batch: Batch, cuts: list[int]) -> list[Batch]:
    bounds = [0, *cuts, batch.num_rows]
    return [batch.slice_rows(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _folded(monkeypatch: pytest.MonkeyPatch, analysis: Analysis) -> list[Batch]:
    """The batches `analysis` folds as chunks, in order, recorded as they are folded."""
    folded: list[Batch] = []
    real = analysis._fold

    def record(whole: Batch) -> None:
        folded.append(whole)
        real(whole)

    monkeypatch.setattr(analysis, "_fold", record)
    return folded


def test_small_batches_of_one_file_become_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = dirty_batch(3, rows=60)
    other = dirty_batch(4, rows=20)  # another file ("dirty.parquet" again, but rows that do not follow)
    analysis = Analysis(resolve(CorrectionConfig()), torch.device("cpu"))
    folded = _folded(monkeypatch, analysis)
    for piece in _pieces(whole, [5, 6, 20, 41]):
        analysis.update(piece)
    assert folded == []  # held: 5 batches of a few thousand positions
    analysis.update(other)  # does not follow the held rows: they are folded, joined
    assert len(folded) == 1 and folded[0].num_rows == 60 and folded[0].first_row == 0
    assert np.array_equal(folded[0].old_log_probs, whole.old_log_probs, equal_nan=True)
    assert np.array_equal(folded[0].offsets, whole.offsets)
    analysis.finish()
    assert len(folded) == 2 and folded[1] is other


def test_a_batch_of_half_a_chunk_or_more_is_folded_as_it_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = dirty_batch(5, rows=40)
    pieces = _pieces(whole, [2, 30])  # 2 rows, 28 rows, 10 rows
    big = pieces[1].num_positions
    assert pieces[0].num_positions < big // 2 and pieces[2].num_positions < big // 2
    monkeypatch.setattr(runner, "JOIN_CPU_BATCHES_BELOW", big)
    analysis = Analysis(resolve(CorrectionConfig()), torch.device("cpu"))
    folded = _folded(monkeypatch, analysis)
    analysis.update(pieces[0])
    assert folded == []
    analysis.update(pieces[1])  # the held rows first, then the large batch itself (no copy)
    assert [b.num_rows for b in folded] == [2, 28] and folded[1] is pieces[1]
    analysis.update(pieces[2])
    analysis.finish()
    assert [b.num_rows for b in folded] == [2, 28, 10]


@pytest.mark.parametrize("fused", [False, True], ids=["numpy", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_joined_chunks_give_the_numbers_of_separate_ones(monkeypatch: pytest.MonkeyPatch, dtype: str,
                                                         fused: bool) -> None:
    if fused and (dtype == "float64" or not sweep.available()):
        pytest.skip("the fused sweep takes float32 on the CPU, with numba")
    rng = np.random.default_rng(11)
    whole = _with_columns(dirty_batch(8, rows=120, steps=True, turns=3), rng)
    cuts = sorted(rng.choice(np.arange(1, 120), size=25, replace=False).tolist())
    pieces = [Batch(**{**vars(p), "sequence_ids": whole.sequence_ids[p.first_row:p.first_row + p.num_rows],
                       "groups": {"env_name": whole.groups["env_name"][p.first_row:p.first_row + p.num_rows]}})
              for p in _pieces(whole, cuts)]
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1",
                                          rollout_rs_threshold="1.01"))

    def analyze() -> runner.EngineResult:
        with sweep.forced(fused):
            return run(pieces, correction, device="cpu", dtype=dtype, by_step=True, group_by=("env_name",),
                       bootstrap=50, fused=fused)

    joined = analyze()
    monkeypatch.setattr(runner, "JOIN_CPU_BATCHES_BELOW", 0)
    separate = analyze()
    rel = 1e-12 if dtype == "float64" else 1e-9
    for name in TABLES:
        assert_same_tree(getattr(separate.overall, name), getattr(joined.overall, name), rel, name)
    assert separate.steps.keys() == joined.steps.keys() and len(separate.steps) == 3
    for step, result in separate.steps.items():
        assert_same_tree(result.metrics, joined.steps[step].metrics, rel, f"step {step}")
    assert separate.groups["env_name"].keys() == joined.groups["env_name"].keys()
    for label, result in separate.groups["env_name"].items():
        assert_same_tree(result.metrics, joined.groups["env_name"][label].metrics, rel, f"group {label}")
    for source, stats in separate.sources.items():
        other = joined.sources[source]
        assert (stats.sequences, stats.quality) == (other.sequences, other.quality)
        assert_same_tree(stats.examples, other.examples, 0.0, "examples")  # NaN log-probs among them


def test_replay_joins_small_batches_with_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from mismatch_cli.engine import many

    whole = dirty_batch(9, rows=90, steps=True)
    pieces = _pieces(whole, list(range(5, 90, 5)))  # 18 batches of 5 rows
    corrections = {"verl": resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)),
                   "plain": resolve(CorrectionConfig())}
    chunks: list[int] = []
    real = many.make_chunk

    def counted(batch: Batch, *args: object) -> object:
        chunks.append(batch.num_rows)
        return real(batch, *args)

    monkeypatch.setattr(many, "make_chunk", counted)
    joined = many.run_many(pieces, corrections, device="cpu", dtype="float64", groups=3)
    assert len(chunks) == 3 and sum(chunks) == 90  # one joined batch, split into its 3 row groups
    chunks.clear()
    monkeypatch.setattr(runner, "JOIN_CPU_BATCHES_BELOW", 0)
    separate = many.run_many(pieces, corrections, device="cpu", dtype="float64", groups=3)
    assert len(chunks) == 18 * 3
    for name in corrections:
        assert_same_tree(separate[name].overall.overall.metrics, joined[name].overall.overall.metrics, 1e-12, name)
        for one, other in zip(separate[name].leave_one_out, joined[name].leave_one_out, strict=True):
            assert_same_tree(one.metrics, other.metrics, 1e-12, f"{name} leave-one-out")
