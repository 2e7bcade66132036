"""Miles's train/rollout mismatch keys (commit 31f1ca96): two families, `miles` and `miles-mis`, as data.

Miles (radixark/miles) derives from slime: its policy loss calls the same TIS hooks (`vanilla_tis_function`,
`icepop_function`, now in `loss_hub/corrections.py`) and ships the same MIS helper
(`examples/infra_features/train_infer_mismatch_helper/mis.py`), with the same argparse fields and the same two
refusals. So the fields are slime's and are resolved by `trainers/slime/settings.py`; what Miles adds lives here: its
hook paths, and the loss's own keys `train_rollout_kl` (k3 of rollout vs train, clamped) and `ess_ratio`, plus
`train_rollout_logprob_abs_diff` with non-finite values zeroed. Formulas: `engine.py` on top of
`trainers/slime/engine.py`; semantics with upstream file, function and commit: docs/miles-semantics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import ReplayFamily
from mismatch_cli.correction.parse import field_bool
from mismatch_cli.errors import ConfigError, did_you_mean
from mismatch_cli.trainers.slime.settings import FAMILY as SLIME
from mismatch_cli.trainers.slime.settings import (
    MIS_DEFAULTS,
    SLIME_DEFAULTS,
    SlimeMisSpec,
    SlimeSpec,
    _checks,
    describe_slime,
    describe_slime_mis,
    resolve_slime,
    resolve_slime_mis,
)
from mismatch_cli.trainers.slime.settings import MIS_FAMILY as SLIME_MIS

MILES_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
LOSS_FILE = "miles/backends/training_utils/loss_hub/losses.py"
CORRECTIONS = "miles.backends.training_utils.loss_hub.corrections"
MIS_FILE = "examples/infra_features/train_infer_mismatch_helper/mis.py"
# The functions `custom_tis_function_path` may name for semantics `miles` (Miles's load_function: module.attr),
# and the slime hook each computes the same as.
TIS_FUNCTIONS = {
    None: None,
    f"{CORRECTIONS}.vanilla_tis_function": "slime.backends.megatron_utils.loss.vanilla_tis_function",
    f"{CORRECTIONS}.icepop_function": "slime.backends.megatron_utils.loss.icepop_function",
}
MIS_FUNCTIONS = tuple(f"examples.infra_features.train_infer_mismatch_helper.mis.{name}"
                      for name in ("compute_mis_weights_with_cp", "compute_mis_weights_fsdp"))


@dataclass(frozen=True)
class MilesSpec:
    """The policy loss's hook as slime's family resolves it, and whether the loss's `old` side is the rollout's."""

    hook: SlimeSpec
    rollout_logprobs: bool  # use_rollout_logprobs: Miles compares the rollout log-probs with themselves (0)


@dataclass(frozen=True)
class MilesMisSpec:
    """The MIS helper as slime's family resolves it (the same file at Miles), and use_rollout_logprobs."""

    helper: SlimeMisSpec
    rollout_logprobs: bool


# miles/utils/arguments.py at 31f1ca96: the same argparse dest names and defaults as slime's.
MILES_DEFAULTS: dict[str, Any] = dict(SLIME_DEFAULTS)
MILES_MIS_DEFAULTS: dict[str, Any] = dict(MIS_DEFAULTS)


def resolve_miles(fields: dict[str, Any]) -> tuple[MilesSpec, dict[str, Any]]:
    """The fields as Miles's argparse and parse_args take them (its checks in its order), then slime's hook."""
    values = {**MILES_DEFAULTS, **fields}
    for name in ("use_tis", "get_mismatch_metrics", "use_rollout_logprobs"):
        values[name] = field_bool(name, values[name])
    path = values["custom_tis_function_path"]
    if isinstance(path, str) and path.strip().lower() in ("", "none", "null"):
        path = None
    _checks(values)
    if values["get_mismatch_metrics"] and path is None:
        raise ConfigError("custom_tis_function_path must be set when get_mismatch_metrics is set",
                          hint=f"custom_tis_function_path={CORRECTIONS}.icepop_function, or semantics miles-mis for "
                               "the MIS helper")
    if path not in TIS_FUNCTIONS:
        hint = ("semantics miles-mis replays the MIS helper" if path in MIS_FUNCTIONS else
                did_you_mean(str(path), [p for p in TIS_FUNCTIONS if p], "semantics miles replays none (the "
                             "default: vanilla_tis_function), " + ", ".join(p for p in TIS_FUNCTIONS if p)))
        raise ConfigError(f"custom_tis_function_path {path!r} is not a function semantics miles replays", hint=hint)
    hook, effective = resolve_slime({**fields, "custom_tis_function_path": TIS_FUNCTIONS[path]})
    effective["custom_tis_function_path"] = path
    return MilesSpec(hook=hook, rollout_logprobs=effective["use_rollout_logprobs"]), effective


