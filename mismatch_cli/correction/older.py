"""The older families: verl 0.7.0 / 0.6.1, verl 0.6.0 and xtuner, each with its fields, presets and checks.

Each family takes its own upstream field names verbatim and is validated the way its upstream code
validates at compute time (reference: docs/legacy-semantics.md). The result is a `FamilySpec`, a
plain description of which metric blocks the engine must compute.
"""

from __future__ import annotations

from typing import Any

from mismatch_cli.correction.model import FamilySpec, RatioBlockSpec, VetoSpec
from mismatch_cli.correction.parse import nonzero_upper, pair, plain_number, positive_number, require_rs_threshold
from mismatch_cli.errors import ConfigError, did_you_mean

VERL_OLD = ("verl-0.7.0", "verl-0.6.1")
XTUNER = ("xtuner", "xtuner-2025-12")

# The upstream config fields each family accepts (its `[correction]` table takes them verbatim).
OLDER_FIELDS: dict[str, tuple[str, ...]] = {
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
OLDER_FIELDS["xtuner-2025-12"] = OLDER_FIELDS["xtuner"]

GEO = {"rollout_rs": "geometric", "rollout_rs_threshold": 1.001, "rollout_rs_threshold_lower": None,
       "rollout_token_veto_threshold": 1e-4}
_TIS2 = {"rollout_is_threshold": 2.0}
_COMMON_PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "decoupled_token_is": ({"rollout_is": "token", **_TIS2}, "token TIS U=2"),
    "decoupled_seq_is": ({"rollout_is": "sequence", **_TIS2}, "sequence TIS U=2"),
    "decoupled_seq_is_rs": ({"rollout_is": "sequence", **_TIS2, "rollout_rs": "sequence", "rollout_rs_threshold": 2.0},
                            "sequence TIS U=2 + sequence RS [0.5, 2]"),
    "decoupled_geo_rs": ({**GEO}, "geometric RS [1/1.001, 1.001] + veto 1e-4"),
    "disabled": ({}, "metrics only"),
    # Pre-release names (GitHub main, Nov 2025) that many copied configs still use.
    "token_is": ({"rollout_is": "token", **_TIS2}, "pre-release name: token TIS U=2"),
    "seq_is": ({"rollout_is": "sequence", **_TIS2}, "pre-release name: sequence TIS U=2"),
    "seq_is_rs": ({"rollout_is": "sequence", **_TIS2, "rollout_rs": "sequence", "rollout_rs_threshold": 2.0},
                  "pre-release name: sequence TIS + sequence RS"),
    "seq_mis": ({"rollout_is": "sequence", **_TIS2, "rollout_rs": "sequence", "rollout_rs_threshold": 2.0,
                 "rollout_rs_threshold_lower": 0.0},
                "pre-release name: sequence TIS + sequence RS with no lower bound"),
    "geo_rs": ({**GEO}, "pre-release name: geometric RS + veto"),
    "geo_mis": ({**GEO, "rollout_rs_threshold_lower": 0.999}, "pre-release name: geometric RS [0.999, 1.001] + veto"),
    "pure_is": ({"rollout_is": "sequence", **_TIS2, "bypass_mode": True},
                "pre-release name: bypass, pure policy gradient, sequence IS"),
}
# The presets of verl 0.6.1 / 0.7.0 (name -> (fields, summary)).
OLDER_PRESETS: dict[str, dict[str, tuple[dict[str, Any], str]]] = {
    "verl-0.6.1": {
        **_COMMON_PRESETS,
        "ppo_is_bypass": ({"rollout_is": "token", **_TIS2, "bypass_mode": True}, "bypass, token TIS U=2"),
        "pg_is": ({"rollout_is": "sequence", **_TIS2, "bypass_mode": True, "use_policy_gradient": True},
                  "bypass policy gradient, sequence TIS U=2"),
        "pg_rs": ({**GEO, "bypass_mode": True, "use_policy_gradient": True},
                  "bypass policy gradient, geometric RS + veto"),
    },
    "verl-0.7.0": {
        **_COMMON_PRESETS,
        "geo_rs_seq_tis": ({"rollout_is": "sequence", **_TIS2, **GEO}, "sequence TIS U=2 + geometric RS + veto"),
        "bypass_ppo_clip": ({"bypass_mode": True}, "bypass, PPO clip"),
        "bypass_ppo_clip_geo_rs": ({**GEO, "bypass_mode": True}, "bypass, PPO clip, geometric RS + veto"),
        "bypass_pg_is": ({"rollout_is": "sequence", **_TIS2, "bypass_mode": True, "loss_type": "reinforce"},
                         "bypass REINFORCE, sequence TIS U=2"),
        "bypass_pg_rs": ({**GEO, "bypass_mode": True, "loss_type": "reinforce"},
                         "bypass REINFORCE, geometric RS + veto"),
        "bypass_pg_geo_rs_seq_tis": ({"rollout_is": "sequence", **_TIS2, **GEO, "bypass_mode": True,
                                      "loss_type": "reinforce"},
                                     "bypass REINFORCE, sequence TIS + geometric RS + veto"),
    },
}


