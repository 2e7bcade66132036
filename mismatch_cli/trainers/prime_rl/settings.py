"""prime-rl's RL loss (commit 559b447): its `[trainer.loss]` fields, defaults and checks.

The formulas (the trust-region masks, `mismatch_kl` and the per-sample keys) live in `engine.py`; the
semantics, with the upstream files and functions, in docs/prime-rl-semantics.md. Here is the data: the fields
of prime-rl's `DefaultLossConfig` and `IPOLossConfig` by their own names, how pydantic validates the `loss`
table against their union (the `type` tag picks the class, unknown fields are refused), the `PrimeRlSpec` the
engine reads, and the family as semantics `prime-rl` knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import ReplayFamily
from mismatch_cli.errors import ConfigError, UsageError, did_you_mean
from mismatch_cli.system.numbers import parse_number

COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"


@dataclass(frozen=True)
class PrimeRlSpec:
    """prime-rl's loss as resolved (docs/prime-rl-semantics.md): which trust region, and its thresholds."""

    loss_type: str  # default (DPPO: masked by the sign of the advantage) | ipo (symmetric |Δp| band)
    dppo_mask_low: float
    dppo_mask_high: float
    ipo_threshold: float


# The loss config classes (packages/prime-rl-configs/src/prime_rl/configs/trainer.py at 559b447), their fields and
# defaults; `type` is the union's tag and defaults to the default class's.
TYPE_FIELDS: dict[str, dict[str, Any]] = {
    "default": {"dppo_mask_low": 0.2, "dppo_mask_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3},
    "ipo": {"ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 1e-3},
}
TYPES = ("default", "ipo", "custom")  # the union's tags; `custom` imports a user function and is not replayed
PRIME_RL_DEFAULTS: dict[str, Any] = {"type": "default", "dppo_mask_low": 0.2, "dppo_mask_high": 0.2,
                                     "ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 1e-3}
PRIME_RL_FIELDS = tuple(PRIME_RL_DEFAULTS)
PRIME_RL_SOURCE = (f"prime-rl src/prime_rl/trainer/rl/loss.py:default_loss_fn / ipo_loss_fn and "
                   f"src/prime_rl/trainer/rl/train.py:train (commit {COMMIT[:9]})")


def _number(name: str, value: Any) -> float:
    """A float field with pydantic's `ge=0`, refused with pydantic's words."""
    try:
        number = parse_number(value, name)
    except UsageError as error:
        raise ConfigError(f"loss.{name}: Input should be a valid number, unable to parse string as a number "
                          f"({error})", hint=f"write {name}={PRIME_RL_DEFAULTS[name]}") from None
    if number < 0:
        raise ConfigError(f"loss.{name}: Input should be greater than or equal to 0, got {number}",
                          hint=f"write {name}={PRIME_RL_DEFAULTS[name]} (prime-rl's default)")
    return number


def resolve_prime_rl(fields: dict[str, Any]) -> tuple[PrimeRlSpec, dict[str, Any]]:
    """The fields as prime-rl's `TrainerConfig.loss` validates them, and what the engine computes."""
    loss_type = fields.get("type", "default")
    if isinstance(loss_type, str):
        loss_type = loss_type.strip()
    if loss_type == "custom":
        raise ConfigError("type=custom imports a loss function of your own (import_path): semantics prime-rl "
                          "replays only prime-rl's `default` and `ipo` losses",
                          hint="use type=default or type=ipo")
    if loss_type not in TYPE_FIELDS:
        raise ConfigError(f"loss: Input tag '{loss_type}' found using 'type' does not match any of the expected tags: "
                          "'default', 'ipo', 'custom'", hint=did_you_mean(str(loss_type), TYPES, "use type=default "
                                                                          "or type=ipo"))
    own = TYPE_FIELDS[loss_type]
    foreign = [k for k in fields if k != "type" and k not in own]
    if foreign:  # prime-rl's BaseConfig forbids extra fields
        raise ConfigError(f"loss.{loss_type}.{foreign[0]}: Extra inputs are not permitted",
                          hint=f"type={loss_type} takes {', '.join(own)}; semantics prime-rl takes "
                               f"{', '.join(PRIME_RL_FIELDS)}")
    effective: dict[str, Any] = {"type": loss_type}
    for name, default in own.items():
        effective[name] = _number(name, fields[name]) if name in fields else default
    spec = PrimeRlSpec(loss_type=loss_type,
                       dppo_mask_low=effective.get("dppo_mask_low", TYPE_FIELDS["default"]["dppo_mask_low"]),
                       dppo_mask_high=effective.get("dppo_mask_high", TYPE_FIELDS["default"]["dppo_mask_high"]),
                       ipo_threshold=effective.get("ipo_threshold", TYPE_FIELDS["ipo"]["ipo_threshold"]))
    return spec, effective


def describe_prime_rl(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the loss type and the thresholds of its trust region."""
    if config.get("type") == "ipo":
        return f"type=ipo, ipo_threshold={config.get('ipo_threshold')}"
    return (f"type=default, dppo_mask_low={config.get('dppo_mask_low')}, "
            f"dppo_mask_high={config.get('dppo_mask_high')}")


FAMILY = ReplayFamily(
    name="prime-rl",
    accumulator="mismatch_cli.trainers.prime_rl.engine:PrimeRlAccumulator",
    keys="mismatch_cli.trainers.prime_rl.keys",
    fixes="mismatch_cli.trainers.prime_rl.fixes",
    position=50,
    title=f"prime-rl RL loss (commit {COMMIT[:9]})",
    source=PRIME_RL_SOURCE,
    defaults=PRIME_RL_DEFAULTS,
    kinds={"type": "string", "dppo_mask_low": "number", "dppo_mask_high": "number", "ipo_threshold": "number",
           "adv_tau": "number", "kl_tau": "number"},
    resolve=resolve_prime_rl,
    describe=describe_prime_rl,
    lead_keys=("mismatch_kl/all/mean", "is_masked/mean"),
    concepts={"kl": "mismatch_kl/all/mean", "masked": "is_masked/mean"},
    traits={"estimator": "k3: exp(d) - d - 1 of train over inference",
            "sequence": "none: every quantity is per token; a sample only averages its tokens",
            "clamp": "none on the log-ratio: exp(d) overflows to inf",
            "reduction": "mismatch_kl/all over all tokens; the loss keys a mean and max over samples of "
                         "per-sample token means",
            "threshold": "mask when the probability moves more than 0.2 against the advantage's sign "
                         "(type=ipo: |Δp| > 0.1)"},
)
