"""NeMo-RL's mismatch metrics in `ClippedPGLossFn`: its `ClippedPGLossConfig` fields, defaults and checks.

The formulas (the token and sequence weights, truncation, the six keys) live in `engine.py`; the
semantics, with upstream file, function and commit, in docs/nemo-rl-semantics.md. Here is the data: NeMo-RL's
`loss_fn` field names and defaults (commit 7ea279ab), how `ClippedPGLossConfig` (pydantic) and
`ClippedPGLossFn.__init__` / `__call__` refuse them, the `NemoRlSpec` the engine reads, and the family as
semantics `nemo-rl` knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily
from mismatch_cli.correction.parse import field_number
from mismatch_cli.errors import ConfigError, did_you_mean

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
NEMO_RL_SOURCE = (f"nemo_rl/algorithms/loss/loss_functions.py:ClippedPGLossFn.__call__ (NeMo-RL {NEMO_RL_COMMIT[:8]})")


@dataclass(frozen=True)
class NemoRlSpec:
    """NeMo-RL's mismatch metrics as resolved (docs/nemo-rl-semantics.md): KL estimator, weight level, truncation."""

    kl_type: str  # k1 | k2 | k3: the estimator of gen_kl_error and policy_kl_error
    level: str  # token | sequence (sequence_level_importance_ratios: exp of the row's sum)
    truncation: str | None  # tis | icepop | seq-mask-tis | None
    ratio: float | None  # truncated_importance_sampling_ratio (upper bound)
    ratio_min: float | None  # truncated_importance_sampling_ratio_min (tis: None means 0)


# ClippedPGLossConfig's fields that change the mismatch metrics or their checks (loss_functions.py at 7ea279ab;
# examples/configs/grpo_math_1B.yaml sets the same values) and their defaults.
NEMO_RL_DEFAULTS: dict[str, Any] = {
    "reference_policy_kl_type": "k3",
    "use_importance_sampling_correction": False,
    "truncated_importance_sampling_type": None,
    "truncated_importance_sampling_ratio": None,
    "truncated_importance_sampling_ratio_min": None,
    "sequence_level_importance_ratios": False,
    "token_level_loss": True,
}
NEMO_RL_FIELDS = tuple(NEMO_RL_DEFAULTS)
BOOL_FIELDS = ("use_importance_sampling_correction", "sequence_level_importance_ratios", "token_level_loss")
NUMBER_FIELDS = ("truncated_importance_sampling_ratio", "truncated_importance_sampling_ratio_min")
KL_TYPES = ("k1", "k2", "k3")
TIS_TYPES = ("tis", "icepop", "seq-mask-tis")
NONE_WORDS = ("none", "null")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: Input should be a valid boolean, got {value!r}", hint=f"write {name}=true")
    return value


def _string(name: str, value: Any, optional: bool) -> str | None:
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name}: Input should be a valid string, got {value!r}", hint=f'write {name}="..."')
    return value


def _check(condition: bool, message: str, hint: str) -> None:
    """One of ClippedPGLossFn's checks: its message when it fails (an AssertionError or ValueError upstream)."""
    if not condition:
        raise ConfigError(message, hint=hint)


