"""Breakdown states at rest (a run's history under --by step: one state per step) keep their sketch counts as the
occupied buckets only: the numbers do not change, the memory does."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import mismatch_cli.engine.runner as runner
import mismatch_cli.io.parallel as parallel
from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.kernels.sketch import PackedCounts
from mismatch_cli.engine.runner import Analysis
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.synth import SynthSpec, write_synthetic_dump


@pytest.fixture(scope="module")
def many_steps(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("steps") / "steps.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=150_000, turns=3, seed=5, steps=60, row_group_tokens=20_000,
                                         catastrophic_rate=1e-4))
    return str(path)


def test_packed_counts_unpack_to_the_same_tensor() -> None:
    generator = torch.Generator().manual_seed(3)
    dense = torch.randint(0, 5, (4, 1000), generator=generator) * (torch.rand(4, 1000, generator=generator) < 0.02)
    packed = PackedCounts(dense)
    assert packed.index.numel() == int((dense != 0).sum())
    assert torch.equal(packed.unpack(), dense) and packed.unpack().dtype == dense.dtype


def test_a_packed_round_sketch_gives_its_quantiles_without_unpacking() -> None:
    # A step's round p99 at finish is read from the packed buckets; before, computing unpacked every step's rows.
    from mismatch_cli.engine.kernels.sketch import GroupedSketch, LogSketch

    rng = np.random.default_rng(4)
    values = rng.exponential(0.05, 20_000).astype(np.float32)
    values[:50] = 0.0
    groups = rng.integers(0, 11, values.size)  # groups 8-10 are kept sparse
    sketch = GroupedSketch(torch.device("cpu"))
    sketch.add_buckets(LogSketch.buckets(torch.from_numpy(values)), torch.from_numpy(groups), 11)
    bits = values.view(np.int32) >> 16  # the bucket: the top 16 bits; it reports its midpoint (0.0 for bucket 0)
    middle = np.where(bits == 0, 0.0, ((bits << 16) | (1 << 15)).astype(np.int32).view(np.float32).astype(float))
    expected = [float(np.quantile(middle[groups == g], 0.99)) for g in range(11)]
    for packed in (False, True):
        if packed:
            sketch.pack()
        *found, empty = sketch.quantile(0.99, 12)
        assert found == pytest.approx(expected, rel=1e-12) and empty is None
    assert isinstance(sketch._dense, PackedCounts)


def test_a_fresh_round_sketch_merges_and_counts_as_one_that_saw_every_value() -> None:
    # A step's first part is copied into its fresh sketch (not added to zeros); later parts add, packed or not.
    from mismatch_cli.engine.kernels.sketch import GroupedSketch, LogSketch

    rng = np.random.default_rng(5)
    cpu = torch.device("cpu")
    values = torch.from_numpy(rng.exponential(0.05, 9_000).astype(np.float32))
    groups = torch.from_numpy(rng.integers(0, 10, values.numel()))
    whole, step = GroupedSketch(cpu), GroupedSketch(cpu)
    whole.add_buckets(LogSketch.buckets(values), groups, 10)
    for part in np.array_split(np.arange(values.numel()), 3):
        shard = GroupedSketch(cpu)
        shard.add_buckets(LogSketch.buckets(values[part]), groups[part], int(groups[part].max()) + 1)
        shard.pack()
        step.merge(shard)
        step.pack()
    for q in (0.5, 0.99):
        assert step.quantile(q, 10) == whole.quantile(q, 10)
    assert torch.equal(step.dense, whole.dense)


def test_a_steps_first_part_folds_into_its_own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh state per part merged into a fresh step state only copied it: a step's first part now folds into the
    # step's state, and only later parts of a known step take a state of their own.
    import dataclasses

    from test_sweep import dirty_batch

    made = []
    breakdown = runner.Analysis._breakdown
    monkeypatch.setattr(runner.Analysis, "_breakdown", lambda self: made.append(1) or breakdown(self))
    batches = [dataclasses.replace(batch, steps=np.full(batch.num_rows, step))
               for batch, step in ((dirty_batch(1), 0), (dirty_batch(2), 1), (dirty_batch(3), 2), (dirty_batch(4), 2))]
    result = runner.run(batches, resolve(CorrectionConfig()), device="cpu", by_step=True)
    assert sorted(result.steps) == [0, 1, 2] and len(made) == 4  # three steps, one later part of step 2


def _report(path: str, **kwargs: object) -> str:
    data = analyze([path], hash_inputs=False, by_step=True, bootstrap=0, **kwargs).to_dict()
    data.pop("created_at")
    return json.dumps(data, sort_keys=True)


def test_resting_steps_change_no_number(many_steps: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "ITEM_BYTES", 300_000)  # several work items, merged with packed states
    packed = _report(many_steps, jobs=1)
    two = _report(many_steps, jobs=2)
    monkeypatch.setattr(runner, "PACK_AFTER", 10**9)
    dense = _report(many_steps, jobs=1)
    assert len(json.loads(dense)["steps"]) == 60
    assert packed == dense == two


def test_steps_at_rest_hold_their_occupied_buckets_only(many_steps: str) -> None:
    analysis = Analysis(resolve(CorrectionConfig()), torch.device("cpu"), by_step=True, bootstrap=0)
    for batch in iter_batches(discover_inputs([many_steps]), ReadOptions(chunk_rows=64)):
        analysis.update(batch)
    resting = [state for state in analysis.per_step.values()
               if isinstance(state.diagnostics._counts, PackedCounts)
               and isinstance(state.rounds.from_start.sketch._dense, PackedCounts)]
    assert len(resting) >= len(analysis.per_step) - 1 == 59  # all but the step the next chunk may continue
    one = resting[0]
    assert len(pickle.dumps(one)) < 300_000  # against 2.5 MiB of dense counts
    before = one.compute().metrics
    assert one.compute().metrics == before  # computing unpacks; the numbers stay
    analysis.finish()


def test_a_few_groups_are_never_packed(tmp_path: Path) -> None:
    path = tmp_path / "few.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=40_000, turns=2, seed=1, steps=5, row_group_tokens=8_000))
    analysis = Analysis(resolve(CorrectionConfig()), torch.device("cpu"), by_step=True, bootstrap=0)
    for batch in iter_batches(discover_inputs([str(path)]), ReadOptions(chunk_rows=16)):
        analysis.update(batch)
    assert len(analysis.per_step) == 5
    assert not any(isinstance(state.diagnostics._counts, PackedCounts) for state in analysis.per_step.values())


def test_a_step_computes_its_keys_not_the_overall_tables(tmp_path: Path) -> None:
    # The report keeps a step's metrics and rounds only: its histograms, quantile ladders, rounds from the end and
    # signature octave table (a few ms a step, seconds over a run's history) are left to the overall batch.
    path = tmp_path / "steps.parquet"
    write_synthetic_dump(path, SynthSpec(tokens=30_000, turns=3, seed=2, steps=3, row_group_tokens=8_000))
    analysis = Analysis(resolve(CorrectionConfig()), torch.device("cpu"), by_step=True, bootstrap=0)
    for batch in iter_batches(discover_inputs([str(path)]), ReadOptions()):
        analysis.update(batch)
    result = analysis.finish()
    assert result.overall.histograms and result.overall.quantiles and result.overall.rounds_from_end
    assert result.overall.signatures["buckets"] and result.overall.signatures["tail_slopes"]  # the findings' tables
    for step in result.steps.values():
        assert step.metrics["diag/log_ratio_p50"] is not None and step.rounds
        assert step.metrics["diag/temperature_slope"] is not None and step.signatures["worst_token"]
        assert not step.histograms and not step.quantiles and not step.rounds_from_end
        assert not step.signatures["buckets"] and "tail_slopes" not in step.signatures
