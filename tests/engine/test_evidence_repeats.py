"""The evidence accumulator's repeat counts (a token whose id occurred earlier in its row) against plain Python."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.engine.accumulators.evidence import EvidenceAccumulator
from mismatch_cli.engine.core.chunk import make_chunk


def _by_hand(ids: np.ndarray, lengths: list[int], up: np.ndarray) -> tuple[int, int]:
    repeated = tail = 0
    start = 0
    for length in lengths:
        seen: set[int] = set()
        for i in range(start, start + length):
            if int(ids[i]) in seen:
                repeated += 1
                tail += bool(up[i])
            seen.add(int(ids[i]))
        start += length
    return repeated, tail


@pytest.mark.parametrize("scale", [1, 2**36], ids=["vocabulary", "ids-wider-than-32-bits"])
def test_repeats_are_counted_per_row_as_by_hand(scale: int) -> None:
    rng = np.random.default_rng(3)
    lengths = [7, 0, 40, 1, 25]
    n = sum(lengths)
    ids = rng.integers(-5, 50, size=n) * scale  # negative ids too: only equality within a row counts
    old = rng.normal(-1.0, 0.3, size=n).astype(np.float32)
    rollout = (old + rng.normal(0.0, 0.1, size=n)).astype(np.float32)
    batch = Batch(old, rollout, np.ones(n, dtype=bool), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                  source="ids", token_ids=ids)
    accumulator = EvidenceAccumulator(torch.device("cpu"))
    accumulator.update(make_chunk(batch, torch.device("cpu"), torch.float32), None)  # type: ignore[arg-type]
    table = accumulator.compute().signatures
    repeated, tail = _by_hand(ids, lengths, old.astype(np.float64) - rollout.astype(np.float64) > 0)
    assert (table["id_tokens"], table["repeated_tokens"], table["repeated_tail_tokens"]) == (n, repeated, tail)
    assert repeated > 0
