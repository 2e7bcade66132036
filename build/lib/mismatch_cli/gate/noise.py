"""Is a change beyond noise? The two tests `compare` marks `~` / `=` with and `check` holds relative rules back by.

A change is within noise when the two 95 % bootstrap intervals overlap (a deliberately conservative test,
as pyperf and asv make it), and too small to matter when it is smaller than the metric's minimal practical
difference (the registry's, or the caller's override). Both read finished reports only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mismatch_cli.metrics import lookup


def overlap(a: list[float] | None, b: list[float] | None) -> bool | None:
    """Whether two intervals overlap; None when either is missing."""
    if not a or not b:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def magnitude_interval(interval: list[float] | None) -> list[float] | None:
    """The interval of |x| for x in [low, high]: [0, max] when it spans 0."""
    if not interval:
        return None
    low, high = interval
    if low <= 0.0 <= high:
        return [0.0, max(-low, high)]
    return sorted([abs(low), abs(high)])


def min_difference_of(key: str, base: float | None,
                      overrides: Mapping[str, tuple[float, bool] | None] | None = None) -> float | None:
    """The smallest change of `key` that counts (in its unit), from the overrides or the registry; None: any."""
    if overrides is not None and key in overrides:
        difference = overrides[key]
    else:
        metric = lookup(key)
        difference = None if metric is None or metric.practical_difference is None else (
            metric.practical_difference, metric.practical_relative)
    if difference is None:
        return None
    amount, relative = difference
    if not relative:
        return amount
    return None if base is None else amount * abs(base)


def _interval_text(interval: list[float]) -> str:
    return f"[{interval[0]:.3g}, {interval[1]:.3g}]"


@dataclass(frozen=True)
class NoiseTest:
    """What a change of one metric is judged by: both sides' 95 % intervals and its minimal practical difference."""

    base_interval: list[float] | None
    candidate_interval: list[float] | None
    min_difference: float | None

    @property
    def has_intervals(self) -> bool:
        """Whether both sides carry an interval (reports made with --bootstrap 0 carry none)."""
        return bool(self.base_interval and self.candidate_interval)

    def _intervals(self) -> str:
        base, candidate = self.base_interval or [], self.candidate_interval or []
        return f"the 95 % intervals {_interval_text(candidate)} (input) and {_interval_text(base)} (baseline)"

    def within_noise(self, base: float, value: float) -> str | None:
        """Why the change base -> value is not a real one (with the numbers), or None when it is beyond noise."""
        if self.has_intervals and overlap(self.base_interval, self.candidate_interval):
            return f"within noise: {self._intervals()} overlap"
        if self.min_difference is not None and abs(value - base) < self.min_difference:
            return (f"below the minimal practical difference: the change {value - base:+.3g} is smaller than "
                    f"{self.min_difference:.3g}")
        return None

    def beyond_noise(self, base: float, value: float) -> str:
        """Why the change base -> value is a real one, in words (the other side of `within_noise`)."""
        parts = [f"{self._intervals()} do not overlap" if self.has_intervals
                 else "no bootstrap interval on one side, so the value alone decides"]
        if self.min_difference is not None:
            parts.append(f"the change {value - base:+.3g} is at least the minimal practical difference "
                         f"{self.min_difference:.3g}")
        return "; ".join(parts)


__all__ = ["NoiseTest", "magnitude_interval", "min_difference_of", "overlap"]