def resolve_nemo_rl(fields: dict[str, Any]) -> tuple[NemoRlSpec, dict[str, Any]]:
    """The fields as ClippedPGLossConfig types them and ClippedPGLossFn checks them, and what the engine computes."""
    values = {**NEMO_RL_DEFAULTS, **fields}
    for name in BOOL_FIELDS:
        values[name] = _bool(name, values[name])
    for name in NUMBER_FIELDS:
        values[name] = field_number(name, values[name], 2.0, optional=True)
    values["reference_policy_kl_type"] = _string("reference_policy_kl_type", values["reference_policy_kl_type"],
                                                 optional=False)
    tis = values["truncated_importance_sampling_type"] = _string(
        "truncated_importance_sampling_type", values["truncated_importance_sampling_type"], optional=True)
    ratio, low = values["truncated_importance_sampling_ratio"], values["truncated_importance_sampling_ratio_min"]
    sequence = values["sequence_level_importance_ratios"]
    # ClippedPGLossFn.__init__, in its order.
    _check(not sequence or not values["token_level_loss"],
           "sequence-level importance sampling (e.g. GSPO) is mutually exclusive with token-level loss",
           "set token_level_loss=false with sequence_level_importance_ratios=true")
    if tis is not None:
        _check(values["use_importance_sampling_correction"],
               "truncated importance sampling is only supported when use_importance_sampling_correction is True",
               "set use_importance_sampling_correction=true")
        _check(tis in TIS_TYPES,
               f"truncated_importance_sampling_type must be 'tis', 'icepop', or 'seq-mask-tis', got {tis}",
               did_you_mean(tis, TIS_TYPES, f"use one of {', '.join(TIS_TYPES)}"))
        _check(ratio is not None and ratio > 0, "truncated_importance_sampling_ratio should be positive",
               "set truncated_importance_sampling_ratio, e.g. 2.0")
        assert ratio is not None
        if low is not None:
            _check(low <= ratio, "truncated_importance_sampling_ratio_min must be <= "
                   "truncated_importance_sampling_ratio", "give a lower bound below the ratio")
        if tis in ("icepop", "seq-mask-tis"):
            _check(low is not None, "truncated_importance_sampling_ratio_min should be set when "
                   "truncated_importance_sampling_type is 'icepop' or 'seq-mask-tis'",
                   "set truncated_importance_sampling_ratio_min, e.g. 0.5")
        if tis == "seq-mask-tis":
            _check(not sequence, "seq-mask-tis uses token-level IS correction with sequence-level masking, "
                   "and is incompatible with sequence_level_importance_ratios=True",
                   "set sequence_level_importance_ratios=false")
    # ClippedPGLossFn.__call__ refuses these when it first runs: the KL type (calculate_kl), then a ratio
    # given without a type.
    kl = values["reference_policy_kl_type"]
    _check(kl in KL_TYPES, f"Invalid KL type: {kl}", did_you_mean(kl, KL_TYPES, f"use one of {', '.join(KL_TYPES)}"))
    _check(ratio is None or tis is not None, f"Invalid truncated importance sampling type: {tis}",
           "set truncated_importance_sampling_type (tis, icepop or seq-mask-tis) with the ratio")
    spec = NemoRlSpec(kl_type=kl, level="sequence" if sequence else "token", truncation=tis,
                      ratio=ratio if tis is not None else None, ratio_min=low if tis is not None else None)
    return spec, values


def describe_nemo_rl(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the weight level, the truncation and its bounds, the KL estimator."""
    parts = [f"reference_policy_kl_type={config.get('reference_policy_kl_type')}"]
    if config.get("sequence_level_importance_ratios"):
        parts.append("sequence_level_importance_ratios=true")
    parts.append(f"use_importance_sampling_correction={str(bool(config.get('use_importance_sampling_correction'))).lower()}")
    tis = config.get("truncated_importance_sampling_type")
    if tis is not None:
        parts.append(f"truncated_importance_sampling_type={tis}")
        for key in ("truncated_importance_sampling_ratio_min", "truncated_importance_sampling_ratio"):
            if config.get(key) is not None:
                parts.append(f"{key}={config[key]}")
    return ", ".join(parts)


FAMILY = ReplayFamily(
    name="nemo-rl",
    accumulator="mismatch_cli.trainers.nemo_rl.engine:NemoRlAccumulator",
    keys="mismatch_cli.trainers.nemo_rl.keys",
    fixes="mismatch_cli.trainers.nemo_rl.fixes",
    position=40,
    needs=tuple(Needs(name, "truncated_importance_sampling_type=tis (or icepop, seq-mask-tis)",
                      lambda v: v.get("truncated_importance_sampling_type") is not None)
                for name in ("truncated_importance_sampling_ratio", "truncated_importance_sampling_ratio_min")),
    title=f"NeMo-RL ClippedPGLossFn mismatch metrics ({NEMO_RL_COMMIT[:8]})",
    source=NEMO_RL_SOURCE,
    defaults=NEMO_RL_DEFAULTS,
    kinds={"reference_policy_kl_type": "string", "use_importance_sampling_correction": "bool",
           "truncated_importance_sampling_type": "string", "truncated_importance_sampling_ratio": "number",
           "truncated_importance_sampling_ratio_min": "number", "sequence_level_importance_ratios": "bool",
           "token_level_loss": "bool"},
    resolve=resolve_nemo_rl,
    describe=describe_nemo_rl,
    lead_keys=("token_mult_prob_error", "gen_kl_error", "sampling_importance_ratio"),
    concepts={"kl": "gen_kl_error", "weight_mean": "sampling_importance_ratio"},
    traits={"estimator": "k3 (reference_policy_kl_type default): exp(d) - 1 - d",
            "sequence": "exp(sum of d), non-finite -> 0; the metric sums the row weights (B·Σw/B)",
            "clamp": "none on the log-ratio; non-finite weights become 0",
            "reduction": "token sums over the global batch's token count (one global batch, one micro-batch)",
            "threshold": "none by default (no truncation)"},
)
