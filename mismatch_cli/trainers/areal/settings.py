"""AReaL 1.0.4's decoupled-PPO rejection sampling: its `PPOActorConfig` / `RejectionSamplingConfig` fields and checks.

The formulas (the behaviour importance weight pi_prox / pi_behave, the ratio / k1 / k2 / k3 metric, token or
sequence filtering by mask or clamp, and the `ppo_actor/update/*` keys) live in `engine.py`; the semantics,
with the upstream files and functions, in docs/areal-semantics.md. Here is the data: AReaL's field names and
defaults (the actor's `use_decoupled_loss` and `rejection_sampling`, then the six fields of
`RejectionSamplingConfig`), how AReaL refuses them (`RejectionSamplingConfig.__post_init__`'s messages), the
`ArealSpec` the engine reads, and the family as semantics `areal` knows it.

The dump's old log-probs are AReaL's proximal ones (`prox_logp`, recomputed by the trainer), its rollout log-probs
AReaL's behaviour ones (`logprobs`, from the inference engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily
from mismatch_cli.correction.parse import field_bool, field_number
from mismatch_cli.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class ArealSpec:
    """AReaL's rejection sampling as resolved (docs/areal-semantics.md)."""

    decoupled: bool  # use_decoupled_loss: the proximal side is the trainer's; else the behaviour side itself
    level: str  # token | sequence
    action: str  # mask | clamp
    metric: str  # ratio | kl_k1 | kl_k2 | kl_k3
    agg: str  # sum | mean | max (sequence level only)
    upper: float
    lower: float | None


# PPOActorConfig's two fields (areal/api/cli_args.py at 1.0.4), then RejectionSamplingConfig's six.
AREAL_DEFAULTS: dict[str, Any] = {
    "use_decoupled_loss": False,
    "rejection_sampling": None,  # None: off; setting any field below creates it, as AReaL's config loader does
    "level": "token",
    "action": "mask",
    "metric": "ratio",
    "agg": "mean",
    "upper": 5.0,
    "lower": None,
}
AREAL_FIELDS = tuple(AREAL_DEFAULTS)
RS_FIELDS = ("level", "action", "metric", "agg", "upper", "lower")
STRING_FIELDS = ("level", "action", "metric", "agg")
CHOICES = {"level": ("token", "sequence"), "action": ("mask", "clamp"), "metric": ("ratio", "kl_k1", "kl_k2", "kl_k3"),
           "agg": ("sum", "mean", "max")}
AREAL_SOURCE = ("areal/utils/functional/functional.py:apply_rejection_sampling and "
                "areal/trainer/ppo/actor.py:grpo_loss_fn (AReaL 1.0.4)")