def older_presets(family: str) -> dict[str, tuple[dict[str, Any], str]]:
    """The presets of an older family (name -> (fields, summary)); empty for those without presets."""
    return OLDER_PRESETS.get(family, {})


def expand_preset(family: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields a run really used: a verl 0.6.1 / 0.7.0 preset expanded, explicit fields on top."""
    preset = fields.get("preset")
    presets = older_presets(family)
    if preset in presets:
        return {**presets[preset][0], **fields}
    return dict(fields)


def resolve_older(family: str, fields: dict[str, Any]) -> FamilySpec:
    """Validate an older family's fields the way its upstream code does and describe what to compute."""
    if family in VERL_OLD:
        return _verl_old(family, fields)
    if family == "verl-0.6.0":
        return _verl_060(fields)
    return _xtuner(family, fields)


def _verl_old(family: str, fields: dict[str, Any]) -> FamilySpec:
    preset = fields.get("preset")
    if preset is not None:
        presets = older_presets(family)
        if preset not in presets:
            raise ConfigError(f"preset '{preset}' does not exist in {family}",
                              hint=f"{family}'s presets are {', '.join(presets)}")
        fields = {**presets[preset][0], **{k: v for k, v in fields.items() if k != "preset"}}
    blocks: list[RatioBlockSpec] = []
    level = fields.get("rollout_is")
    threshold = fields.get("rollout_is_threshold", 2.0)
    if level is not None and threshold is not None:
        if level not in ("token", "sequence"):
            raise ConfigError(f"Invalid rollout_is: {level}. Must be one of {{'sequence', 'token'}}.",
                              hint="geometric IS exists only in the verl-0.6.0 and xtuner families")
        upper = positive_number("rollout_is_threshold", threshold, family)
        normalize = "all" if family == "verl-0.6.1" else "valid"
        blocks.append(RatioBlockSpec("rollout_is", level, upper, 1.0 / upper,
                                     batch_normalize=normalize if fields.get("rollout_is_batch_normalize") else None))
    rs = fields.get("rollout_rs")
    if rs is not None:
        require_rs_threshold(fields.get("rollout_rs_threshold"))
        if rs not in ("token", "sequence", "geometric"):
            raise ConfigError(f"Invalid rollout_rs: {rs}. Must be one of {{'sequence', 'geometric', 'token'}}.",
                              hint="token_k1 ... seq_max_k3 are the verl >= 0.7.1 options: use semantics verl")
        upper = plain_number("rollout_rs_threshold", fields["rollout_rs_threshold"], family)
        lower_value = fields.get("rollout_rs_threshold_lower")
        if lower_value is not None:
            lower = plain_number("rollout_rs_threshold_lower", lower_value, family)
        else:
            lower = 1.0 / nonzero_upper("rollout_rs_threshold", upper, family)
        blocks.append(RatioBlockSpec("rollout_rs", rs, upper, lower, geometric_fraction_by_rows=True,
                                     keep_band=(lower, upper)))
    veto_value = fields.get("rollout_token_veto_threshold")
    veto = None
    if veto_value is not None:
        veto_number = plain_number("rollout_token_veto_threshold", veto_value, family)
        if not veto_number > 0:
            raise ConfigError(f"rollout_token_veto_threshold must be positive, got {veto_number}.",
                              hint="give a small positive ratio such as 1e-4, or none to switch the veto off")
        veto = VetoSpec(lower=veto_number)
    return FamilySpec(family, "rollout_corr/", tuple(blocks), veto, veto_keys=True, veto_keys_always=True,
                      offpolicy="rollout_corr", actor_recomputes_offpolicy=True)


def _verl_060(fields: dict[str, Any]) -> FamilySpec:
    threshold = fields.get("rollout_is_threshold")
    if threshold is None:
        # mismatch_helper returns no metrics at all when the threshold (its on/off switch) is unset.
        return FamilySpec("verl-0.6.0", "mismatch/", enabled=False, offpolicy="none")
    level = fields.get("rollout_is_level", "token")
    mode = fields.get("rollout_is_mode", "truncate")
    if level not in ("token", "sequence", "geometric"):
        raise ConfigError(f"Invalid rollout_is_level: {level}. Must be 'token', 'sequence', or 'geometric'.",
                          hint=did_you_mean(str(level), ("token", "sequence", "geometric"),
                                            'set rollout_is_level to "token", "sequence" or "geometric"'))
    if mode not in ("truncate", "mask"):
        raise ConfigError(f"Invalid rollout_is_mode: {mode}. Must be 'truncate' or 'mask'.",
                          hint="'both' is xtuner's: use semantics xtuner" if mode == "both" else
                          did_you_mean(str(mode), ("truncate", "mask"), "use truncate or mask"))
    upper = plain_number("rollout_is_threshold", threshold, "verl-0.6.0")
    lower_value = fields.get("rollout_is_threshold_lower")
    if lower_value is not None:
        lower = plain_number("rollout_is_threshold_lower", lower_value, "verl-0.6.0")
    else:
        lower = 1.0 / nonzero_upper("rollout_is_threshold", upper, "verl-0.6.0")
    veto_value = fields.get("rollout_is_veto_threshold", 1e-4)
    block = RatioBlockSpec("rollout_is", level, upper, lower,
                           keep_band=(lower, upper) if mode == "mask" else None, percentiles=True)
    veto = VetoSpec(lower=plain_number("rollout_is_veto_threshold", veto_value, "verl-0.6.0")) \
        if veto_value is not None else None
    return FamilySpec("verl-0.6.0", "mismatch/", (block,), veto, veto_keys=True, offpolicy="mismatch")


def _xtuner(family: str, fields: dict[str, Any]) -> FamilySpec:
    head = family == "xtuner"  # the 2025-12 release merges packs and counts veto rows differently
    threshold = pair("rollout_is_threshold", fields.get("rollout_is_threshold"))
    mask_threshold = pair("rollout_is_mask_threshold", fields.get("rollout_is_mask_threshold"))
    veto_threshold = pair("rollout_is_veto_threshold", fields.get("rollout_is_veto_threshold"))
    packs = {"offpolicy": "pack", "per_pack": True, "merge_valid_packs_only": head, "exact_mask": True}
    if threshold is None:
        return FamilySpec(family, "mismatch/", **packs)
    level = fields.get("rollout_is_level", "token")
    mode = fields.get("rollout_is_mode", "truncate")
    if level not in ("token", "sequence", "geometric"):
        raise ConfigError(f"Invalid rollout_is_level: {level}. Must be 'token', 'sequence', or 'geometric'.",
                          hint=did_you_mean(str(level), ("token", "sequence", "geometric"),
                                            'set rollout_is_level to "token", "sequence" or "geometric"'))
    if mode not in ("truncate", "mask", "both"):
        raise ConfigError(f"Invalid rollout_is_mode: {mode}. Must be 'truncate', 'mask', or 'both'.",
                          hint=did_you_mean(str(mode), ("truncate", "mask", "both"),
                                            'set rollout_is_mode to "truncate", "mask" or "both"'))
    upper, lower = threshold
    if not upper > lower:
        raise ConfigError(
            f"upper_threshold must be greater than lower_threshold, but got {upper} and {lower}",
            hint="xtuner tuples are (upper, lower), e.g. rollout_is_threshold = [2.0, 0.5]")
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
    return FamilySpec(family, "mismatch/", (block,), veto, veto_keys=True, valid_key=head, **packs)

# `mismatch replay`'s xtuner column: xtuner's own defaults (rollout_is_threshold unset: metrics only, no weight).
# Shaped like ReplayFamily.concepts / .traits (correction/model.py). xtuner's rollout_is_mean is the mean of the
# raw ratios, not of corrected weights, so weight_mean is not mapped.
XTUNER_CONCEPTS: dict[str, str] = {
    "abs_diff": "mismatch/mismatch_logprob_abs_diff",
    "kl": "mismatch/mismatch_kl",
    "truncated": "mismatch/rollout_is_ratio_fraction_high",
    "masked": "mismatch/rollout_is_masked_fraction",
    "dropped": "mismatch/rollout_is_veto_fraction",
}
XTUNER_TRAITS: dict[str, str] = {
    "estimator": "k1: token mean of rollout - train (signed)",
    "sequence": "no IS weight by default (rollout_is_threshold unset)",
    "clamp": "weights clamped at both ends [lower, upper] when IS is on",
    "reduction": "token mean per pack (one input file), packs merged by their mean",
    "threshold": "none by default: metrics only",
}
