"""The registry's look-ups over the catalog (every key of the correction model and of each replayed trainer)."""

from __future__ import annotations

import difflib
import functools

from mismatch_cli.metrics.catalog import FAMILIES, METRICS
from mismatch_cli.metrics.model import PLACEHOLDER_HELP, Band, Direction, Family, Metric

_EXACT = {m.key: m for m in METRICS if not m.is_pattern}
_PATTERNS = tuple((m.regex(), m) for m in METRICS if m.is_pattern)
VERL_PREFIX = "rollout_corr/"


@functools.lru_cache(maxsize=8192)
def lookup(key: str) -> Metric | None:
    """The registry entry of a reported key (exact, or matching a template such as `round_{k}_...`)."""
    if key in _EXACT:
        return _EXACT[key]
    return next((metric for regex, metric in _PATTERNS if regex.fullmatch(key)), None)


def resolve_name(name: str) -> str | None:
    """The registered key a user's name means (`kl` is `rollout_corr/kl`), or None when none is registered."""
    for key in (name, VERL_PREFIX + name):
        if lookup(key) is not None:
            return key
    return None


def direction_of(key: str) -> Direction:
    """Which way is better for a key; `none` when the key is informational or unknown."""
    metric = lookup(key)
    return Direction.NONE if metric is None else metric.direction


def aliases_of(key: str) -> tuple[str, ...]:
    """The older families' keys for the same quantity (`mismatch/mismatch_kl` for `rollout_corr/kl`)."""
    return tuple(m.key for m in METRICS if m.alias_of == key)


@functools.lru_cache(maxsize=1)
def concrete_keys() -> tuple[str, ...]:
    """Every key the registry knows, templates expanded (round indices as 0)."""
    return tuple(dict.fromkeys(k for m in METRICS for k in m.examples()))


def closest(name: str, extra: tuple[str, ...] | list[str] = (), count: int = 3) -> list[str]:
    """Registered (or `extra`) keys that look like `name`, best first; prefixes may be left out."""

    def short(key: str) -> str:
        return key.split("/", 1)[-1]

    scored = []
    for key in dict.fromkeys([*extra, *concrete_keys()]):
        ratio = max(difflib.SequenceMatcher(None, name, key).ratio(),
                    difflib.SequenceMatcher(None, short(name), short(key)).ratio())
        if ratio >= 0.6:
            scored.append((ratio, key))
    scored.sort(key=lambda item: -item[0])
    return [key for _, key in scored[:count]]


def find(text: str | None = None) -> list[Metric]:
    """Every entry (no text), the entry of one reported key, or the entries whose key contains the text."""
    if not text:
        return list(METRICS)
    key = resolve_name(text)
    if key is not None:
        return [lookup(key)]  # type: ignore[list-item]
    needle = text.lower()
    return [m for m in METRICS if needle in m.key.lower()]


__all__ = [
    "FAMILIES",
    "METRICS",
    "PLACEHOLDER_HELP",
    "VERL_PREFIX",
    "Band",
    "Direction",
    "Family",
    "Metric",
    "aliases_of",
    "closest",
    "concrete_keys",
    "direction_of",
    "find",
    "lookup",
    "resolve_name",
]
