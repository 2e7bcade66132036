"""The verl families that take `algorithm.rollout_correction` fields: verl 0.9, 0.8 and 0.7.1, with presets.

verl 0.9 and 0.8 drive the engine's own IS / RS accumulators; verl 0.7.1 keeps the k1/k2/k3 RS
options but computes its IS keys with the older ratio block (docs/legacy-semantics.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import (
    IS_LEVELS,
    FamilySpec,
    IsThreshold,
    RatioBlockSpec,
    ResolvedCorrection,
    RsOption,
)
from mismatch_cli.correction.parse import (
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
    positive_number,
    require_rs_threshold,
)
from mismatch_cli.errors import ConfigError, did_you_mean

VERL_DEFAULTS: dict[str, Any] = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
    "bypass_mode": False,
    "loss_type": "ppo_clip",
    "k1_bounds": "verl",  # "verl" reproduces verl's inverted k1 bounds; "ratio" keeps L <= rho <= U
}
VERL_FIELDS = (*VERL_DEFAULTS, "preset")


@dataclass(frozen=True)
class Preset:
    """A named verl preset (`RolloutCorrectionConfig.<name>()` with its default arguments)."""

    name: str
    fields: dict[str, Any]  # every field of VERL_DEFAULTS
    summary: str


def _preset(name: str, summary: str, **fields: Any) -> Preset:
    return Preset(name, {**VERL_DEFAULTS, **fields}, summary)


GEO = "0.999_1.001"
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset("decoupled_token_is", "token-level TIS, U=2", rollout_is="token"),
        _preset("decoupled_seq_is", "sequence-level TIS, U=2", rollout_is="sequence"),
        _preset("decoupled_token_icepop", "token-level IcePop band [0.5, 5]",
                rollout_is="token", rollout_is_threshold="0.5_5.0"),
        _preset("decoupled_seq_is_rs", "sequence TIS U=2 + seq_sum_k1 RS 0.5_2.0",
                rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
        _preset("decoupled_geo_rs", "Geo-RS: seq_mean_k1 0.999_1.001, no IS",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_geo_rs_seq_tis", "Geo-RS + sequence TIS U=2",
                rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_geo_rs_token_tis", "Geo-RS + token TIS U=2",
                rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("decoupled_k3_rs", "seq_mean_k3 RS 0.01, no IS", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("decoupled_k3_rs_seq_tis", "seq_mean_k3 RS 0.01 + sequence TIS U=2",
                rollout_is="sequence", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("decoupled_k3_rs_token_tis", "seq_mean_k3 RS 0.01 + token TIS U=2",
                rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("bypass_ppo_clip", "bypass mode, PPO clip, metrics only", bypass_mode=True),
        _preset("bypass_ppo_clip_geo_rs", "bypass mode + Geo-RS 0.999_1.001",
                bypass_mode=True, rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_ppo_clip_k3_rs", "bypass mode + seq_mean_k3 RS 0.01",
                bypass_mode=True, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
        _preset("bypass_pg_is", "bypass REINFORCE + sequence TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="sequence"),
        _preset("bypass_pg_token_icepop", "bypass REINFORCE + token IcePop [0.5, 5]",
                bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold="0.5_5.0"),
        _preset("bypass_pg_geo_rs", "bypass REINFORCE + Geo-RS 0.999_1.001",
                bypass_mode=True, loss_type="reinforce", rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_pg_geo_rs_seq_tis", "bypass REINFORCE + Geo-RS + sequence TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="sequence",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("bypass_pg_geo_rs_token_tis", "bypass REINFORCE + Geo-RS + token TIS U=2",
                bypass_mode=True, loss_type="reinforce", rollout_is="token",
                rollout_rs="seq_mean_k1", rollout_rs_threshold=GEO),
        _preset("disabled", "metrics only (verl's default)"),
    )
}
# verl 0.7.1's presets: today's, minus the IcePop ones that arrived in 0.8.
PRESETS_071: dict[str, Preset] = {name: p for name, p in PRESETS.items() if "icepop" not in name}


def get_preset(name: str) -> Preset:
    """Look up a preset by name, with a helpful error for unknown or outdated names."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(
            f"unknown preset '{name}'",
            hint=did_you_mean(str(name), PRESETS, "run `mismatch presets` for the 19 verl presets",
                              "{} (run `mismatch presets` for all 19)"),
        )
    return PRESETS[name]


def check_071_preset(preset: Any) -> None:
    """Refuse the presets verl 0.7.1 did not have yet."""
    if preset is not None and preset not in PRESETS_071 and preset in PRESETS:
        raise ConfigError(f"preset '{preset}' does not exist in verl 0.7.1 (IcePop arrived in 0.8)",
                          hint="use semantics verl")


