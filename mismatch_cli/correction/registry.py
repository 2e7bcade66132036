"""The replayed trainers, found rather than listed: every package under `mismatch_cli/trainers/` and every entry point
of the group `mismatch_cli.trainers`.

A trainer package exposes `TRAINERS`, a tuple of `ReplayFamily` (slime's holds slime and slime-mis). A third
party ships one the same way and names it in its own package metadata:

    [project.entry-points."mismatch_cli.trainers"]
    mytrainer = "my_package.mytrainer"      # a module with TRAINERS, or a ReplayFamily, or a tuple of them

Nothing here names a trainer. Discovery runs on first use, never while `correction` or `metrics` is being imported,
so a trainer's own modules may import both.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import warnings
from collections.abc import Iterable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from mismatch_cli.correction.model import CORRECTION_FAMILIES, ReplayFamily

BUILT_IN = "mismatch_cli.trainers"
ENTRY_POINT_GROUP = "mismatch_cli.trainers"


class TrainerWarning(UserWarning):
    """A trainer that could not be loaded, or that repeats a name already taken, was skipped."""


def _families(found: Any, origin: str) -> list[ReplayFamily]:
    """The ReplayFamily objects a trainer package or entry point provides."""
    if isinstance(found, ModuleType):
        found = getattr(found, "TRAINERS", None)
    if isinstance(found, ReplayFamily):
        return [found]
    if isinstance(found, Iterable) and not isinstance(found, (str, bytes)):
        items = list(found)
        if items and all(isinstance(item, ReplayFamily) for item in items):
            return items
    raise TypeError(f"{origin} provides no ReplayFamily (expected TRAINERS, a ReplayFamily or a tuple of them)")


def _built_in() -> list[tuple[str, ReplayFamily]]:
    package = importlib.import_module(BUILT_IN)
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__, BUILT_IN + "."), key=lambda i: i.name):
        if info.ispkg:
            found += [(info.name, f) for f in _families(importlib.import_module(info.name), info.name)]
    return found


def _plugins() -> list[tuple[str, ReplayFamily]]:
    found = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP})"
        try:
            found += [(origin, f) for f in _families(point.load(), origin)]
        except Exception as error:  # a broken third-party trainer must not take the built-in ones down with it
            warnings.warn(f"skipped the trainer of {origin}: {type(error).__name__}: {error}", TrainerWarning,
                          stacklevel=2)
    return found


@functools.cache
def replay_families() -> dict[str, ReplayFamily]:
    """Every replayed trainer by its `semantics` name, in listing order (position, then name)."""
    families: dict[str, ReplayFamily] = {}
    origins: dict[str, str] = {}
    for origin, family in [*_built_in(), *_plugins()]:
        if family.name in CORRECTION_FAMILIES or family.name in families:
            first = origins.get(family.name, "mismatch's own correction model")
            warnings.warn(f"skipped trainer {family.name!r} of {origin}: {first} already defines it",
                          TrainerWarning, stacklevel=2)
            continue
        families[family.name] = family
        origins[family.name] = origin
    return dict(sorted(families.items(), key=lambda item: (item[1].position, item[0])))


def families() -> tuple[str, ...]:
    """Every `semantics` value: the correction model's families, then the replayed trainers."""
    return (*CORRECTION_FAMILIES, *replay_families())


def make_accumulator(reference: str, settings: Any, device: Any) -> Any:
    """The accumulator of a replayed trainer's resolved settings, built by what it names as "module:name"."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)(settings, device)


__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "TrainerWarning", "families", "make_accumulator", "replay_families"]
