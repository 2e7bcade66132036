"""A mergeable quantile sketch with bounded relative error, bucketed by float32 bit patterns.

A non-negative float32's bit pattern is monotone in its value, and its top 16 bits (exponent plus
7 mantissa bits) name a bucket whose width is at most 2^-7 of its lower edge: reporting the bucket's
midpoint is within 0.4 % of any value in it. One shift per token, no log; counts live in a fixed
grid, so the state never grows with the data and sketches merge by adding counts.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SHIFT = 16
NUM_BUCKETS = 1 << (31 - SHIFT)  # sign bit is 0 for non-negative values


class LogSketch:
    """Per-group bucket counts of non-negative values; groups (e.g. round indices) grow on demand."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.num_buckets = NUM_BUCKETS
        self.counts = torch.zeros((0, NUM_BUCKETS), dtype=torch.int64, device=device)

    def _grow(self, groups: int) -> None:
        if groups > self.counts.shape[0]:
            extra = torch.zeros((groups - self.counts.shape[0], NUM_BUCKETS), dtype=torch.int64, device=self.device)
            self.counts = torch.cat([self.counts, extra])

    @staticmethod
    def buckets(values: torch.Tensor) -> torch.Tensor:
        """Bucket index (int32) of each non-negative value: the top bits of its float32 pattern."""
        return values.to(torch.float32).view(torch.int32) >> SHIFT

    def add_buckets(self, buckets: torch.Tensor, groups: torch.Tensor | None = None,
                    num_groups: int | None = None) -> None:
        """Count precomputed bucket indices, each in group `groups[i]` (< `num_groups`; group 0 when None)."""
        if buckets.numel() == 0:
            return
        if num_groups is None:
            num_groups = 1 if groups is None else int(groups.max().item()) + 1
        self._grow(num_groups)
        flat = buckets if groups is None else (groups.to(torch.int32) << (31 - SHIFT)) | buckets
        counts = torch.bincount(flat, minlength=num_groups * NUM_BUCKETS)
        self.counts[:num_groups] += counts.view(num_groups, NUM_BUCKETS)

    def add_counts(self, counts: torch.Tensor, group: int = 0) -> None:
        """Add precomputed bucket counts to one group."""
        self._grow(group + 1)
        self.counts[group] += counts.to(self.counts.device)

    def update(self, values: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """Count non-negative `values`, each in group `groups[i]` (group 0 when None)."""
        self.add_buckets(self.buckets(values), groups)

    def merge(self, other: LogSketch) -> None:
        """Add another sketch's counts."""
        self._grow(other.counts.shape[0])
        self.counts[: other.counts.shape[0]] += other.counts.to(self.device)

    @staticmethod
    def _value(bucket: int) -> float:
        if bucket == 0:
            return 0.0
        middle = (bucket << SHIFT) | (1 << (SHIFT - 1))
        return float(np.array([middle], dtype=np.int32).view(np.float32)[0])

    def quantiles(self, qs: list[float], group: int = 0) -> list[float | None]:
        """Quantiles of one group (numpy's linear interpolation between order statistics)."""
        if group >= self.counts.shape[0]:
            return [None for _ in qs]
        counts = self.counts[group].cpu()
        total = int(counts.sum().item())
        if total == 0:
            return [None for _ in qs]
        cumulative = torch.cumsum(counts, 0)

        def at_rank(rank: int) -> float:
            return self._value(int(torch.searchsorted(cumulative, rank, right=True).item()))

        out: list[float | None] = []
        for q in qs:
            position = q * (total - 1)
            low, frac = int(math.floor(position)), position - math.floor(position)
            low_value = at_rank(low)
            high_value = at_rank(min(low + 1, total - 1)) if frac > 0 else low_value
            out.append(low_value + frac * (high_value - low_value))
        return out
