"""OpenRLHF 0.11.2's train/rollout log-prob mismatch correction: its `PolicyLoss` settings, defaults and checks.

The formulas (the gated statistic, the mask / clip filter, `vllm_kl`, `is_filter_ratio` and their token-weighted
reduction over micro-batches) live in `engine.py`; the semantics, with the upstream files and functions,
in docs/openrlhf-semantics.md. Here is the data: the settings by `PolicyLoss`'s own parameter names (the arguments
`algo.advantage.is_correction_*` and `actor.policy_loss_type` of openrlhf/cli/train_ppo_ray.py), plus
`micro_train_batch_size` (the actor's name for `train.micro_batch_size`, which sets how the keys are averaged),
how OpenRLHF refuses them, the `OpenrlhfSpec` the engine reads, and the family as semantics `openrlhf` knows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Degenerate, Needs, ReplayFamily
from mismatch_cli.errors import ConfigError, did_you_mean
from mismatch_cli.system.numbers import parse_number


@dataclass(frozen=True)
class OpenrlhfSpec:
    """OpenRLHF's correction as resolved (docs/openrlhf-semantics.md): the gate and its band."""

    level: str  # token | seq
    mode: str  # mask | clip
    gating: str  # ratio | binary_kl | tv
    low: float
    high: float
    micro_batch_size: int  # rows per micro-batch, in dump order


# train_ppo_ray.py's add_argument defaults at 0.11.2 (PolicyLoss's parameter names), then the micro-batch size.
OPENRLHF_DEFAULTS: dict[str, Any] = {
    "is_correction_level": "off",
    "is_correction_mode": "mask",
    "is_correction_gating": "ratio",
    "is_correction_threshold": [0.5, 5.0],
    "policy_loss_type": "ppo",
    "micro_train_batch_size": 1,
}
OPENRLHF_FIELDS = tuple(OPENRLHF_DEFAULTS)
STRING_FIELDS = ("is_correction_level", "is_correction_mode", "is_correction_gating", "policy_loss_type")
LEVELS, MODES, GATINGS, LOSS_TYPES = ("off", "token", "seq"), ("mask", "clip"), ("ratio", "binary_kl", "tv"), (
    "ppo", "gspo")
OPENRLHF_SOURCE = "openrlhf/models/loss.py:PolicyLoss.forward (OpenRLHF 0.11.2)"
THRESHOLD = "is_correction_threshold"


def _threshold(value: Any) -> list[float]:
    """One value (an upper bound: [0, value], as train_ppo_ray.py reads one) or LOW HIGH."""
    hint = f"write {THRESHOLD}=0.5_5.0 (LOW_HIGH) or {THRESHOLD}=0.01 (HIGH only)"
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{THRESHOLD} must be one or two numbers, got {value!r}", hint=hint)
    if isinstance(value, (int, float)):
        parts: list[Any] = [value]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    elif isinstance(value, str):
        parts = [p for p in re.split(r"[_,\s]+", value.strip()) if p]
    else:
        raise ConfigError(f"{THRESHOLD} must be one or two numbers, got {value!r}", hint=hint)
    if not parts or any(isinstance(p, bool) for p in parts):
        raise ConfigError(f"{THRESHOLD} must be one or two numbers, got {value!r}", hint=hint)
    numbers = [parse_number(p, THRESHOLD, hint) for p in parts]
    if len(numbers) == 1:
        numbers.insert(0, 0.0)
    if len(numbers) != 2:  # train_ppo_ray.py's assert
        raise ConfigError(f"{THRESHOLD} takes HIGH or LOW HIGH (train_ppo_ray.py's assert)", hint=hint)
    return numbers


def _micro_batch(value: Any) -> int:
    name = "micro_train_batch_size"
    hint = f"write {name}=4 (train.micro_batch_size)"
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{name} must be a whole number, got {value!r}", hint=hint)
    number = parse_number(value, name, hint)
    if number != int(number):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", hint=hint)
    if number <= 0:  # torch's DataLoader refuses it
        raise ConfigError(f"batch_size should be a positive integer value, but got batch_size={int(number)}",
                          hint=f"write {name}=1 (OpenRLHF's default)")
    return int(number)


