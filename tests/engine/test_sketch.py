"""The quantile sketch: relative error against numpy's exact quantiles, and merge invariance."""

from __future__ import annotations

import numpy as np
import torch

from mismatch_cli.engine.sketch import LogSketch

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
