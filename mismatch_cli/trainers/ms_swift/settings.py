"""ms-swift 4.6.0's rollout importance-sampling metrics: its GRPO argument fields, defaults and checks.

The formulas (the thirteen diagnostic keys, the three correction keys, the per-micro-batch reduction) live in
`engine.py`; the semantics, with the upstream file and methods, in docs/ms-swift-semantics.md. Here is the
data: ms-swift's field names and defaults (`GRPOArgumentsMixin`'s three rollout fields, plus
`per_device_train_batch_size`, which sets the micro-batches the keys are averaged over), how ms-swift refuses them,
the `MsSwiftSpec` the engine reads, and the family as semantics `ms-swift` knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily, cap_not_positive
from mismatch_cli.correction.parse import field_bool, field_number, is_unset
from mismatch_cli.errors import ConfigError, did_you_mean
from mismatch_cli.system.numbers import parse_number


@dataclass(frozen=True)
class MsSwiftSpec:
    """ms-swift's rollout correction as resolved (docs/ms-swift-semantics.md): mode, threshold, micro-batch size."""

    mode: str | None  # token_truncate | token_mask | sequence_truncate | sequence_mask | None (metrics only)
    threshold: float
    micro_batch_size: int  # rows per micro-batch, in dump order


# GRPOArgumentsMixin's fields (swift/rlhf_trainers/args_mixin.py at 4.6.0) and their defaults, then
# TrainArgumentsMixin's per_device_train_batch_size (swift/trainers/arguments.py).
MS_SWIFT_DEFAULTS: dict[str, Any] = {
    "rollout_importance_sampling_mode": None,
    "rollout_importance_sampling_threshold": 2.0,
    "log_rollout_offpolicy_metrics": False,
    "per_device_train_batch_size": 1,
}
MS_SWIFT_FIELDS = tuple(MS_SWIFT_DEFAULTS)
MS_SWIFT_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
MS_SWIFT_SOURCE = ("swift/rlhf_trainers/grpo_trainer.py:GRPOTrainer._compute_rollout_offpolicy_metrics and "
                   "_compute_is_correction_metrics (ms-swift 4.6.0)")
MICRO = "per_device_train_batch_size"


def _micro_batch(value: Any) -> int:
    if isinstance(value, bool) or is_unset(value):
        raise ConfigError(f"{MICRO} must be a whole number, got {value!r}", hint=f"write {MICRO}=4")
    number = parse_number(value, MICRO, f"write {MICRO}=4")
    if number != int(number) or number <= 0:
        raise ConfigError(f"{MICRO} must be a whole number above 0, got {value!r}",
                          hint=f"write {MICRO}=1 (ms-swift's default)")
    return int(number)


def resolve_ms_swift(fields: dict[str, Any]) -> tuple[MsSwiftSpec | None, dict[str, Any]]:
    """The fields as ms-swift's argument parser and GRPO trainer take them, and what the engine computes."""
    values = {**MS_SWIFT_DEFAULTS, **fields}
    mode = values["rollout_importance_sampling_mode"]
    if is_unset(mode):
        mode = None
    elif mode not in MS_SWIFT_MODES:  # HfArgumentParser: the Literal's values are argparse choices
        raise ConfigError(f"rollout_importance_sampling_mode: invalid choice: {mode!r} "
                          f"(choose from {', '.join(MS_SWIFT_MODES)})",
                          hint=did_you_mean(str(mode), MS_SWIFT_MODES, "use one of " + ", ".join(MS_SWIFT_MODES)))
    values["rollout_importance_sampling_mode"] = mode
    name = "rollout_importance_sampling_threshold"
    values[name] = field_number(name, values[name], 2.0)
    if mode is not None and values[name] == 0:
        # _compute_is_correction_metrics divides 1.0 by the threshold (the ESS clamp's lower bound).
        raise ConfigError(f"float division by zero ({name}=0: ms-swift's 1.0 / threshold fails on the first step)",
                          hint=f"write {name}=2.0 (ms-swift's default)")
    switch = "log_rollout_offpolicy_metrics"
    values[switch] = field_bool(switch, values[switch])
    values[MICRO] = _micro_batch(values[MICRO])
    # should_compute_rollout_metrics: nothing is logged without a mode or the metrics switch.
    if mode is None and not values["log_rollout_offpolicy_metrics"]:
        return None, values
    return MsSwiftSpec(mode=mode, threshold=values[name], micro_batch_size=values[MICRO]), values


def describe_ms_swift(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the mode and threshold, or the diagnostics only."""
    mode = config.get("rollout_importance_sampling_mode")
    micro = f"{MICRO}={config.get(MICRO)}"
    if mode is not None:
        return (f"rollout_importance_sampling_mode={mode}, rollout_importance_sampling_threshold="
                f"{config.get('rollout_importance_sampling_threshold')}, {micro}")
    if config.get("log_rollout_offpolicy_metrics"):
        return f"none, diagnostics only (log_rollout_offpolicy_metrics=true), {micro}"
    return "none (rollout_importance_sampling_mode unset and log_rollout_offpolicy_metrics=false, ms-swift's defaults)"


P = "rollout_correction/"
FAMILY = ReplayFamily(
    name="ms-swift",
    accumulator="mismatch_cli.trainers.ms_swift.engine:MsSwiftAccumulator",
    keys="mismatch_cli.trainers.ms_swift.keys",
    fixes="mismatch_cli.trainers.ms_swift.fixes",
    position=80,
    degenerate=(cap_not_positive("rollout_importance_sampling_threshold", "caps every weight at a value <= 0 "
                                  "(truncate) or masks every token (mask): the policy gradient vanishes or flips its "
                                  "sign", "rollout_correction/clipped_frac",
                                  lambda v: v.get("rollout_importance_sampling_mode") is not None),),
    needs=(Needs("rollout_importance_sampling_threshold", "rollout_importance_sampling_mode=token_truncate (or "
                 "another mode)", lambda v: v.get("rollout_importance_sampling_mode") is not None),),
    title="ms-swift 4.6.0 rollout importance sampling",
    source=MS_SWIFT_SOURCE,
    defaults=MS_SWIFT_DEFAULTS,
    kinds={"rollout_importance_sampling_mode": "string", "rollout_importance_sampling_threshold": "number",
           "log_rollout_offpolicy_metrics": "bool", MICRO: "number"},
    resolve=resolve_ms_swift,
    describe=describe_ms_swift,
    lead_keys=(P + "kl", P + "chi2_token", P + "is_weight_mean"),
    concepts={"kl": P + "kl", "chi2": P + "chi2_token", "weight_mean": P + "is_weight_mean",
              "truncated": P + "clipped_frac"},
    traits={"estimator": "k1: token mean of rollout - train (signed); k3_kl also logged, clamped to ±10",
            "sequence": "geometric mean: exp(token mean of d) per row (chi2_seq too, though its docstring says "
                        "product)",
            "clamp": "log-ratio clamped to [-20, 20] before exp (kl and the perplexities unclamped)",
            "reduction": "per micro-batch (per_device_train_batch_size rows), then mean over micro-batches "
                         "(_max / _min keys too)",
            "threshold": "off by default; threshold 2 (truncate / mask above it), ESS weights clamped to [0.5, 2]"},
)
