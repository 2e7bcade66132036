"""Shared, hand-built expectations for the reader tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from mismatch_cli.batch import Batch


@dataclass(frozen=True)
class Rows:
    """Four sequences of different lengths, values exact in float16, bf16, float32 and float64."""

    old: list[list[float]]
    rollout: list[list[float]]
    mask: list[list[int]]
    steps: list[int]

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.old]

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flat old, rollout, mask (bool) and offsets, built by hand from the lists."""
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        old = np.array([v for r in self.old for v in r], dtype=np.float64)
        rollout = np.array([v for r in self.rollout for v in r], dtype=np.float64)
        mask = np.array([v for r in self.mask for v in r], dtype=bool)
        return old, rollout, mask, offsets

    def padded(self, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[B, width] arrays, right-padded with 0.0 log-probs and mask 0."""
        shape = (len(self.old), width)
        old, rollout, mask = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=np.int64)
        for i, n in enumerate(self.lengths):
            old[i, :n], rollout[i, :n], mask[i, :n] = self.old[i], self.rollout[i], self.mask[i]
        return old, rollout, mask


@pytest.fixture
def rows() -> Rows:
    return Rows(
        old=[[-0.5, -1.25, -2.0], [-0.125], [-3.5, -0.25, -1.0, -0.75, -6.0], [-0.0625, -1.5]],
        rollout=[[-0.625, -1.0, -2.5], [-0.25], [-3.0, -0.375, -1.0, -0.5, -8.0], [-0.125, -1.75]],
        mask=[[0, 1, 1], [1], [1, 1, 0, 1, 1], [0, 0]],
        steps=[7, 7, 8, 9],
    )


def _concat(batches: list[Batch]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate a list of Batches into flat arrays and global offsets."""
    old = np.concatenate([b.old_log_probs for b in batches])
    rollout = np.concatenate([b.rollout_log_probs for b in batches])
    mask = np.concatenate([b.response_mask for b in batches])
    lengths = np.concatenate([np.diff(b.offsets) for b in batches])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return old, rollout, mask, offsets


@pytest.fixture
def concat() -> Callable[[list[Batch]], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    return _concat
