"""Seed-era correction families (verl 0.6.0 / 0.6.1 / 0.7.0 / 0.7.1, xtuner): configs, validation, presets.

Each family takes its own upstream field names verbatim and is validated the way its upstream code
validates at compute time (reference: docs/legacy-semantics.md). The result is a
`LegacySpec`, a plain description of which metric blocks the engine must compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mismatch_cli.config import (
    VERL_FAMILIES,
    CorrectionConfig,
    ResolvedCorrection,
    build_config,
    parse_rs_options,
    parse_rs_thresholds,
    resolve,
)
from mismatch_cli.errors import ConfigError
from mismatch_cli.numbers import parse_number, threshold_value

FAMILIES = ("verl", "verl-0.8", "verl-0.7.1", "verl-0.7.0", "verl-0.6.1", "verl-0.6.0", "xtuner", "xtuner-2025-12")
VERL_OLD = ("verl-0.7.0", "verl-0.6.1")
XTUNER = ("xtuner", "xtuner-2025-12")

# The upstream config fields each family accepts (its `[correction]` table takes them verbatim).
FIELDS: dict[str, tuple[str, ...]] = {
    "verl": ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
             "rollout_rs_threshold", "bypass_mode", "loss_type", "k1_bounds", "preset"),
    "verl-0.7.1": ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold", "bypass_mode", "loss_type", "k1_bounds", "preset"),
    "verl-0.7.0": ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold", "rollout_rs_threshold_lower", "rollout_token_veto_threshold",
                   "bypass_mode", "loss_type", "preset"),
    "verl-0.6.1": ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold", "rollout_rs_threshold_lower", "rollout_token_veto_threshold",
                   "bypass_mode", "use_policy_gradient", "preset"),
    "verl-0.6.0": ("rollout_is", "rollout_is_level", "rollout_is_mode", "rollout_is_threshold",
                   "rollout_is_threshold_lower", "rollout_is_veto_threshold"),
    "xtuner": ("rollout_is_level", "rollout_is_mode", "rollout_is_threshold", "rollout_is_mask_threshold",
               "rollout_is_veto_threshold"),
}
FIELDS["xtuner-2025-12"] = FIELDS["xtuner"]
FIELDS["verl-0.8"] = FIELDS["verl"]

# Which family a field belongs to, for "this flag needs --semantics X" messages.
FIELD_HOME = {
    "rollout_rs_threshold_lower": "verl-0.7.0",
    "rollout_token_veto_threshold": "verl-0.7.0",
    "rollout_is_level": "verl-0.6.0 or xtuner",
    "rollout_is_mode": "verl-0.6.0 or xtuner",
    "rollout_is_threshold_lower": "verl-0.6.0",
    "rollout_is_veto_threshold": "verl-0.6.0 or xtuner",
    "rollout_is_mask_threshold": "xtuner",
    "use_policy_gradient": "verl-0.6.1",
    "k1_bounds": "verl, verl-0.8 or verl-0.7.1",
    "rollout_is_batch_normalize": "verl, verl-0.8, verl-0.7.1, verl-0.7.0 or verl-0.6.1",
}


@dataclass(frozen=True)
class RatioBlockSpec:
    """verl 0.6/0.7's shared IS-metric block over raw safety-clamped ratios (docs/legacy-semantics.md §3)."""

    prefix: str  # "rollout_is" or "rollout_rs"
    level: str  # token | sequence | geometric
    upper: float
    lower: float
    geometric_fraction_by_rows: bool = False  # verl-old RS: mean over rows; elsewhere token-weighted
    valid_rows_only: bool = False  # xtuner head: seq_* over valid rows
    keep_band: tuple[float, float] | None = None  # (lower, upper) of a mask/RS band: adds masked fractions
    batch_normalize: str | None = None  # "valid" (0.7.x) or "all" (0.6.1) rows for sequence level
    percentiles: bool = False  # verl 0.6.0's p25..p99 of the raw weights


@dataclass(frozen=True)
class VetoSpec:
    """A catastrophic-token veto: a sequence is vetoed when a valid token's ratio leaves (lower, upper)."""

    lower: float | None
    upper: float | None = None
    valid_rows_only: bool = False  # xtuner head divides by valid rows, the others by all rows


