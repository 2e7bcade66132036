"""The quantile sketch: relative error against numpy's exact quantiles, and merge invariance."""

from __future__ import annotations

import numpy as np
import torch

from mismatch_cli.engine.kernels.sketch import LogSketch

QS = [0.001, 0.01, 0.5, 0.9, 0.99, 0.999]


def test_quantiles_within_one_percent_of_numpy() -> None:
    rng = np.random.default_rng(0)
    values = np.abs(rng.standard_t(3, size=1_000_000)) * 1e-3
    values[:500] = 0.0
    sketch = LogSketch(torch.device("cpu"))
    sketch.update(torch.from_numpy(values))
    for got, want in zip(sketch.quantiles(QS), np.quantile(values, QS), strict=True):
        assert abs(got - want) <= 0.01 * want


def test_groups_and_merge_are_order_free() -> None:
    rng = np.random.default_rng(1)
    values = torch.from_numpy(rng.lognormal(-5, 2, size=20_000))
    groups = torch.from_numpy(rng.integers(0, 4, size=20_000))
    whole = LogSketch(torch.device("cpu"))
    whole.update(values, groups)
    parts = [LogSketch(torch.device("cpu")) for _ in range(3)]
    for i, part in enumerate(parts):
        part.update(values[i::3], groups[i::3])
    parts[2].merge(parts[0])
    parts[2].merge(parts[1])
    assert torch.equal(whole.counts, parts[2].counts)
    for g in range(4):
        exact = np.quantile(values[groups == g].numpy(), [0.5, 0.99])
        for got, want in zip(whole.quantiles([0.5, 0.99], g), exact, strict=True):
            assert abs(got - want) <= 0.01 * want
    assert whole.quantiles([0.5], 9) == [None]


def test_grouped_sketch_equals_dense_counts_however_split(monkeypatch) -> None:
    import mismatch_cli.engine.kernels.sketch as sketch_module
    from mismatch_cli.engine.kernels.sketch import GroupedSketch

    monkeypatch.setattr(sketch_module, "COMPACT_MIN", 4)  # compact after almost every add
    rng = np.random.default_rng(2)
    values = torch.from_numpy(rng.lognormal(-4, 2, size=30_000))
    values[:50] = 0.0
    groups = torch.from_numpy(rng.integers(0, 60, size=30_000).astype(np.int32))  # most beyond the dense rows
    dense = LogSketch(torch.device("cpu"))
    dense.update(values, groups)
    parts = [GroupedSketch(torch.device("cpu")) for _ in range(3)]
    for i, part in enumerate(parts):
        mine_values, mine_groups = values[i::3], groups[i::3]
        for j in range(0, mine_values.numel(), 700):  # several adds per part, then merges
            part.add_buckets(LogSketch.buckets(mine_values[j:j + 700]), mine_groups[j:j + 700], 60)
    parts[1].merge(parts[0])
    parts[1].merge(parts[2])
    for q in (0.0, 0.5, 0.99, 1.0):
        got = parts[1].quantile(q, 62)
        assert got[:60] == [dense.quantiles([q], g)[0] for g in range(60)], q
        assert got[60:] == [None, None]
