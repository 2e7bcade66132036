"""A mergeable quantile sketch with bounded relative error, bucketed by float32 bit patterns.

A non-negative float32's bit pattern is monotone in its value, and its top 16 bits (exponent plus
7 mantissa bits) name a bucket whose width is at most 2^-7 of its lower edge: reporting the bucket's
midpoint is within 0.4 % of any value in it. One shift per token, no log; counts live in a fixed
grid, so the state never grows with the data and sketches merge by adding counts (exactly, so a
quantile never depends on chunking). `GroupedSketch` keeps such counts per round index, sparse
beyond the first few rounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.kernels.ops import bincount

SHIFT = 16
NUM_BUCKETS = 1 << (31 - SHIFT)  # sign bit is 0 for non-negative values


class PackedCounts:
    """A count tensor kept as its occupied entries while nothing updates it: a breakdown state at rest (a step
    of a run's history) holds a few thousand occupied buckets, not 2^16 to 2^18 zeros. Exact: counts are ints."""

    def __init__(self, dense: torch.Tensor) -> None:
        flat = dense.reshape(-1)
        self.index = torch.nonzero(flat).reshape(-1)
        self.values = flat.index_select(0, self.index)
        self.shape, self.dtype = dense.shape, dense.dtype

    def unpack(self) -> torch.Tensor:
        """The dense tensor again (on the device its entries are on)."""
        dense = torch.zeros(self.shape.numel(), dtype=self.dtype, device=self.values.device)
        return dense.index_copy_(0, self.index, self.values).reshape(self.shape)


class PackableCounts:
    """A count-tensor attribute that `pack` may hold as a PackedCounts, unpacked again when it is next read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:  # on the class: the descriptor itself (pack reads its slot)
            return self
        value = getattr(instance, self.slot)
        if isinstance(value, PackedCounts):
            value = value.unpack()
            setattr(instance, self.slot, value)
        return value

    def __set__(self, instance: object, value: torch.Tensor) -> None:
        setattr(instance, self.slot, value)


def pack(instance: object, *names: str) -> None:
    """Hold these PackableCounts attributes of `instance` as their occupied entries until they are next read."""
    for name in names:
        slot = getattr(type(instance), name).slot
        value = getattr(instance, slot)
        if isinstance(value, torch.Tensor) and value.numel():
            setattr(instance, slot, PackedCounts(value))


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
        flat = buckets if groups is None else (groups.to(torch.int64) << (31 - SHIFT)) | buckets
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


GROUP_SHIFT = 31 - SHIFT  # a grouped key is (group << GROUP_SHIFT) | bucket
DENSE_GROUPS = 8  # groups kept as dense count rows; higher groups (rare rounds) are kept sparse
COMPACT_MIN = 1 << 16  # pending sparse entries tolerated before a merge, at the least


def bucket_midpoints(buckets: np.ndarray) -> np.ndarray:
    """The value each bucket reports (its midpoint; bucket 0 holds zeros), float64."""
    middle = ((buckets.astype(np.int64) << SHIFT) | (1 << (SHIFT - 1))).astype(np.int32)
    with np.errstate(invalid="ignore"):
        values = middle.view(np.float32).astype(np.float64)
    return np.where(buckets == 0, 0.0, values)


def merge_counts(keys: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted unique keys and the summed counts of each (keys may repeat, in any order), on their device."""
    if keys.numel() == 0:
        return keys.to(torch.int64), counts.to(torch.int64)
    unique, inverse = torch.unique(keys, return_inverse=True)
    summed = torch.zeros(unique.numel(), dtype=torch.int64, device=keys.device).index_add_(0, inverse, counts)
    return unique, summed


class GroupedSketch:
    """LogSketch counts per group (round index) in memory linear in the values, however many groups.

    Groups below DENSE_GROUPS are dense count rows (the common case: a few rounds per row); higher
    groups keep only their occupied buckets as sorted (key, count) pairs, merged lazily so the work
    stays O(n log n). A row with thousands of one-token rounds then costs a few bytes per token,
    not a 256 KB count row per round.
    """

    dense = PackableCounts()  # the first rounds' count rows, [groups, NUM_BUCKETS]

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.dense = torch.zeros((0, NUM_BUCKETS), dtype=torch.int64, device=device)
        self.keys = torch.zeros(0, dtype=torch.int64, device=device)
        self.counts = torch.zeros(0, dtype=torch.int64, device=device)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.pending_size = 0

    def pack(self) -> None:
        """Keep the dense rows as their occupied buckets until the next update, merge or quantile."""
        pack(self, "dense")

    def _grow(self, groups: int) -> None:
        groups = min(groups, DENSE_GROUPS)
        if groups > self.dense.shape[0]:
            extra = torch.zeros((groups - self.dense.shape[0], NUM_BUCKETS), dtype=torch.int64, device=self.device)
            self.dense = torch.cat([self.dense, extra]) if self.dense.shape[0] else extra

    def _add_sparse(self, keys: torch.Tensor, counts: torch.Tensor) -> None:
        if keys.numel() == 0:
            return
        self.pending.append((keys.to(self.device), counts.to(self.device)))
        self.pending_size += keys.numel()
        if self.pending_size > max(self.keys.numel(), COMPACT_MIN):
            self._compact()

    def _compact(self) -> None:
        if self.pending:
            parts = [(self.keys, self.counts), *self.pending]
            self.keys, self.counts = merge_counts(torch.cat([k for k, _ in parts]), torch.cat([c for _, c in parts]))
            self.pending, self.pending_size = [], 0

    def add_counts(self, counts: torch.Tensor) -> None:
        """Add precomputed bucket counts: [NUM_BUCKETS] to group 0, or [groups, NUM_BUCKETS] to groups 0.. (dense)."""
        counts = counts.reshape(-1, NUM_BUCKETS)
        assert counts.shape[0] <= DENSE_GROUPS
        self._add_dense(counts)

    def _add_dense(self, counts: torch.Tensor) -> None:
        """Add [groups, NUM_BUCKETS] counts to the dense rows; a fresh sketch (a step's first part) takes a copy,
        not zeros, a concatenation and a sum."""
        if self.dense.shape[0] == 0:
            self.dense = counts.to(self.device, torch.int64, copy=True)
            return
        self._grow(counts.shape[0])
        self.dense[: counts.shape[0]] += counts.to(self.device)

    def add_buckets(self, buckets: torch.Tensor, groups: torch.Tensor, num_groups: int) -> None:
        """Count bucket indices, each in group `groups[i]` (every group < `num_groups`)."""
        if buckets.numel() == 0:
            return
        self._grow(num_groups)
        dense_groups = min(num_groups, DENSE_GROUPS)
        if num_groups > DENSE_GROUPS:
            # Rows with many rounds: their high rounds' keys, counted on the device (one sort per chunk;
            # selecting them is the one place the rounds wait for the device, and only such chunks do).
            sparse = groups >= DENSE_GROUPS
            keys = (groups[sparse].to(torch.int64) << GROUP_SHIFT) | buckets[sparse]
            unique, counts = torch.unique(keys, return_counts=True)
            self._add_sparse(unique, counts)
            low = ~sparse
            groups, buckets = groups[low], buckets[low]
        flat = torch.add(buckets, groups, alpha=NUM_BUCKETS)  # (group << GROUP_SHIFT) | bucket, in int32
        counts = bincount(flat, dense_groups * NUM_BUCKETS)
        self.dense[:dense_groups] += counts.view(dense_groups, NUM_BUCKETS)

    def merge(self, other: GroupedSketch) -> None:
        """Add another sketch's counts."""
        self._add_dense(other.dense)
        other._compact()
        self._add_sparse(other.keys, other.counts)

    def _dense_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The dense rows' occupied buckets as ascending grouped keys (a row-major flat index is one: NUM_BUCKETS
        is 1 << GROUP_SHIFT) and their counts, read from the packed entries when packed (nothing is unpacked)."""
        held = getattr(self, type(self).dense.slot)
        if isinstance(held, PackedCounts):  # torch.nonzero's index: ascending
            return held.index.cpu().numpy(), held.values.cpu().numpy()
        flat = held.reshape(-1).cpu().numpy()
        index = np.flatnonzero(flat)
        return index, flat[index]

    def quantile(self, q: float, num_groups: int) -> list[float | None]:
        """Quantile `q` of each group 0..num_groups-1 (numpy's linear interpolation; None for an empty group)."""
        self._compact()
        dense_keys, dense_counts = self._dense_entries()
        # Dense keys all precede the sparse ones.
        keys = np.concatenate([dense_keys, self.keys.cpu().numpy()])
        counts = np.concatenate([dense_counts, self.counts.cpu().numpy()])
        if keys.size == 0:
            return [None] * num_groups
        group = keys >> GROUP_SHIFT
        cumulative = np.cumsum(counts)
        every = np.arange(num_groups)
        start, end = np.searchsorted(group, every, "left"), np.searchsorted(group, every, "right")
        before = np.where(start > 0, cumulative[np.maximum(start - 1, 0)], 0)
        total = np.where(end > start, cumulative[np.maximum(end - 1, 0)] - before, 0)
        last_rank = np.maximum(total - 1, 0)
        position = q * last_rank
        low = np.floor(position).astype(np.int64)
        frac = position - low
        values = bucket_midpoints(keys & ((1 << GROUP_SHIFT) - 1))

        def at_rank(rank: np.ndarray) -> np.ndarray:
            return values[np.minimum(np.searchsorted(cumulative, before + rank, "right"), keys.size - 1)]

        low_value = at_rank(low)
        with np.errstate(invalid="ignore"):
            out = np.where(frac > 0, low_value + frac * (at_rank(np.minimum(low + 1, last_rank)) - low_value),
                           low_value)
        return [float(v) if t else None for v, t in zip(out.tolist(), total.tolist(), strict=True)]
