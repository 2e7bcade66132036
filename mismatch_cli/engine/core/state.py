"""Fixed-size mergeable state: named sums, maxima, minima and Welford moments (float64 tensors)."""

from __future__ import annotations

import math

import numpy as np
import torch

from mismatch_cli.engine.kernels.ops import F64, total


class Reducer:
    """Named float64 scalars, each merged by `sum`, `max` or `min`; never grows with the data.

    Sums take the per-item values themselves (not a pre-reduced scalar) and accumulate them in
    float64, so a float32 run gives the same totals however the dump was chunked.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.values: dict[str, torch.Tensor | float] = {}
        self.kinds: dict[str, str] = {}

    def _put(self, name: str, value: torch.Tensor | float, kind: str) -> None:
        # Numbers the host knows (counts) are summed on the host: no tiny host-to-device copy per call.
        if isinstance(value, torch.Tensor) or kind != "sum":
            value = torch.as_tensor(value, dtype=F64, device=self.device)
        current = self.values.get(name)
        self.kinds[name] = kind
        if current is None:
            self.values[name] = value
        elif kind == "sum":
            self.values[name] = current + value
        elif kind == "max":
            self.values[name] = torch.maximum(torch.as_tensor(current, dtype=F64, device=self.device), value)
        else:
            self.values[name] = torch.minimum(torch.as_tensor(current, dtype=F64, device=self.device), value)

    def add(self, name: str, value: torch.Tensor | float) -> None:
        """Add `value` (a number, or a tensor whose elements are summed in float64) to the running sum `name`."""
        if isinstance(value, torch.Tensor):
            # A 0-d float32 tensor is a sum already taken in float32: chunk-dependent, so refused here.
            assert value.dim() > 0 or value.dtype == F64 or not value.is_floating_point(), name
            if value.dim() > 0 or value.dtype != F64:  # a 0-d float64 tensor is its own total
                value = total(value)
        self._put(name, value, "sum")

    def max(self, name: str, value: torch.Tensor | float) -> None:
        """Fold `value` (a number, or the largest element of a non-empty tensor) into the running maximum."""
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            value = value.max()
        self._put(name, value, "max")

    def min(self, name: str, value: torch.Tensor | float) -> None:
        """Fold `value` (a number, or the smallest element of a non-empty tensor) into the running minimum."""
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            value = value.min()
        self._put(name, value, "min")

    def merge(self, other: Reducer) -> None:
        """Fold another reducer's state into this one."""
        for name, value in other.values.items():
            self._put(name, value, other.kinds[name])

    def get(self, name: str, default: float = 0.0) -> float:
        """The current value of `name` as a Python float."""
        value = self.values.get(name)
        if value is None:
            return default
        return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class Moments:
    """Count, mean and sum of squared deviations of a stream of values (Chan's parallel merge)."""

    def __init__(self, device: torch.device) -> None:
        self.count = torch.zeros((), dtype=F64, device=device)
        self.mean = torch.zeros((), dtype=F64, device=device)
        self.m2 = torch.zeros((), dtype=F64, device=device)

    def _combine(self, count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor) -> None:
        total = self.count + count
        safe_total = total.clamp_min(1.0)
        delta = mean - self.mean
        self.mean = self.mean + delta * count / safe_total
        self.m2 = self.m2 + m2 + delta * delta * self.count * count / safe_total
        self.count = total

    def update(self, values: torch.Tensor) -> None:
        """Add a 1-D tensor of values."""
        values = values.to(F64)
        if values.numel() == 0:
            return
        count = values.new_full((), float(values.numel()))  # a fill on the device, not a copy
        mean = values.mean()
        m2 = ((values - mean) ** 2).sum()
        self._combine(count, mean, m2)

    def update_where(self, values: torch.Tensor, keep: torch.Tensor) -> None:
        """Add the values where `keep` is set (1-D, same length), without selecting them on the host."""
        values = values.to(F64)
        count = keep.sum().to(F64)
        mean = torch.where(keep, values, 0.0).sum() / count.clamp_min(1.0)
        m2 = torch.where(keep, (values - mean) ** 2, 0.0).sum()
        self._combine(count, mean, m2)

    def merge(self, other: Moments) -> None:
        """Fold another stream's moments into this one."""
        self._combine(other.count.to(self.count.device), other.mean.to(self.count.device),
                      other.m2.to(self.count.device))

    def std(self) -> float:
        """Unbiased standard deviation; 0.0 for fewer than two values (as verl's guards give)."""
        n = float(self.count.item())
        return math.sqrt(max(float(self.m2.item()), 0.0) / (n - 1)) if n > 1 else 0.0


def float32_fraction(count: float, total: float) -> float:
    """count / total rounded to float32, as verl's `bool_tensor.float().mean()` returns it."""
    return float(np.float32(count) / np.float32(total))
