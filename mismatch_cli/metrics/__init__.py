"""The metric registry: what every reported key means, which way is better, and its documented band.

Health, compare, check, the renderers, `mismatch metrics` and docs/metrics.md all read it; nothing else
guesses a metric's direction or meaning from its name. `model` holds the types; the catalog (`catalog`) and the
look-ups (`registry`) load on first use, because the catalog lists the replayed trainers' keys and a trainer's
`keys` module imports `model`.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.metrics.model import PLACEHOLDER_HELP, Band, Direction, Family, Metric

_LOOKUPS = ("FAMILIES", "METRICS", "VERL_PREFIX", "aliases_of", "closest", "concrete_keys", "direction_of", "find",
            "lookup", "resolve_name")


def __getattr__(name: str) -> Any:
    """The catalog's names and the look-ups, loaded on first use."""
    if name in _LOOKUPS:
        from mismatch_cli.metrics import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PLACEHOLDER_HELP", "Band", "Direction", "Family", "Metric", *_LOOKUPS]