def resolve_openrlhf(fields: dict[str, Any]) -> tuple[OpenrlhfSpec | None, dict[str, Any]]:
    """The fields as train_ppo_ray.py and PolicyLoss check them, and what the engine computes (None: nothing logged)."""
    values = {**OPENRLHF_DEFAULTS, **fields}
    for name in STRING_FIELDS:
        if not isinstance(values[name], str):
            raise ConfigError(f"{name} must be a string, got {values[name]!r}",
                              hint=f"write {name}={OPENRLHF_DEFAULTS[name]}")
        values[name] = values[name].strip()
    values[THRESHOLD] = _threshold(values[THRESHOLD])
    values["micro_train_batch_size"] = _micro_batch(values["micro_train_batch_size"])
    level, mode, gating = values["is_correction_level"], values["is_correction_mode"], values["is_correction_gating"]
    low, high = values[THRESHOLD]
    # PolicyLoss.__init__'s checks, in its order and with its messages (argparse's choices refuse the same names).
    for name, value, allowed, words in (("is_correction_level", level, LEVELS, "off/token/seq"),
                                        ("is_correction_mode", mode, MODES, "mask/clip"),
                                        ("is_correction_gating", gating, GATINGS, "ratio/binary_kl/tv")):
        if value not in allowed:
            raise ConfigError(f"{name} must be {words}, got {value}",
                              hint=did_you_mean(value, allowed, f"use {', '.join(allowed)}"))
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise ConfigError("is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio",
                          hint="clip clamps the token ratio only; use is_correction_mode=mask")
    if gating != "ratio" and level != "off" and low > 0:
        raise ConfigError(f"is_correction_gating={gating} takes an upper bound only (a single delta)",
                          hint=f"write {THRESHOLD}=0.01 (one number: the bound is [0, 0.01])")
    if values["policy_loss_type"] not in LOSS_TYPES:  # PolicyLoss.forward
        raise ConfigError(f"Invalid policy loss type: {values['policy_loss_type']}",
                          hint=did_you_mean(values["policy_loss_type"], LOSS_TYPES, "use ppo or gspo"))
    # The correction and its two keys run only with the PPO loss and a level other than off.
    if level == "off" or values["policy_loss_type"] != "ppo":
        return None, values
    return OpenrlhfSpec(level=level, mode=mode, gating=gating, low=float(low), high=float(high),
                        micro_batch_size=values["micro_train_batch_size"]), values


def describe_openrlhf(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the gate, its band and the micro-batch size."""
    level = config.get("is_correction_level")
    if level == "off" or level is None:
        return "none (is_correction_level=off, OpenRLHF's default: vllm_kl and is_filter_ratio are not logged)"
    if config.get("policy_loss_type") != "ppo":
        return f"none (policy_loss_type={config.get('policy_loss_type')}: the correction's keys are not logged)"
    low, high = config.get(THRESHOLD, (None, None))
    return (f"is_correction_level={level}, is_correction_mode={config.get('is_correction_mode')}, "
            f"is_correction_gating={config.get('is_correction_gating')}, {THRESHOLD}=[{low}, {high}], "
            f"micro_train_batch_size={config.get('micro_train_batch_size')}")


def _band_is_empty(values: Mapping[str, Any]) -> bool:
    """A running correction whose [low, high] keeps no ratio: OpenRLHF checks neither order nor sign."""
    band = values.get(THRESHOLD)
    if values.get("is_correction_level") in (None, "off") or values.get("policy_loss_type") != "ppo" or not band:
        return False
    low, high = band
    return float(low) >= float(high) or float(high) <= 0


# OpenRLHF accepts is_correction_threshold LOW > HIGH or a negative HIGH (train_ppo_ray.py parses it without a check):
# mask mode then filters every token, clip mode sets every ratio to HIGH (models/loss.py: PolicyLoss.forward).
_DEGENERATE = (Degenerate((THRESHOLD,), _band_is_empty, "keeps no ratio: mask mode filters every token, clip mode "
                          "sets every weight to the upper bound", "train/is_filter_ratio",
                          f"give {THRESHOLD} as LOW HIGH with 0 <= LOW < HIGH (OpenRLHF's default: 0.5 5.0)"),)


FAMILY = ReplayFamily(
    name="openrlhf",
    accumulator="mismatch_cli.trainers.openrlhf.engine:OpenrlhfAccumulator",
    keys="mismatch_cli.trainers.openrlhf.keys",
    fixes="mismatch_cli.trainers.openrlhf.fixes",
    position=70,
    degenerate=_DEGENERATE,
    needs=tuple(Needs(name, "is_correction_level=token (or seq)", lambda v: v.get("is_correction_level") != "off")
                for name in ("is_correction_mode", "is_correction_gating", "is_correction_threshold")),
    title="OpenRLHF 0.11.2 train/rollout mismatch correction",
    source=OPENRLHF_SOURCE,
    defaults=OPENRLHF_DEFAULTS,
    kinds={**{name: "string" for name in STRING_FIELDS}, THRESHOLD: "threshold", "micro_train_batch_size": "number"},
    resolve=resolve_openrlhf,
    describe=describe_openrlhf,
    lead_keys=("train/vllm_kl", "train/is_filter_ratio"),
    concepts={"kl": "train/vllm_kl", "masked": "train/is_filter_ratio"},
    traits={"estimator": "k1: token mean of rollout - train (signed)",
            "sequence": "geometric mean: exp of the token mean of d (seq level, a filter only)",
            "clamp": "none (no log-ratio clamp; clip mode clamps the token ratio to the band)",
            "reduction": "per micro-batch (micro_train_batch_size rows), then mean over micro-batches weighted by "
                         "their token counts (a global token mean)",
            "threshold": "off by default; band [0.5, 5] (one number: [0, it])"},
)
