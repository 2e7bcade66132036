"""One correction model: the configuration, the families (verl 0.9 ... xtuner) with their presets, `resolve()`.

Layout: `model` (value types the engine reads), `parse` (field values), `verl` (verl 0.9 / 0.8 /
0.7.1 and verl's presets), `older` (verl 0.7.0 / 0.6.1 / 0.6.0, xtuner), `config` (`CorrectionConfig`,
`resolve`), `replay` (the replayed trainers: `trl`, ...). Nothing here knows the command line's flags.
"""

from __future__ import annotations

from mismatch_cli.correction.config import (
    CONFIG_FIELDS,
    FAMILY_FIELDS,
    UNSET,
    CorrectionConfig,
    build_config,
    config_from_sources,
    family_of,
    field_home,
    presets_table,
    resolve,
    resolve_family,
    settings_from_pairs,
)
from mismatch_cli.correction.model import (
    IS_LEVELS,
    RS_OPTIONS,
    SAFETY_BOUND,
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
from mismatch_cli.correction.replay import CONCEPTS, FAMILIES, REPLAY_FAMILIES, TRAITS
from mismatch_cli.correction.verl import PRESETS, PRESETS_071, VERL_DEFAULTS, Preset, get_preset

__all__ = [
    "CONFIG_FIELDS", "FAMILIES", "FAMILY_FIELDS", "IS_LEVELS", "PRESETS", "PRESETS_071", "RS_OPTIONS", "SAFETY_BOUND",
    "UNSET", "VERL_DEFAULTS", "VERL_FAMILIES", "CorrectionConfig", "FamilySpec", "IsThreshold", "Preset",
    "CONCEPTS", "REPLAY_FAMILIES", "TRAITS",
    "RatioBlockSpec", "ReplayFamily", "ResolvedCorrection", "RsOption", "VetoSpec", "build_config",
    "config_from_sources", "family_of", "field_home", "get_preset",
    "older_presets", "parse_is_threshold", "parse_rs_options", "parse_rs_thresholds", "presets_table", "resolve",
    "resolve_family", "settings_from_pairs", "threshold_log",
]