@dataclass(frozen=True)
class LegacySpec:
    """What one older family computes, as plain data for the engine."""

    family: str
    prefix: str  # "rollout_corr/" or "mismatch/"
    blocks: tuple[RatioBlockSpec, ...] = ()
    veto: VetoSpec | None = None
    veto_keys: bool = False  # emit rollout_is_veto_fraction / _catastrophic_token_fraction
    offpolicy: str = "verl"  # "verl" (13 keys), "mismatch" (verl 0.6.0's 11) or "xtuner" (per pack)
    exact_mask: bool = False  # bool-mask arithmetic: no 1e-8 in means, float32 token fractions
    valid_key: bool = False  # xtuner head: `valid` in the IS metrics too
    enabled: bool = True  # verl 0.6.0 with no threshold computes nothing at all


def _positive_number(name: str, value: Any, family: str) -> float:
    if isinstance(value, str):
        # verl <= 0.7.1 compare the threshold with 0 before anything else: a string raises TypeError.
        raise ConfigError(
            f"{name} must be a number in {family} (got the string {value!r}; '<=' not supported between "
            "instances of 'str' and 'int')",
            hint="IcePop bands like 0.5_5.0 need --semantics verl (0.9)",
        )
    number = 1.0 if value is True else _number(name, value, family)  # True is 1.0 in these versions
    if not number > 0:
        raise ConfigError(f"{name} must be positive, got {number}.", hint=f"give {name} a positive number, e.g. 2.0")
    return number


def _number(name: str, value: Any, family: str) -> float:
    """A plain number for one of an older family's numeric fields (strict: no '_', nan or inf)."""
    hint = f"--semantics {family} takes one plain number for {name} (e.g. 2.0); IcePop bands L_U need --semantics verl"
    return parse_number(value, name, hint)


def _nonzero_upper(name: str, upper: float, family: str) -> float:
    # Without an explicit lower bound these versions use 1/U: U = 0 is a ZeroDivisionError upstream.
    if upper == 0:
        raise ConfigError(f"{name} 0 leaves no lower bound 1/U ({family} divides by it)",
                          hint=f"give {name} a positive number, or set the lower bound explicitly")
    return upper


def _pair(name: str, value: Any) -> tuple[float, float] | None:
    """An xtuner (upper, lower) tuple."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(
            f"1 validation error for RolloutImportanceSamplingConfig: {name} must be a pair (upper, lower), "
            f"got {value!r}",
            hint=f"give {name} as two numbers in xtuner's (upper, lower) order, e.g. 2.0,0.5",
        )
    hint = f"give {name} as two numbers in xtuner's (upper, lower) order, e.g. 2.0,0.5"
    return parse_number(value[0], f"{name} upper", hint), parse_number(value[1], f"{name} lower", hint)


def _float32_log(value: float) -> float:
    # Thresholds' logs are float32 scalar tensors upstream; compare against the same rounded value.
    import numpy as np

    with np.errstate(divide="ignore"):
        return float(np.log(np.float32(value)))


def resolve_family(family: str, fields: dict[str, Any]) -> tuple[ResolvedCorrection, dict[str, Any]]:
    """Validate a family's config as its upstream code does; return what the engine needs and the config."""
    # TOML has no null: "none" / "null" switch a field off (verl 0.6.0's veto is on by default).
    fields = {k: None if isinstance(v, str) and v.strip().lower() in ("none", "null") else v
              for k, v in fields.items()}
    mask_dtype = fields.pop("mask_dtype", None)
    if mask_dtype not in (None, "float", "bool"):
        raise ConfigError(f"mask_dtype must be 'float' or 'bool', got {mask_dtype!r}", hint="use float or bool")
    if family in XTUNER:
        # xtuner's trainer always hands over a bool mask (shifted_labels != -100): there is no float variant.
        if mask_dtype == "float":
            raise ConfigError(f"--semantics {family} always uses a bool mask, as xtuner's trainer does",
                              hint="drop --mask-dtype float (mask_dtype = \"bool\" is implied)")
        mask_dtype = "bool"
    mask_dtype = mask_dtype or "float"
    if mask_dtype == "bool" and family in VERL_FAMILIES:
        raise ConfigError("mask_dtype bool is supported for the older families only",
                          hint="verl 0.8 / 0.9's numbers differ from a bool mask's by < 1e-8 relative")
    resolved = resolve_legacy(family, fields)
    exact = {"mask_dtype": mask_dtype} if family not in VERL_FAMILIES else {}
    if isinstance(resolved, CorrectionConfig):
        if family in VERL_FAMILIES:
            return resolve(resolved), resolved.to_dict()
        result = _verl_071(resolved)
        if mask_dtype == "bool":
            result = replace(result, legacy=replace(result.legacy, exact_mask=True))
        return result, {**resolved.to_dict(), "semantics": family, **exact}
    if mask_dtype == "bool":
        resolved = replace(resolved, exact_mask=True)
    return ResolvedCorrection(None, None, False, legacy=resolved), {"semantics": family, **fields, **exact}