def resolve_miles_mis(fields: dict[str, Any]) -> tuple[MilesSpec | MilesMisSpec, dict[str, Any]]:
    """The MIS helper's fields (mis.yaml's defaults) as compute_mis_weights reads and refuses them."""
    spec, effective = resolve_slime_mis(fields)
    logprobs = effective["use_rollout_logprobs"]
    if isinstance(spec, SlimeMisSpec):
        return MilesMisSpec(helper=spec, rollout_logprobs=logprobs), effective
    return MilesSpec(hook=spec, rollout_logprobs=logprobs), effective


def describe_miles(config: Mapping[str, Any]) -> str:
    """The first screen's correction line (as slime's, with Miles's loss keys when the hook is off)."""
    if not (config.get("use_tis") or config.get("get_mismatch_metrics")):
        return "none (use_tis=false): train_rollout_logprob_abs_diff, train_rollout_kl only"
    return describe_slime(config)


def describe_miles_mis(config: Mapping[str, Any]) -> str:
    if not (config.get("use_tis") or config.get("get_mismatch_metrics")):
        return "none (use_tis=false): train_rollout_logprob_abs_diff, train_rollout_kl only"
    return describe_slime_mis(config)


KL = "train/train_rollout_kl"
_KL_TRAITS = {"estimator": "k3 of rollout vs train per token, its log-ratio clamped ±20 and the value at 10 "
                           "(train_rollout_kl)"}

FAMILY = ReplayFamily(
    name="miles",
    accumulator="mismatch_cli.trainers.miles.engine:miles_accumulator",
    keys="mismatch_cli.trainers.miles.keys",
    fixes="mismatch_cli.trainers.miles.fixes",
    position=90,
    needs=SLIME.needs,  # slime's flags, refused alike
    degenerate=SLIME.degenerate,
    title=f"Miles {MILES_COMMIT[:8]} TIS / IcePop (policy loss)",
    source=f"{LOSS_FILE}:policy_loss_function; loss_hub/corrections.py:vanilla_tis_function, icepop_function "
           f"(Miles {MILES_COMMIT[:8]})",
    defaults=MILES_DEFAULTS,
    kinds=dict(SLIME.kinds),
    resolve=resolve_miles,
    describe=describe_miles,
    lead_keys=(KL,),  # train/tis and the abs diff lead through semantics slime's list (each key listed once)
    concepts={**SLIME.concepts, "kl": KL},
    traits={**SLIME.traits, **_KL_TRAITS,
            "clamp": "none on the TIS ratio (exp(d) may overflow); k3 KL: log-ratio ±20, value ≤ 10"},
)

MIS_FAMILY = ReplayFamily(
    name="miles-mis",
    accumulator="mismatch_cli.trainers.miles.engine:miles_accumulator",
    keys="mismatch_cli.trainers.miles.keys",
    fixes="mismatch_cli.trainers.miles.fixes",
    position=91,
    degenerate=SLIME_MIS.degenerate,
    title=f"Miles {MILES_COMMIT[:8]} MIS helper (examples/infra_features/train_infer_mismatch_helper)",
    source=f"{MIS_FILE}:compute_mis_weights, add_ppl_metrics; {LOSS_FILE}:policy_loss_function "
           f"(Miles {MILES_COMMIT[:8]})",
    defaults=MILES_MIS_DEFAULTS,
    kinds=dict(SLIME_MIS.kinds),
    resolve=resolve_miles_mis,
    describe=describe_miles_mis,
    lead_keys=(),  # the helper's keys lead through semantics slime-mis's list, the KL through miles's
    concepts={**SLIME_MIS.concepts, "kl": KL},
    traits={**SLIME_MIS.traits, **_KL_TRAITS,
            "clamp": "±20 on the log-ratio before exp; k3 KL: log-ratio ±20, value ≤ 10"},
)
