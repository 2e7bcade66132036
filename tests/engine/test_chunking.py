"""Results must not depend on how the dump was chunked, nor on merging shards in any order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import batch_from_padded
from test_numpy_reference import CONFIGS, random_dump

from mismatch_cli.batch import Batch
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.analysis import BatchAccumulator
from mismatch_cli.engine.chunk import make_chunk
from mismatch_cli.engine.runner import run


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
