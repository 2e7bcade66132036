"""A replayed trainer's own correction against the what-if ladder: which ladder rows it can run exactly (its
vocabulary's `correction` mapping), which row a run's configuration is, and how to write a row in its syntax.

verl and the older families keep their own mapping (answers/recommend.py's `fields_for`); everything here goes
through the family's vocabulary and resolver, so nothing names a trainer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mismatch_cli.correction import replay_families, resolve_family
from mismatch_cli.correction.fixes import fixes_for
from mismatch_cli.errors import MismatchError


def is_replayed(family: str) -> bool:
    """Whether a family is a replayed trainer (its own fields and keys)."""
    return family in replay_families()


def own_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fields of its replayed trainer, as the report's config holds them (defaults included)."""
    family = replay_families().get(str(config.get("semantics")))
    return {} if family is None else {k: config[k] for k in family.defaults if k in config}


def _settings(family: str, fields: Mapping[str, Any]) -> Any:
    try:
        return resolve_family(family, dict(fields))[0].trainer
    except MismatchError:
        return None


def applies(config: Mapping[str, Any]) -> bool:
    """Whether a replayed trainer's run applies a correction (its resolver returns settings)."""
    family = str(config.get("semantics"))
    return is_replayed(family) and _settings(family, own_fields(config)) is not None


def row_fields(row: Mapping[str, Any], family: str) -> dict[str, Any] | None:
    """The trainer's own fields that run a what-if row exactly (None when it cannot)."""
    fixes = fixes_for(family)
    if fixes is None or fixes.correction is None:
        return None
    return fixes.correction(row)


def matching_row(config: Mapping[str, Any], what_if: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ladder row that is exactly the run's correction: the same resolved settings, with the run's
    reduction fields (micro-batch sizes) kept."""
    family = str(config.get("semantics"))
    fixes = fixes_for(family)
    if not is_replayed(family) or fixes is None or fixes.correction is None:
        return None
    fields = own_fields(config)
    target = _settings(family, fields)
    if target is None:
        return None
    context = {k: fields[k] for k in fixes.context_fields if k in fields}
    for row in what_if:
        candidate = fixes.correction(row)
        if candidate is not None and _settings(family, {**context, **candidate}) == target:
            return row
    return None


def set_flags(fields: Mapping[str, Any]) -> str:
    """The fields as `mismatch analyze --set FIELD=VALUE` flags."""
    return " ".join(f"--set {name}={_text(value)}" for name, value in fields.items())


def native(fields: Mapping[str, Any], family: str) -> str | None:
    """The fields as the trainer's own configuration (what a user pastes into its launcher)."""
    fixes = fixes_for(family)
    return fixes.native(fields) if fixes is not None and fixes.native is not None else None


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


__all__ = ["applies", "is_replayed", "matching_row", "native", "own_fields", "row_fields", "set_flags"]
