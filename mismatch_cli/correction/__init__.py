"""One correction model: the configuration, the families (verl 0.9 ... xtuner) with their presets, `resolve()`.

Layout: `model` (value types the engine reads), `parse` (field values), `verl` (verl 0.9 / 0.8 /
0.7.1 and verl's presets), `older` (verl 0.7.0 / 0.6.1 / 0.6.0, xtuner), `config` (`CorrectionConfig`,
`resolve`), `registry` (the replayed trainers, found in `mismatch_cli/trainers/` and in the entry-point group
`mismatch_cli.trainers`). Nothing here knows the command line's flags or names a replayed trainer.

`FAMILIES`, `REPLAY_FAMILIES`, `FAMILY_FIELDS` and `CORRECTION_FIELDS` are read on first use (they need the
trainers found), so importing this package never imports a trainer.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.correction.config import (
    CONFIG_FIELDS,
    UNSET,
    CorrectionConfig,
    build_config,
    check_trainer_fields,
    config_from_sources,
    correction_table,
    family_fields,
    family_of,
    field_home,
    presets_table,
    resolve,
    resolve_family,
    settings_from_pairs,
    trainer_warnings,
)
from mismatch_cli.correction.model import (
    CONCEPTS,
    IS_LEVELS,
    RS_OPTIONS,
    SAFETY_BOUND,
    TRAITS,
    VERL_FAMILIES,
    FamilySpec,
    IsThreshold,
    RatioBlockSpec,
    ReplayFamily,
    ResolvedCorrection,
    RsOption,
    VetoSpec,
)
from mismatch_cli.correction.older import older_presets
from mismatch_cli.correction.parse import parse_is_threshold, parse_rs_options, parse_rs_thresholds, threshold_log
from mismatch_cli.correction.registry import families, make_accumulator, replay_families
from mismatch_cli.correction.verl import PRESETS, PRESETS_071, VERL_DEFAULTS, Preset, get_preset

_FOUND = {"FAMILIES": families, "REPLAY_FAMILIES": replay_families, "FAMILY_FIELDS": family_fields,
          "CORRECTION_FIELDS": correction_table}


def __getattr__(name: str) -> Any:
    """The names that need the trainers found, computed on first use."""
    if name in _FOUND:
        return _FOUND[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONCEPTS", "CONFIG_FIELDS", "CORRECTION_FIELDS", "FAMILIES", "FAMILY_FIELDS", "IS_LEVELS", "PRESETS",
    "PRESETS_071", "REPLAY_FAMILIES", "RS_OPTIONS", "SAFETY_BOUND", "TRAITS", "UNSET", "VERL_DEFAULTS",
    "VERL_FAMILIES", "CorrectionConfig", "FamilySpec", "IsThreshold", "Preset", "RatioBlockSpec", "ReplayFamily",
    "ResolvedCorrection", "RsOption", "VetoSpec", "build_config", "check_trainer_fields", "config_from_sources",
    "correction_table", "families", "family_fields", "family_of", "field_home", "get_preset", "make_accumulator",
    "older_presets", "parse_is_threshold", "parse_rs_options", "parse_rs_thresholds", "presets_table",
    "replay_families", "resolve", "resolve_family", "settings_from_pairs", "threshold_log", "trainer_warnings",
]