def _check_common(values: Mapping[str, Any]) -> None:
    if values["k1_bounds"] not in ("verl", "ratio"):
        raise ConfigError(f"k1 bounds must be 'verl' or 'ratio', got {values['k1_bounds']!r}.",
                          hint='set k1_bounds to "verl" (as verl) or "ratio" (L <= ratio <= U)')


def _check_is_level(level: Any) -> None:
    if level not in IS_LEVELS:
        raise ConfigError(
            f"Invalid rollout_is: {level}. Must be one of {set(IS_LEVELS)}.",
            hint='set rollout_is to "token", "sequence" or none',
        )


def _rs_options(values: Mapping[str, Any], check_order: bool) -> tuple[RsOption, ...]:
    if values["rollout_rs"] is None:
        return ()
    require_rs_threshold(values["rollout_rs_threshold"])
    return parse_rs_thresholds(parse_rs_options(values["rollout_rs"]), values["rollout_rs_threshold"],
                               check_order=check_order)


def resolve_verl(values: Mapping[str, Any], family: str = "verl") -> ResolvedCorrection:
    """Validate verl 0.9 / 0.8 fields the way verl does at compute time and return what the engine needs."""
    _check_common(values)
    if values["loss_type"] not in ("ppo_clip", "reinforce"):
        raise ConfigError(f"loss_type must be 'ppo_clip' or 'reinforce', got {values['loss_type']!r}.",
                          hint='write loss_type = "ppo_clip" or "reinforce"')
    is_level: str | None = None
    is_threshold: IsThreshold | None = None
    # verl skips IS silently when the threshold is None even if rollout_is is set.
    if values["rollout_is"] is not None and values["rollout_is_threshold"] is not None:
        _check_is_level(values["rollout_is"])
        is_level = values["rollout_is"]
        is_threshold = parse_is_threshold(values["rollout_is_threshold"])
    old = family == "verl-0.8"
    return ResolvedCorrection(
        is_level=is_level,
        is_threshold=is_threshold,
        is_batch_normalize=bool(values["rollout_is_batch_normalize"]),
        # verl 0.9.0 added the lower <= upper check on k1 bands (PR #7188); 0.8 rejects everything instead.
        rs_options=_rs_options(values, check_order=not old),
        k1_bounds=values["k1_bounds"],
        seq_fraction_weights="applied" if old else "raw",
    )


def resolve_071(values: Mapping[str, Any]) -> ResolvedCorrection:
    """verl 0.7.1: the k1/k2/k3 RS options of today, IS keys from the older ratio block."""
    _check_common(values)
    blocks: tuple[RatioBlockSpec, ...] = ()
    if values["rollout_is"] is not None and values["rollout_is_threshold"] is not None:
        upper = positive_number("rollout_is_threshold", values["rollout_is_threshold"], "verl-0.7.1")
        _check_is_level(values["rollout_is"])
        normalize = "valid" if values["rollout_is_batch_normalize"] else None
        blocks = (RatioBlockSpec("rollout_is", values["rollout_is"], upper, 1.0 / upper, batch_normalize=normalize),)
    rs_options = _rs_options(values, check_order=False)  # verl 0.7.1 does not check k1 band order
    spec = FamilySpec("verl-0.7.1", "rollout_corr/", blocks, offpolicy="rollout_corr", actor_recomputes_offpolicy=True)
    return ResolvedCorrection(None, None, False, rs_options=rs_options, k1_bounds=values["k1_bounds"],
                              family_spec=spec)

# `mismatch replay`'s verl column. verl's defaults turn no IS on (rollout_is = None), so the column runs the
# setting its docs lead with: token TIS at the default threshold 2.0 (recipe `decoupled_token_is`).
VERL_REPLAY_FIELDS: dict[str, Any] = {"rollout_is": "token", "rollout_is_threshold": 2.0}
VERL_REPLAY_NOTE = "its defaults turn no IS on: runs its documented token TIS (rollout_is=token, threshold 2.0)"
# Shaped like ReplayFamily.concepts / .traits (correction/model.py: CONCEPTS, TRAITS). verl logs no token mean of
# |old - rollout| (log_ppl_abs_diff is a row mean of |mean d|, another quantity), so abs_diff is not mapped.
VERL_CONCEPTS: dict[str, str] = {
    "kl": "rollout_corr/kl",
    "chi2": "rollout_corr/chi2_token",
    "weight_mean": "rollout_corr/rollout_is_mean",
    "truncated": "rollout_corr/rollout_is_ratio_fraction_high",
    "masked": "rollout_corr/rollout_rs_masked_fraction",
    "dropped": "rollout_corr/rollout_rs_seq_masked_fraction",
}
VERL_TRAITS: dict[str, str] = {
    "estimator": "k1: token mean of rollout - train (signed)",
    "sequence": "token level: one weight per token, no sequence weight",
    "clamp": "log-ratio clamped to [-20, 20] before exp",
    "reduction": "token mean over the batch's valid tokens",
    "threshold": "token TIS: weights truncated at 2",
}
