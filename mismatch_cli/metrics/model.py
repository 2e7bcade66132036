"""The registry's types: a metric's direction, health band, family and entry (no torch, no I/O)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class Direction(str, enum.Enum):
    """Which way a metric is better; `none` for counts and informational values."""

    LOWER = "lower"
    HIGHER = "higher"
    CLOSER_TO_1 = "closer to 1"
    LOWER_ABS = "lower |x|"
    NONE = "none"

    def __str__(self) -> str:
        return self.value

    @property
    def phrase(self) -> str:
        """The direction in a sentence ("lower is better"), as compare's JSON writes it."""
        return {"lower": "lower is better", "higher": "higher is better", "closer to 1": "closer to 1",
                "lower |x|": "lower |x| is better", "none": "informational"}[self.value]

    def badness(self, value: float) -> float:
        """A number that grows as the metric gets worse (0 for an informational metric)."""
        if self is Direction.LOWER:
            return value
        if self is Direction.HIGHER:
            return -value
        if self is Direction.CLOSER_TO_1:
            return abs(value - 1.0)
        if self is Direction.LOWER_ABS:
            return abs(value)
        return 0.0


@dataclass(frozen=True)
class Band:
    """A documented healthy range, and where it is documented."""

    low: float | None
    high: float | None
    source: str
    absolute: bool = False  # the band holds |value|

    def describe(self) -> str:
        """The healthy range in words ("0.5 <= value <= 2.0")."""
        name = "|value|" if self.absolute else "value"
        if self.low is not None and self.high is not None:
            return f"{self.low} <= {name} <= {self.high}"
        if self.low is not None:
            return f"{name} >= {self.low}"
        return f"{name} <= {self.high}"

    def healthy(self, value: float) -> bool:
        """True when the value lies inside the band."""
        value = abs(value) if self.absolute else value
        if self.low is not None and value < self.low:
            return False
        return not (self.high is not None and value > self.high)


@dataclass(frozen=True)
class Family:
    """A group of keys that come together, and when an analysis produces them."""

    name: str
    produced: str  # when the keys are in a report, in words


# Placeholders a key template may hold; each matches one of its values (None: any round index).
PLACEHOLDER_HELP = {
    "option": "any of the 11 RS options",
    "k1_option": "a k1 RS option (token_k1, seq_sum_k1, seq_mean_k1)",
    "k23_option": "a k2 / k3 RS option (token_k2, token_k3, seq_sum_k2, …, seq_max_k3)",
    "k": "a round index 0, 1, 2, …",
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Metric:
    """One reported key (or a key template such as `per_round/round_{k}_token_count`) and what it means."""

    key: str
    family: Family
    reduction: str  # how values are reduced, in words: "token-mean over valid tokens", "count", ...
    unit: str
    direction: Direction
    meaning: str  # one line
    label: str = ""  # a short name for tables (the key's last part when empty)
    band: Band | None = None
    practical_difference: float | None = None  # default minimal change worth reporting in compare
    practical_relative: bool = False  # practical_difference is a fraction of |base|, not an absolute amount
    alias_of: str | None = None  # the same quantity under the current verl key
    # For the share of valid tokens ("tokens") or of sequences ("sequences") a correction removes from the
    # gradient (masks, rejects, drops): health holds it to the drop band whenever the key is reported.
    removes: str = ""
    placeholders: dict[str, tuple[str, ...] | None] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_pattern(self) -> bool:
        """Whether the key is a template with placeholders."""
        return "{" in self.key

    @property
    def title(self) -> str:
        """The label, or the key without its prefix."""
        return self.label or self.key.split("/", 1)[-1]

    def regex(self) -> re.Pattern[str]:
        """A regular expression matching every concrete key of this entry."""
        parts, last = [], 0
        for match in _PLACEHOLDER.finditer(self.key):
            parts.append(re.escape(self.key[last:match.start()]))
            values = self.placeholders.get(match.group(1))
            parts.append(r"\d+" if values is None else "(?:" + "|".join(map(re.escape, values)) + ")")
            last = match.end()
        parts.append(re.escape(self.key[last:]))
        return re.compile("".join(parts))

    def examples(self) -> list[str]:
        """Concrete keys of a template (the first value of a round index), or the key itself."""
        keys = [self.key]
        for name in _PLACEHOLDER.findall(self.key):
            values = self.placeholders.get(name) or ("0",)
            keys = [k.replace("{" + name + "}", v, 1) for k in keys for v in values]
        return keys