def _verl_071(config: CorrectionConfig) -> ResolvedCorrection:
    blocks: tuple[RatioBlockSpec, ...] = ()
    if config.rollout_is is not None and config.rollout_is_threshold is not None:
        if config.rollout_is not in ("token", "sequence"):
            raise ConfigError(f"Invalid rollout_is: {config.rollout_is}. Must be one of {{'token', 'sequence'}}.",
                              hint="use --is token, --is sequence or --is none")
        upper = _positive_number("rollout_is_threshold", config.rollout_is_threshold, "verl-0.7.1")
        normalize = "valid" if config.rollout_is_batch_normalize else None
        blocks = (RatioBlockSpec("rollout_is", config.rollout_is, upper, 1.0 / upper, batch_normalize=normalize),)
    rs_options = ()
    if config.rollout_rs is not None:
        if config.rollout_rs_threshold is None:
            parse_rs_thresholds([], None)
        rs_options = parse_rs_thresholds(parse_rs_options(config.rollout_rs), config.rollout_rs_threshold,
                                         check_order=False)
    spec = LegacySpec("verl-0.7.1", "rollout_corr/", blocks, offpolicy="verl")
    return ResolvedCorrection(None, None, False, rs_options=rs_options, k1_bounds=config.k1_bounds, legacy=spec)


def resolve_legacy(family: str, fields: dict[str, Any]) -> LegacySpec | CorrectionConfig:
    """Validate a family's config the way its upstream code does and describe what to compute."""
    if family not in FAMILIES:
        raise ConfigError(f"unknown semantics '{family}'", hint=f"use one of {', '.join(FAMILIES)}")
    allowed = FIELDS[family]
    wrong = [k for k in fields if k not in allowed]
    if wrong:
        homes = "; ".join(f"{k} belongs to --semantics {FIELD_HOME.get(k, 'another family')}" for k in wrong)
        raise ConfigError(f"{', '.join(wrong)} not understood by --semantics {family} ({homes})",
                          hint=f"--semantics {family} takes {', '.join(allowed)}")
    if family in (*VERL_FAMILIES, "verl-0.7.1"):
        preset = fields.get("preset")
        overrides = {k: v for k, v in fields.items() if k != "preset"}
        if family == "verl-0.7.1":
            if preset in ("decoupled_token_icepop", "bypass_pg_token_icepop"):
                raise ConfigError(f"preset '{preset}' does not exist in verl 0.7.1 (IcePop arrived in 0.8)",
                                  hint="use --semantics verl")
            config = build_config(overrides, preset=preset)
            if config.rollout_is is not None and config.rollout_is_threshold is not None:
                _positive_number("rollout_is_threshold", config.rollout_is_threshold, family)
            return config
        return build_config(overrides, preset=preset, semantics=family)
    if family in VERL_OLD:
        return _verl_old(family, fields)
    if family == "verl-0.6.0":
        return _verl_060(fields)
    return _xtuner(family, fields)


