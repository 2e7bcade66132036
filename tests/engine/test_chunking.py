"""Results must not depend on how the dump was chunked, nor on merging shards in any order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_same_tree, batch_from_padded
from test_numpy_reference import CONFIGS, random_dump

from mismatch_cli.batch import Batch, concat_rows, follows
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.analysis import BatchAccumulator
from mismatch_cli.engine.core.chunk import make_chunk
from mismatch_cli.engine.core.staging import Staging
from mismatch_cli.engine.runner import Analysis, run


def split(batch: Batch, cuts: list[int]) -> list[Batch]:
    """Split a batch at the given row boundaries into whole-sequence chunks."""
    bounds = [0, *cuts, batch.num_rows]
    parts = []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        a, b = batch.offsets[start], batch.offsets[stop]
        parts.append(Batch(
            old_log_probs=batch.old_log_probs[a:b],
            rollout_log_probs=batch.rollout_log_probs[a:b],
            response_mask=batch.response_mask[a:b],
            offsets=batch.offsets[start:stop + 1] - a,
            source=batch.source,
            first_row=start,
            steps=None if batch.steps is None else batch.steps[start:stop],
        ))
    return parts


def assert_same(one: dict, other: dict, rel: float = 1e-12) -> None:
    assert set(one) == set(other)
    for key, value in one.items():
        if value is None:
            assert other[key] is None, key
        else:
            assert abs(other[key] - value) <= rel * abs(value) + 1e-15, (key, value, other[key])


@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_random_chunks_give_the_same_metrics(config: dict) -> None:
    rng = np.random.default_rng(7)
    old, rollout, mask = random_dump(11, rows=60)
    steps = rng.integers(0, 3, size=60)
    whole = batch_from_padded(old, rollout, mask, steps=steps)
    correction = resolve(CorrectionConfig(**config))
    one = run([whole], correction, device="cpu", dtype="float64", by_step=True)
    for trial in range(3):
        count = [59, 10, 3][trial]  # 59 cuts: every chunk is a single row
        cuts = sorted(rng.choice(np.arange(1, 60), size=count, replace=False).tolist())
        many = run(split(whole, cuts), correction, device="cpu", dtype="float64", by_step=True)
        assert_same(one.overall.metrics, many.overall.metrics)
        assert one.steps.keys() == many.steps.keys()
        for step in one.steps:
            assert_same(one.steps[step].metrics, many.steps[step].metrics)


def test_merge_of_shards_equals_one_pass() -> None:
    old, rollout, mask = random_dump(3, rows=50)
    whole = batch_from_padded(old, rollout, mask)
    correction = resolve(CorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0,
                                          rollout_rs="seq_mean_k1,token_k3", rollout_rs_threshold="1.01,0.02"))
    device = torch.device("cpu")
    single = BatchAccumulator(correction, device)
    single.update(make_chunk(whole, device, torch.float64))
    shards = []
    for part in split(whole, [7, 20, 33]):
        accumulator = BatchAccumulator(correction, device)
        accumulator.update(make_chunk(part, device, torch.float64))
        shards.append(accumulator)
    merged = shards[3]
    for shard in (shards[1], shards[0], shards[2]):
        merged.merge(shard)
    assert_same(single.compute().metrics, merged.compute().metrics)


def test_float32_is_close_to_float64_on_a_long_dump() -> None:
    old, rollout, mask = random_dump(5, rows=400, width=300)
    batch = batch_from_padded(old, rollout, mask)
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    f64 = run([batch], correction, device="cpu", dtype="float64").overall.metrics
    f32 = run([batch], correction, device="cpu", dtype="float32").overall.metrics
    for key, value in f64.items():
        assert abs(f32[key] - value) <= 1e-3 * abs(value) + 1e-5, key


def test_chunk_total_is_taken_once_and_in_float64() -> None:
    old, rollout, mask = random_dump(5, rows=30, width=40)
    chunk = make_chunk(batch_from_padded(old, rollout, mask), torch.device("cpu"), torch.float32)
    first = chunk.total(chunk.k3)
    assert chunk.total(chunk.k3) is first  # every accumulator summing k3 shares the one reduction
    assert first.dtype == torch.float64
    exact = sum(sorted(chunk.k3.numpy().astype(np.float64).tolist(), key=abs))
    assert first.item() == pytest.approx(exact, rel=1e-13)
    flags = chunk.old == chunk.rollout
    assert chunk.total(flags).item() == int(np.count_nonzero(flags.numpy()))


def _with_columns(batch: Batch, rng: np.random.Generator) -> Batch:
    """The batch with an id column, a group column and a few dirty tokens (quality examples)."""
    old = batch.old_log_probs.copy()
    valid = np.flatnonzero(batch.response_mask)
    old[valid[[3, 40, 200]]] = [np.nan, -9999.0, np.inf]
    rows = batch.num_rows
    return Batch(old_log_probs=old, rollout_log_probs=batch.rollout_log_probs, response_mask=batch.response_mask,
                 offsets=batch.offsets, source=batch.source, steps=batch.steps,
                 sequence_ids=np.array([f"id-{i}" for i in range(rows)], dtype=object),
                 groups={"env_name": np.array(["math", "code", None], dtype=object)[rng.integers(0, 3, rows)]})


def _analysis(correction, join: bool, positions: int) -> Analysis:
    analysis = Analysis(correction, torch.device("cpu"), "float64", by_step=True, group_by=("env_name",))
    analysis.join_batches = join  # the GPU path's joining of reader batches, run on the CPU
    analysis.chunk_positions = positions
    return analysis


@pytest.mark.parametrize("positions", [1, 150, 1 << 22])
def test_joined_device_chunks_give_the_same_results(positions: int) -> None:
    rng = np.random.default_rng(5)
    old, rollout, mask = random_dump(12, rows=70)
    whole = _with_columns(batch_from_padded(old, rollout, mask, steps=rng.integers(0, 3, size=70)), rng)
    correction = resolve(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k3",
                                          rollout_rs_threshold="0.02"))
    cuts = sorted(rng.choice(np.arange(1, 70), size=20, replace=False).tolist())
    parts = [Batch(**{**vars(p), "sequence_ids": whole.sequence_ids[p.first_row:p.first_row + p.num_rows],
                      "groups": {"env_name": whole.groups["env_name"][p.first_row:p.first_row + p.num_rows]}})
             for p in split(whole, cuts)]
    plain, joined = _analysis(correction, False, 1 << 20), _analysis(correction, True, positions)
    for part in parts:
        plain.update(part)
        joined.update(part)
    one, other = plain.finish(), joined.finish()
    assert_same(one.overall.metrics, other.overall.metrics)
    for step in one.steps:
        assert_same(one.steps[step].metrics, other.steps[step].metrics)
    for label, result in one.groups["env_name"].items():
        assert_same(result.metrics, other.groups["env_name"][label].metrics)
    assert one.overall.worst_sequences == other.overall.worst_sequences
    assert one.overall.signatures["worst_token"] == other.overall.signatures["worst_token"]
    assert repr(one.sources["case"].examples) == repr(other.sources["case"].examples)  # NaN != NaN
    assert one.sources["case"].quality == other.sources["case"].quality
    assert one.sources["case"].sequences == other.sources["case"].sequences == 70


def test_only_consecutive_rows_of_one_file_are_joined() -> None:
    old, rollout, mask = random_dump(13, rows=30)
    whole = batch_from_padded(old, rollout, mask)
    a, b, c = split(whole, [10, 20])
    joined = concat_rows([a, b, c])
    for name in ("old_log_probs", "rollout_log_probs", "response_mask", "offsets"):
        assert np.array_equal(getattr(joined, name), getattr(whole, name))
    assert follows(a, b) and follows(b, c)
    assert not follows(a, c)  # rows 10-19 are missing between them
    assert not follows(a, Batch(**{**vars(b), "source": "other.parquet"}))
    assert not follows(a, Batch(**{**vars(b), "old_log_probs": b.old_log_probs.astype(np.float32)}))


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3], CONFIGS[6], {"semantics": "verl-0.6.0"},
                                    {"semantics": "trl"}], ids=["default", "is", "rs", "verl-0.6.0", "trl"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "straddling"])
def test_by_step_folds_each_chunk_once_and_changes_nothing(config: dict, aligned: bool) -> None:
    # Steps in order, cut so that every chunk lies in one step: each chunk's per-token work is done once and
    # merged into the step's state and the overall one (runner.Analysis.fold); the results are those of an
    # analysis without --by step, and each step's are those of its rows alone.
    old, rollout, mask = random_dump(13, rows=60)
    steps = np.repeat([4, 7, 9], [25, 20, 15])
    whole = batch_from_padded(old, rollout, mask, steps=steps)
    correction = resolve(CorrectionConfig(**config))
    # Chunks that lie in one step, and chunks that straddle one or two steps (folded run by run).
    chunks = split(whole, [10, 25, 30, 45, 52]) if aligned else split(whole, [10, 30, 58])
    by_step = run(chunks, correction, device="cpu", dtype="float64", by_step=True)
    plain = run(chunks, correction, device="cpu", dtype="float64")
    for name in ("metrics", "rounds", "rounds_from_end", "intervals", "quantiles", "histograms", "worst_sequences",
                 "what_if", "signatures", "notes"):
        assert_same_tree(getattr(plain.overall, name), getattr(by_step.overall, name), 1e-12, name)
    for step, (start, stop) in {4: (0, 25), 7: (25, 45), 9: (45, 60)}.items():
        alone = run([whole.slice_rows(start, stop)], correction, device="cpu", dtype="float64", rounds=True,
                    bootstrap=0)
        expected = {k: v for k, v in alone.overall.metrics.items() if k in by_step.steps[step].metrics}
        assert expected.keys() == by_step.steps[step].metrics.keys()
        assert_same_tree(expected, by_step.steps[step].metrics, 1e-12, f"step {step}")
        assert_same_tree(alone.overall.rounds, by_step.steps[step].rounds, 1e-12, f"step {step} rounds")


@pytest.mark.parametrize("fused", [False, True], ids=["numpy", "fused"])
def test_by_step_folds_the_overall_what_if_and_worst_rows_once_per_chunk(monkeypatch, fused: bool) -> None:
    # Chunks of several small steps each: the overall what-if ladder and worst rows fold each chunk once, whole,
    # so they are those of the run without --by step bit for bit (per part they differed in the last bits).
    from mismatch_cli.engine.accumulators.whatif import WhatIfAccumulator
    from mismatch_cli.engine.kernels import sweep

    old, rollout, mask = random_dump(21, rows=90)
    whole = batch_from_padded(old.astype(np.float32), rollout.astype(np.float32), mask,
                              steps=np.repeat(np.arange(18), 5))
    chunks = split(whole, [30, 60])
    correction = resolve(CorrectionConfig())
    calls = []
    update = WhatIfAccumulator.update
    monkeypatch.setattr(WhatIfAccumulator, "update", lambda self, chunk, d: calls.append(1) or update(self, chunk, d))
    with sweep.forced(fused):
        by_step = run(chunks, correction, device="cpu", by_step=True, fused=fused)
        folded = len(calls)
        plain = run(chunks, correction, device="cpu", fused=fused)
    assert folded == len(chunks) and len(by_step.steps) == 18
    assert by_step.overall.what_if == plain.overall.what_if
    assert by_step.overall.worst_sequences == plain.overall.worst_sequences


def test_joining_into_reused_host_buffers_copies_every_token_array() -> None:
    old, rollout, mask = random_dump(14, rows=30)
    whole = batch_from_padded(old, rollout, mask)
    whole = Batch(**{**vars(whole), "response_mask": whole.response_mask.astype(np.int8),
                     "advantages": np.arange(whole.num_positions, dtype=np.float64)})
    staging = Staging(torch.device("cpu"), positions=16)  # smaller than the chunk: the buffers grow
    for cuts in ([0, 10, 20, 30], [0, 30]):  # three batches, then one alone: both are copied into the buffers
        staging.begin()
        joined = concat_rows([whole.slice_rows(a, b) for a, b in zip(cuts, cuts[1:], strict=False)], staging.join)
        for name in ("old_log_probs", "rollout_log_probs", "offsets", "advantages"):
            assert np.array_equal(getattr(joined, name), getattr(whole, name)), name
        assert joined.response_mask.dtype == np.bool_
        assert np.array_equal(joined.response_mask, whole.response_mask != 0)
        assert not np.shares_memory(joined.old_log_probs, whole.old_log_probs)
        staging.end()
    staging.begin()  # the first set again: its buffers are reused, not reallocated
    again = staging.join("old_log_probs", [whole.old_log_probs[:5]], np.dtype(np.float32))
    assert np.shares_memory(again, concat_rows([whole], staging.join).old_log_probs)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3], CONFIGS[6], {"semantics": "openrlhf", "family_fields": {
    "is_correction_level": "token", "micro_train_batch_size": 2}}], ids=["default", "is", "rs", "openrlhf"])
@pytest.mark.parametrize("by_step", [False, True], ids=["group", "group-and-step"])
def test_interleaved_groups_fold_each_token_once_and_change_nothing(config: dict, by_step: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows of three environments interleaved row by row, over two steps: each combination of labels is folded
    # once as a part that keeps its rows' file indices, and merges into its groups' states and the overall one
    # (runner.Analysis.fold). The overall results are those of an analysis without --by, worst rows and
    # bootstrap intervals included; each group's are those of its rows alone. A family that reads the rows'
    # order (OpenRLHF's micro-batches) keeps analyzing each group's rows again.
    old, rollout, mask = random_dump(17, rows=60)
    env = np.array(["math", "code", "chat"], dtype=object)[np.arange(60) % 3]
    steps = np.repeat([3, 4], 30)
    whole = Batch(**{**vars(batch_from_padded(old, rollout, mask, steps=steps)), "groups": {"env": env}})
    chunks = [whole.slice_rows(a, b) for a, b in ((0, 22), (22, 41), (41, 60))]
    correction = resolve(CorrectionConfig(**config))
    folded = []
    update = BatchAccumulator.update

    def counting(self: BatchAccumulator, chunk):  # noqa: ANN001, ANN202
        folded.append(chunk.num_tokens)
        return update(self, chunk)

    monkeypatch.setattr(BatchAccumulator, "update", counting)
    grouped = run(chunks, correction, device="cpu", dtype="float64", by_step=by_step, group_by=("env",))
    once = sum(folded)
    folded.clear()
    plain = run(chunks, correction, device="cpu", dtype="float64")
    order_free = "semantics" not in config
    assert (once == sum(folded)) == order_free  # every token folded once, or again per group
    for name in ("metrics", "rounds", "rounds_from_end", "intervals", "quantiles", "histograms", "worst_sequences",
                 "what_if", "signatures", "notes"):
        assert_same_tree(getattr(plain.overall, name), getattr(grouped.overall, name), 1e-12, name)
    for label in ("math", "code", "chat") if order_free else ():  # micro-batches of a group's scattered rows
        alone = run([whole.select_rows(env == label)], correction, device="cpu", dtype="float64", bootstrap=0)
        got = grouped.groups["env"][label]
        expected = {k: v for k, v in alone.overall.metrics.items() if k in got.metrics}
        assert expected.keys() == got.metrics.keys()
        assert_same_tree(expected, got.metrics, 1e-12, label)
        assert_same_tree(alone.overall.rounds, got.rounds, 1e-12, f"{label} rounds")