def resolve_areal(fields: dict[str, Any]) -> tuple[ArealSpec | None, dict[str, Any]]:
    """The fields as AReaL's config classes check them, and what the engine computes (None: nothing logged)."""
    values = {**AREAL_DEFAULTS, **fields}
    decoupled = bool(field_bool("use_decoupled_loss", values["use_decoupled_loss"], optional=True))
    values["use_decoupled_loss"] = decoupled
    switch = field_bool("rejection_sampling", values["rejection_sampling"], optional=True)
    given = [k for k in RS_FIELDS if k in fields]
    if switch is False and given:
        raise ConfigError(f"rejection_sampling=false but {', '.join(given)} set",
                          hint="drop rejection_sampling=false (setting a field creates the rejection_sampling "
                               "section, as in AReaL's YAML)")
    enabled = bool(switch) or bool(given)
    values["rejection_sampling"] = enabled
    for name in STRING_FIELDS:
        value = values[name]
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r}", hint=f"write {name}={CHOICES[name][0]}")
        if value not in CHOICES[name]:  # RejectionSamplingConfig.__post_init__'s words
            raise ConfigError(f"{name} must be one of {CHOICES[name]}, got '{value}'",
                              hint=did_you_mean(value, CHOICES[name], f"use {' or '.join(CHOICES[name])}"))
    upper = field_number("upper", values["upper"], 5.0)
    lower = field_number("lower", values["lower"], 5.0, optional=True)
    metric, action = values["metric"], values["action"]
    if lower is not None and lower > upper:
        raise ConfigError(f"lower ({lower}) cannot be greater than upper ({upper})", hint="swap them")
    if metric == "ratio":
        if upper <= 1.0:
            raise ConfigError(f"upper must be > 1.0 for 'ratio' metric (otherwise all non-identical policy tokens "
                              f"will be filtered), got {upper}", hint="write upper=5.0 (AReaL's default)")
        if lower is not None and lower <= 0:
            raise ConfigError(f"lower must be positive for 'ratio' metric, got {lower}", hint="write lower=0.5")
    if metric in ("kl_k2", "kl_k3") and upper <= 0:
        raise ConfigError(f"upper must be positive for '{metric}' metric, got {upper}", hint="write upper=0.5")
    if action == "clamp" and metric != "ratio":
        raise ConfigError(f"action='clamp' only supports metric='ratio' (direct importance weight truncation). "
                          f"Got metric='{metric}'. Use action='mask' for KL-based filtering.",
                          hint="write action=mask, or metric=ratio")
    if action == "clamp" and lower is None:
        lower = 0.0  # RejectionSamplingConfig.__post_init__
    values["upper"], values["lower"] = upper, lower
    if not enabled:
        return None, values  # rejection_sampling None: no behave_* key is logged
    return ArealSpec(decoupled=decoupled, level=values["level"], action=action, metric=metric, agg=values["agg"],
                     upper=upper, lower=lower), values


def describe_areal(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: AReaL's rejection sampling as it runs."""
    if not config.get("rejection_sampling"):
        return "none (rejection_sampling unset, as AReaL's default: no behave_* key is logged)"
    parts = [f"level={config.get('level')}", f"action={config.get('action')}", f"metric={config.get('metric')}"]
    if config.get("level") == "sequence":
        parts.append(f"agg={config.get('agg')}")
    parts.append(f"upper={config.get('upper')}")
    if config.get("lower") is not None:
        parts.append(f"lower={config.get('lower')}")
    if not config.get("use_decoupled_loss"):
        parts.append("use_decoupled_loss=false (AReaL compares the rollout log-probs with themselves)")
    return ", ".join(parts)


P = "ppo_actor/update/"
FAMILY = ReplayFamily(
    name="areal",
    accumulator="mismatch_cli.trainers.areal.engine:ArealAccumulator",
    keys="mismatch_cli.trainers.areal.keys",
    fixes="mismatch_cli.trainers.areal.fixes",
    position=60,
    needs=tuple(Needs(name, "use_decoupled_loss=true", lambda v: bool(v.get("use_decoupled_loss")))
                for name in ("level", "action", "metric", "agg", "upper", "lower")),
    title="AReaL 1.0.4 decoupled-PPO rejection sampling",
    source=AREAL_SOURCE,
    defaults=AREAL_DEFAULTS,
    kinds={"use_decoupled_loss": "bool", "rejection_sampling": "bool",
           **{name: "string" for name in STRING_FIELDS}, "upper": "number", "lower": "number"},
    resolve=resolve_areal,
    describe=describe_areal,
    lead_keys=(P + "behave_imp_weight/avg", P + "rs_filtered_fraction", P + "behave_approx_kl/avg"),
    concepts={"kl": P + "behave_approx_kl/avg", "weight_mean": P + "behave_imp_weight/avg",
              "masked": P + "rs_filtered_fraction"},
    traits={"estimator": "behave_approx_kl is the k1 log-ratio old − rollout (verl's k1 has the opposite sign)",
            "sequence": "sequence level with metric ratio: the geometric mean exp(mean d), for the filter and the "
                        "weight",
            "clamp": "none (a non-finite log-ratio counts as 0 for the weight)",
            "reduction": "token mean over the tokens kept (weight > 0) across the whole step",
            "threshold": "off by default; when set: token level, mask, ratio ≤ 5.0"},
)