def _verl_old(family: str, fields: dict[str, Any]) -> LegacySpec:
    preset = fields.get("preset")
    if preset is not None:
        presets = legacy_presets(family)
        if preset not in presets:
            raise ConfigError(f"preset '{preset}' does not exist in {family}",
                              hint=f"run `mismatch presets --semantics {family}`")
        fields = {**presets[preset][0], **{k: v for k, v in fields.items() if k != "preset"}}
    blocks: list[RatioBlockSpec] = []
    level = fields.get("rollout_is")
    threshold = fields.get("rollout_is_threshold", 2.0)
    if level is not None and threshold is not None:
        if level not in ("token", "sequence"):
            raise ConfigError(f"Invalid rollout_is: {level}. Must be one of {{'sequence', 'token'}}.",
                              hint="geometric IS exists only in --semantics verl-0.6.0 / xtuner")
        upper = _positive_number("rollout_is_threshold", threshold, family)
        normalize = "all" if family == "verl-0.6.1" else "valid"
        blocks.append(RatioBlockSpec("rollout_is", level, upper, 1.0 / upper,
                                     batch_normalize=normalize if fields.get("rollout_is_batch_normalize") else None))
    rs = fields.get("rollout_rs")
    if rs is not None:
        if fields.get("rollout_rs_threshold") is None:
            raise ConfigError(
                "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
                "Set rollout_rs_threshold to the desired threshold value.", hint="add --rs-threshold")
        if rs not in ("token", "sequence", "geometric"):
            raise ConfigError(f"Invalid rollout_rs: {rs}. Must be one of {{'sequence', 'geometric', 'token'}}.",
                              hint="token_k1 ... seq_max_k3 are the verl >= 0.7.1 options: use --semantics verl")
        upper = _number("rollout_rs_threshold", fields["rollout_rs_threshold"], family)
        lower_value = fields.get("rollout_rs_threshold_lower")
        if lower_value is not None:
            lower = _number("rollout_rs_threshold_lower", lower_value, family)
        else:
            lower = 1.0 / _nonzero_upper("rollout_rs_threshold", upper, family)
        blocks.append(RatioBlockSpec("rollout_rs", rs, upper, lower, geometric_fraction_by_rows=True,
                                     keep_band=(lower, upper)))
    veto_value = fields.get("rollout_token_veto_threshold")
    veto = None
    if veto_value is not None:
        veto_number = _number("rollout_token_veto_threshold", veto_value, family)
        if not veto_number > 0:
            raise ConfigError(f"rollout_token_veto_threshold must be positive, got {veto_number}.",
                              hint="give a small positive ratio such as 1e-4, or none to switch the veto off")
        veto = VetoSpec(lower=veto_number)
    return LegacySpec(family, "rollout_corr/", tuple(blocks), veto, veto_keys=True, offpolicy="verl")


def _verl_060(fields: dict[str, Any]) -> LegacySpec:
    threshold = fields.get("rollout_is_threshold")
    if threshold is None:
        # mismatch_helper returns no metrics at all when the threshold (its on/off switch) is unset.
        return LegacySpec("verl-0.6.0", "mismatch/", enabled=False, offpolicy="none")
    level = fields.get("rollout_is_level", "token")
    mode = fields.get("rollout_is_mode", "truncate")
    if level not in ("token", "sequence", "geometric"):
        raise ConfigError(f"Invalid rollout_is_level: {level}. Must be 'token', 'sequence', or 'geometric'.",
                          hint="use --is-level token, sequence or geometric")
    if mode not in ("truncate", "mask"):
        raise ConfigError(f"Invalid rollout_is_mode: {mode}. Must be 'truncate' or 'mask'.",
                          hint="'both' is xtuner's: use --semantics xtuner")
    upper = _number("rollout_is_threshold", threshold, "verl-0.6.0")
    lower_value = fields.get("rollout_is_threshold_lower")
    if lower_value is not None:
        lower = _number("rollout_is_threshold_lower", lower_value, "verl-0.6.0")
    else:
        lower = 1.0 / _nonzero_upper("rollout_is_threshold", upper, "verl-0.6.0")
    veto_value = fields.get("rollout_is_veto_threshold", 1e-4)
    block = RatioBlockSpec("rollout_is", level, upper, lower,
                           keep_band=(lower, upper) if mode == "mask" else None, percentiles=True)
    veto = VetoSpec(lower=_number("rollout_is_veto_threshold", veto_value, "verl-0.6.0")) if veto_value is not None \
        else None
    return LegacySpec("verl-0.6.0", "mismatch/", (block,), veto, veto_keys=True, offpolicy="mismatch")


