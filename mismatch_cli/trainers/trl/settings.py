"""TRL 1.16.0's vLLM importance-sampling correction: its `GRPOConfig` fields, defaults and checks.

The formulas (weights per mode, the five `sampling/*` keys) live in `engine.py`; the semantics,
with the upstream file, method and line numbers, in docs/trl-semantics.md. Here is the data: TRL's
field names and defaults, how `GRPOConfig.__post_init__` resolves and refuses them, the `TrlSpec`
the engine reads, and the family as semantics `trl` knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily, cap_not_positive
from mismatch_cli.correction.parse import field_bool, field_number
from mismatch_cli.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class TrlSpec:
    """TRL's vLLM importance-sampling correction as resolved (docs/trl-semantics.md): mode and bounds."""

    level: str  # token | sequence (the sequence log-ratio is the row's sum, unclamped)
    bound: str  # truncate (clamp the ratio) | mask (zero a ratio outside [clip_min, clip_max])
    clip_min: float | None
    clip_max: float | None


# GRPOConfig's fields of the correction (trl/trainer/grpo_config.py at 1.16.0) and their defaults.
TRL_DEFAULTS: dict[str, Any] = {
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_cap": None,  # deprecated: overwrites clip_max when set
}
TRL_FIELDS = tuple(TRL_DEFAULTS)
TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
NUMBER_FIELDS = ("vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
                 "vllm_importance_sampling_cap")
# Where the correction is written upstream, for the registry and the report's notes.
TRL_SOURCE = "trl/trainer/grpo_trainer.py:GRPOTrainer._generate_and_score_completions (TRL 1.16.0)"


def resolve_trl(fields: dict[str, Any]) -> tuple[TrlSpec | None, dict[str, Any]]:
    """The fields as `GRPOConfig` resolves and checks them, and what the engine computes (None: correction off)."""
    values = {**TRL_DEFAULTS, **fields}
    for name in NUMBER_FIELDS:
        values[name] = field_number(name, values[name], 3.0, optional=True)
    values["vllm_importance_sampling_correction"] = field_bool("vllm_importance_sampling_correction",
                                                              values["vllm_importance_sampling_correction"])
    if values["vllm_importance_sampling_cap"] is not None:  # GRPOConfig: the deprecated cap overwrites clip_max
        values["vllm_importance_sampling_clip_max"] = values["vllm_importance_sampling_cap"]
    mode = values["vllm_importance_sampling_mode"]
    low, high = values["vllm_importance_sampling_clip_min"], values["vllm_importance_sampling_clip_max"]
    if low is not None and high is not None and low >= high:
        raise ConfigError(f"vllm_importance_sampling_clip_min ({low}) must be less than "
                          f"vllm_importance_sampling_clip_max ({high}).",
                          hint="give clip_min below clip_max, or none for no lower bound")
    if isinstance(mode, str) and mode.endswith("_truncate") and low is None and high is None:
        raise ConfigError("At least one of `vllm_importance_sampling_clip_min` or `vllm_importance_sampling_clip_max` "
                          "must be set when `vllm_importance_sampling_mode` is a `*_truncate` mode.",
                          hint="set vllm_importance_sampling_clip_max (TRL's default is 3.0)")
    if mode not in TRL_MODES:
        # GRPOConfig accepts any name; the ratio block refuses it with this message when it first runs.
        raise ConfigError(f"Unknown vLLM importance sampling level: {mode}. Possible values are 'token_truncate', "
                          "'token_mask', 'sequence_truncate', and 'sequence_mask'.",
                          hint=did_you_mean(str(mode), TRL_MODES, f"use one of {', '.join(TRL_MODES)}"))
    effective = {k: v for k, v in values.items() if k != "vllm_importance_sampling_cap"}
    if not values["vllm_importance_sampling_correction"]:
        return None, effective
    level, bound = mode.split("_")
    return TrlSpec(level=level, bound=bound, clip_min=low, clip_max=high), effective


def describe_trl(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: TRL's mode and the bounds it uses."""
    if not config.get("vllm_importance_sampling_correction"):
        return "none (vllm_importance_sampling_correction=false)"
    fields = ("vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")
    bounds = [f"{key}={config[key]}" for key in fields if config.get(key) is not None]
    return ", ".join([f"vllm_importance_sampling_mode={config.get('vllm_importance_sampling_mode')}", *bounds])


def warn_trl(fields: Mapping[str, Any]) -> list[str]:
    """GRPOConfig's own warning: the deprecated cap, when given, replaces clip_max (even one given explicitly)."""
    cap = fields.get("vllm_importance_sampling_cap")
    if cap is None or (isinstance(cap, str) and cap.strip().lower() in ("none", "null")):
        return []
    given = fields.get("vllm_importance_sampling_clip_max")
    replaced = f"; it replaces the vllm_importance_sampling_clip_max={given} you gave" if given is not None else ""
    return [f"TRL: The `vllm_importance_sampling_cap` argument is deprecated and will be removed in v2.0.0. Use "
            f"`vllm_importance_sampling_clip_max` instead (grpo_config.py:1143){replaced}"]


FAMILY = ReplayFamily(
    name="trl",
    accumulator="mismatch_cli.trainers.trl.engine:TrlAccumulator",
    keys="mismatch_cli.trainers.trl.keys",
    fixes="mismatch_cli.trainers.trl.fixes",
    position=10,
    warns=warn_trl,
    degenerate=(cap_not_positive("vllm_importance_sampling_clip_max", "caps every weight at a value <= 0 "
                             "(truncate modes) or zeroes every weight (mask modes)",
                             "sampling/importance_sampling_ratio/mean",
                             lambda v: bool(v.get("vllm_importance_sampling_correction"))),),
    needs=tuple(Needs(name, "vllm_importance_sampling_correction=true",
                      lambda v: bool(v.get("vllm_importance_sampling_correction")))
                for name in ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                             "vllm_importance_sampling_clip_min")),
    title="TRL 1.16.0 vLLM importance sampling",
    source=TRL_SOURCE,
    defaults=TRL_DEFAULTS,
    kinds={"vllm_importance_sampling_correction": "bool", "vllm_importance_sampling_mode": "string",
           "vllm_importance_sampling_clip_max": "number", "vllm_importance_sampling_clip_min": "number",
           "vllm_importance_sampling_cap": "number"},
    resolve=resolve_trl,
    describe=describe_trl,
    lead_keys=("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean"),
    concepts={"abs_diff": "sampling/sampling_logp_difference/mean",
              "weight_mean": "sampling/importance_sampling_ratio/mean"},
    traits={"sequence": "exp(sum of d), no clamp: overflows to inf on long rows",
            "clamp": "none on the log-ratio",
            "reduction": "mean over the batch's tokens or rows per process, then over processes",
            "threshold": "sequence_mask: weight 0 above clip_max 3"},
)