def _xtuner(family: str, fields: dict[str, Any]) -> LegacySpec:
    head = family == "xtuner"
    threshold = _pair("rollout_is_threshold", fields.get("rollout_is_threshold"))
    mask_threshold = _pair("rollout_is_mask_threshold", fields.get("rollout_is_mask_threshold"))
    veto_threshold = _pair("rollout_is_veto_threshold", fields.get("rollout_is_veto_threshold"))
    if threshold is None:
        return LegacySpec(family, "mismatch/", offpolicy="xtuner", exact_mask=True)
    level = fields.get("rollout_is_level", "token")
    mode = fields.get("rollout_is_mode", "truncate")
    if level not in ("token", "sequence", "geometric"):
        raise ConfigError(f"Invalid rollout_is_level: {level}. Must be 'token', 'sequence', or 'geometric'.",
                          hint="use --is-level token, sequence or geometric")
    if mode not in ("truncate", "mask", "both"):
        raise ConfigError(f"Invalid rollout_is_mode: {mode}. Must be 'truncate', 'mask', or 'both'.",
                          hint="use --is-mode truncate, mask or both")
    upper, lower = threshold
    if not upper > lower:
        raise ConfigError(
            f"upper_threshold must be greater than lower_threshold, but got {upper} and {lower}",
            hint="xtuner tuples are (upper, lower), e.g. --is-threshold 2.0,0.5")
    keep_band = None
    if mode in ("mask", "both"):
        mask_upper, mask_lower = mask_threshold or threshold
        if not mask_upper > mask_lower:
            raise ConfigError(
                f"upper_mask_threshold must be greater than lower_mask_threshold, but got {mask_upper} and "
                f"{mask_lower}", hint="xtuner tuples are (upper, lower)")
        keep_band = (mask_lower, mask_upper)
    block = RatioBlockSpec("rollout_is", level, upper, lower, valid_rows_only=head, keep_band=keep_band)
    veto = None
    if veto_threshold is not None:
        veto_upper, veto_lower = veto_threshold  # deliberately unchecked, as upstream
        veto = VetoSpec(lower=veto_lower, upper=veto_upper, valid_rows_only=head)
    return LegacySpec(family, "mismatch/", (block,), veto, veto_keys=True, offpolicy="xtuner", exact_mask=True,
                      valid_key=head)


GEO = {"rollout_rs": "geometric", "rollout_rs_threshold": 1.001, "rollout_rs_threshold_lower": None,
       "rollout_token_veto_threshold": 1e-4}


def legacy_presets(family: str) -> dict[str, tuple[dict[str, Any], str]]:
    """The presets of verl 0.6.1 / 0.7.0 (name -> (fields, summary))."""
    common = {
        "decoupled_token_is": ({"rollout_is": "token", "rollout_is_threshold": 2.0}, "token TIS U=2"),
        "decoupled_seq_is": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0}, "sequence TIS U=2"),
        "decoupled_seq_is_rs": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "sequence",
                                 "rollout_rs_threshold": 2.0}, "sequence TIS U=2 + sequence RS [0.5, 2]"),
        "decoupled_geo_rs": ({**GEO}, "geometric RS [1/1.001, 1.001] + veto 1e-4"),
        "disabled": ({}, "metrics only"),
        # Pre-release names (GitHub main, Nov 2025) that many copied configs still use.
        "token_is": ({"rollout_is": "token", "rollout_is_threshold": 2.0}, "pre-release name: token TIS U=2"),
        "seq_is": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0}, "pre-release name: sequence TIS U=2"),
        "seq_is_rs": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "sequence",
                       "rollout_rs_threshold": 2.0}, "pre-release name: sequence TIS + sequence RS"),
        "seq_mis": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "sequence",
                     "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.0},
                    "pre-release name: sequence TIS + sequence RS with no lower bound"),
        "geo_rs": ({**GEO}, "pre-release name: geometric RS + veto"),
        "geo_mis": ({**GEO, "rollout_rs_threshold_lower": 0.999},
                    "pre-release name: geometric RS [0.999, 1.001] + veto"),
        "pure_is": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "bypass_mode": True},
                    "pre-release name: bypass, pure policy gradient, sequence IS"),
    }
    if family == "verl-0.6.1":
        extra = {
            "ppo_is_bypass": ({"rollout_is": "token", "rollout_is_threshold": 2.0, "bypass_mode": True},
                              "bypass, token TIS U=2"),
            "pg_is": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "bypass_mode": True,
                       "use_policy_gradient": True}, "bypass policy gradient, sequence TIS U=2"),
            "pg_rs": ({**GEO, "bypass_mode": True, "use_policy_gradient": True},
                      "bypass policy gradient, geometric RS + veto"),
        }
    elif family == "verl-0.7.0":
        extra = {
            "geo_rs_seq_tis": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, **GEO},
                               "sequence TIS U=2 + geometric RS + veto"),
            "bypass_ppo_clip": ({"bypass_mode": True}, "bypass, PPO clip"),
            "bypass_ppo_clip_geo_rs": ({**GEO, "bypass_mode": True}, "bypass, PPO clip, geometric RS + veto"),
            "bypass_pg_is": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, "bypass_mode": True,
                              "loss_type": "reinforce"}, "bypass REINFORCE, sequence TIS U=2"),
            "bypass_pg_rs": ({**GEO, "bypass_mode": True, "loss_type": "reinforce"},
                             "bypass REINFORCE, geometric RS + veto"),
            "bypass_pg_geo_rs_seq_tis": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0, **GEO,
                                          "bypass_mode": True, "loss_type": "reinforce"},
                                         "bypass REINFORCE, sequence TIS + geometric RS + veto"),
        }
    else:
        extra = {}
    return {**common, **extra}


def threshold_log(value: float) -> float:
    """log of a threshold as upstream computes it (a float32 tensor); -inf for 0."""
    return _float32_log(value) if value > 0 else -math.inf


# CLI flag -> upstream field, per family (SPEC §3.3). A flag missing here is refused for that family.
FLAG_FIELDS: dict[str, dict[str, str]] = {
    "verl-0.7.1": {"--is": "rollout_is", "--is-threshold": "rollout_is_threshold",
                   "--is-batch-normalize": "rollout_is_batch_normalize", "--rs": "rollout_rs",
                   "--rs-threshold": "rollout_rs_threshold", "--k1-bounds": "k1_bounds", "--preset": "preset",
                   "--mask-dtype": "mask_dtype"},
    "verl-0.7.0": {"--is": "rollout_is", "--is-threshold": "rollout_is_threshold",
                   "--is-batch-normalize": "rollout_is_batch_normalize", "--rs": "rollout_rs",
                   "--rs-threshold": "rollout_rs_threshold", "--rs-threshold-lower": "rollout_rs_threshold_lower",
                   "--veto-threshold": "rollout_token_veto_threshold", "--preset": "preset",
                   "--mask-dtype": "mask_dtype"},
    "verl-0.6.0": {"--is-level": "rollout_is_level", "--is-mode": "rollout_is_mode",
                   "--is-threshold": "rollout_is_threshold", "--is-threshold-lower": "rollout_is_threshold_lower",
                   "--veto-threshold": "rollout_is_veto_threshold", "--mask-dtype": "mask_dtype"},
    "xtuner": {"--is-level": "rollout_is_level", "--is-mode": "rollout_is_mode",
               "--is-threshold": "rollout_is_threshold", "--is-mask-threshold": "rollout_is_mask_threshold",
               "--veto-threshold": "rollout_is_veto_threshold", "--mask-dtype": "mask_dtype"},
}
FLAG_FIELDS["verl-0.6.1"] = FLAG_FIELDS["verl-0.7.0"]
FLAG_FIELDS["xtuner-2025-12"] = FLAG_FIELDS["xtuner"]
FLAG_FIELDS["verl-0.8"] = {flag: field for flag, field in FLAG_FIELDS["verl-0.7.1"].items() if flag != "--mask-dtype"}
VERL_FLAGS = ("--is", "--is-threshold", "--is-batch-normalize", "--rs", "--rs-threshold", "--k1-bounds", "--preset")


def family_fields_from_flags(family: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Map the CLI flags a user gave to the family's upstream fields, refusing flags of other families."""
    table = FLAG_FIELDS.get(family, {flag: flag for flag in VERL_FLAGS})
    fields: dict[str, Any] = {}
    for flag, value in flags.items():
        if value is None:
            continue
        if flag not in table:
            homes = [f for f, flags_of in FLAG_FIELDS.items() if flag in flags_of and f != "xtuner-2025-12"]
            if flag in VERL_FLAGS:
                homes = ["verl", *homes]
            raise ConfigError(f"{flag} is not an option of --semantics {family}",
                              hint=f"{flag} belongs to --semantics {' / '.join(homes)}")
        name = table[flag]
        if family.startswith("xtuner") and flag in ("--is-threshold", "--is-mask-threshold", "--veto-threshold"):
            fields[name] = _pair(name, value)
        elif flag in ("--is-threshold", "--rs-threshold", "--veto-threshold", "--is-threshold-lower",
                      "--rs-threshold-lower"):
            if family in (*VERL_OLD, "verl-0.6.0") and value.strip().lower() not in ("none", "null"):
                fields[name] = _number(flag, value, family)  # these versions take one number per field
            else:
                fields[name] = threshold_value(value, flag)
        else:
            fields[name] = value
    return fields


def presets_071() -> dict[str, Any]:
    """verl 0.7.1's presets: today's, minus the IcePop ones that arrived in 0.8."""
    from mismatch_cli.config import PRESETS

    return {name: p for name, p in PRESETS.items() if "icepop" not in name}


def effective_fields(family: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields a run really used: a verl 0.6.1 / 0.7.0 preset expanded, explicit fields on top."""
    preset = fields.get("preset")
    if family in VERL_OLD and preset in legacy_presets(family):
        return {**legacy_presets(family)[preset][0], **fields}
    return dict(fields)
