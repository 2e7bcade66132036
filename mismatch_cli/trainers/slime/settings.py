"""slime's train/rollout mismatch keys (commit 624b824a): two families, `slime` and `slime-mis`, as data.

`slime` is the policy loss's own importance-sampling hook (`vanilla_tis_function`, or `icepop_function`
through `custom_tis_function_path`); `slime-mis` is the MIS helper of examples/train_infer_mismatch_helper
(`compute_mis_weights_with_cp`). Both log through the same reducer. The formulas live in `engine.py`;
the semantics, with upstream file, function and commit, in docs/slime-semantics.md. Here: slime's argument
names (argparse dest names, and the MIS config file's keys) and defaults, how slime refuses them, the settings
the engine reads, and the two families.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily, cap_not_positive, reversed_band
from mismatch_cli.correction.parse import field_bool, field_number
from mismatch_cli.errors import ConfigError, did_you_mean

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
LOSS_FILE = "slime/backends/megatron_utils/loss.py"
MIS_FILE = "examples/train_infer_mismatch_helper/mis.py"
# The functions `custom_tis_function_path` may name for semantics `slime` (slime's load_function: module.attr).
TIS_FUNCTIONS = {
    None: "vanilla",
    "slime.backends.megatron_utils.loss.vanilla_tis_function": "vanilla",
    "slime.backends.megatron_utils.loss.icepop_function": "icepop",
}
MIS_FUNCTION = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


@dataclass(frozen=True)
class SlimeSpec:
    """slime's policy-loss hook as resolved: which function (None: no hook metrics), its bounds, the reducer."""

    function: str | None  # vanilla | icepop | None (neither use_tis nor get_mismatch_metrics)
    clip: float
    clip_low: float
    per_token: bool


@dataclass(frozen=True)
class SlimeMisSpec:
    """slime's MIS helper as resolved: None for `tis` means only the ppl / KL / chi2 keys (use_tis false)."""

    tis_level: str | None  # token | sequence | geometric, or None when use_tis is false
    tis_mode: str
    tis_lower: float
    tis_upper: float
    rs_level: str | None  # None when use_rs is false
    rs_lower: float
    rs_upper: float
    veto: float | None
    batch_normalize: bool
    per_token: bool


# slime/utils/arguments.py at 624b824a (argparse dest names and defaults).
SLIME_DEFAULTS: dict[str, Any] = {
    "use_tis": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "custom_tis_function_path": None,
    "get_mismatch_metrics": False,
    "use_rollout_logprobs": False,
    "calculate_per_token_loss": False,
}
# The MIS helper's fields: examples/train_infer_mismatch_helper/mis.yaml (read by `custom_config_path`, which sets
# them on args, overriding use_tis) plus the argparse fields the loss reads around it.
MIS_DEFAULTS: dict[str, Any] = {
    "use_tis": True,
    "use_rs": True,
    "tis_level": "token",
    "rs_level": "token",
    "tis_mode": "truncate",
    "tis_lower_bound": 0.5,
    "tis_upper_bound": 2.0,
    "rs_lower_bound": None,
    "rs_upper_bound": None,
    "rs_veto_threshold": 1.0e-4,
    "tis_batch_normalize": True,
    "get_mismatch_metrics": False,
    "use_rollout_logprobs": False,
    "calculate_per_token_loss": False,
}
BOOL_FIELDS = ("use_tis", "use_rs", "tis_batch_normalize", "get_mismatch_metrics", "use_rollout_logprobs",
               "calculate_per_token_loss")
LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "clip", "mask")



def _level(values: dict[str, Any], name: str) -> None:
    if values[name] not in LEVELS:
        raise ConfigError(f"Invalid level: {values[name]}",
                          hint=did_you_mean(str(values[name]), LEVELS, f"{name} is one of {', '.join(LEVELS)}"))


def _checks(values: dict[str, Any]) -> None:
    """slime_validate_args (slime/utils/arguments.py): the two checks on these fields."""
    if values["use_rollout_logprobs"] and values["use_tis"]:
        raise ConfigError("use_rollout_logprobs and use_tis cannot be set at the same time.",
                          hint="set one of use_rollout_logprobs, use_tis to false")


def resolve_slime(fields: dict[str, Any]) -> tuple[SlimeSpec, dict[str, Any]]:
    """The fields as slime's argparse and slime_validate_args take them, and what the engine computes."""
    values = {**SLIME_DEFAULTS, **fields}
    for name in ("use_tis", "get_mismatch_metrics", "use_rollout_logprobs", "calculate_per_token_loss"):
        values[name] = field_bool(name, values[name])
    for name in ("tis_clip", "tis_clip_low"):
        values[name] = field_number(name, values[name], 2.0)
    path = values["custom_tis_function_path"]
    if isinstance(path, str) and path.strip().lower() in ("", "none", "null"):
        path = values["custom_tis_function_path"] = None
    _checks(values)
    if values["get_mismatch_metrics"] and path is None:
        raise ConfigError("custom_tis_function_path must be set when get_mismatch_metrics is set",
                          hint="custom_tis_function_path=slime.backends.megatron_utils.loss.icepop_function, or "
                               "semantics slime-mis for the MIS helper")
    if path not in TIS_FUNCTIONS:
        hint = ("semantics slime-mis replays the MIS helper" if path == MIS_FUNCTION else
                did_you_mean(str(path), [p for p in TIS_FUNCTIONS if p], "semantics slime replays none (the "
                             "default), " + ", ".join(p for p in TIS_FUNCTIONS if p)))
        raise ConfigError(f"custom_tis_function_path {path!r} is not a function semantics slime replays", hint=hint)
    on = values["use_tis"] or values["get_mismatch_metrics"]
    spec = SlimeSpec(function=TIS_FUNCTIONS[path] if on else None, clip=values["tis_clip"],
                     clip_low=values["tis_clip_low"], per_token=values["calculate_per_token_loss"])
    return spec, values


def resolve_slime_mis(fields: dict[str, Any]) -> tuple[SlimeMisSpec | SlimeSpec, dict[str, Any]]:
    """The MIS helper's fields as compute_mis_weights reads and refuses them (a SlimeSpec: helper not called)."""
    values = {**MIS_DEFAULTS, **fields}
    for name in BOOL_FIELDS:
        values[name] = field_bool(name, values[name])
    values["tis_upper_bound"] = field_number("tis_upper_bound", values["tis_upper_bound"], 2.0)
    for name in ("tis_lower_bound", "rs_lower_bound", "rs_upper_bound", "rs_veto_threshold"):
        values[name] = field_number(name, values[name], 2.0, optional=True)
    _checks(values)
    per_token = values["calculate_per_token_loss"]
    if not (values["use_tis"] or values["get_mismatch_metrics"]):
        # The loss does not call the helper: train_rollout_logprob_abs_diff alone, as semantics slime logs it.
        return SlimeSpec(function=None, clip=2.0, clip_low=0.0, per_token=per_token), values
    # compute_mis_weights: the bounds' defaults, then what its branches refuse.
    if values["tis_lower_bound"] is None and values["tis_upper_bound"] == 0:
        raise ConfigError("float division by zero", hint="tis_upper_bound must not be 0 without tis_lower_bound")
    tis_lower = values["tis_lower_bound"] if values["tis_lower_bound"] is not None else 1.0 / values["tis_upper_bound"]
    rs_lower = values["rs_lower_bound"] if values["rs_lower_bound"] is not None else tis_lower
    rs_upper = values["rs_upper_bound"] if values["rs_upper_bound"] is not None else values["tis_upper_bound"]
    use_tis, use_rs = values["use_tis"], values["use_rs"]
    if use_tis:  # in the order compute_mis_weights meets them on its first row
        _level(values, "tis_level")
        if values["tis_mode"] not in MODES:
            raise ConfigError(f"Unsupported tis_mode: {values['tis_mode']}",
                              hint=did_you_mean(str(values["tis_mode"]), MODES, f"use one of {', '.join(MODES)}"))
        if values["tis_mode"] != "truncate" and not tis_lower < values["tis_upper_bound"]:
            raise ConfigError(f"tis_lower_bound ({tis_lower}) must be below tis_upper_bound "
                              f"({values['tis_upper_bound']}): mis.py's clip / mask assert lower_bound < upper_bound",
                              hint="give tis_lower_bound below tis_upper_bound")
        if use_rs:
            _level(values, "rs_level")
            if not rs_lower < rs_upper:
                # An unset RS bound takes the TIS one (mis.py): name the field the user actually set.
                lower = "rs_lower_bound" if values["rs_lower_bound"] is not None else \
                    "rs_lower_bound (unset, so tis_lower_bound's)" if values["tis_lower_bound"] is not None else \
                    "rs_lower_bound (unset, so 1 / tis_upper_bound)"
                upper = "rs_upper_bound" if values["rs_upper_bound"] is not None else \
                    "rs_upper_bound (unset, so tis_upper_bound's)"
                raise ConfigError(f"{lower} = {rs_lower} must be below {upper} = {rs_upper}: mis.py's mask asserts "
                                  "lower_bound < upper_bound",
                                  hint="set rs_lower_bound and rs_upper_bound with lower < upper, or fix the TIS "
                                       "bounds they default to")
        if values["tis_batch_normalize"] and values["tis_level"] not in ("token", "sequence"):
            raise ConfigError(f"Unsupported tis_level: {values['tis_level']}",
                              hint="tis_batch_normalize takes tis_level token or sequence; set tis_batch_normalize="
                                   "false for geometric")
    spec = SlimeMisSpec(
        tis_level=values["tis_level"] if use_tis else None, tis_mode=values["tis_mode"], tis_lower=tis_lower,
        tis_upper=values["tis_upper_bound"], rs_level=values["rs_level"] if use_tis and use_rs else None,
        rs_lower=rs_lower, rs_upper=rs_upper, veto=values["rs_veto_threshold"],
        batch_normalize=use_tis and values["tis_batch_normalize"], per_token=per_token)
    return spec, values


def describe_slime(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: which hook function, its bounds, the reducer."""
    if not (config.get("use_tis") or config.get("get_mismatch_metrics")):
        return "none (use_tis=false): train_rollout_logprob_abs_diff only"
    function = config.get("custom_tis_function_path") or "vanilla_tis_function"
    flags = [f"{k}=true" for k in ("use_tis", "get_mismatch_metrics", "calculate_per_token_loss") if config.get(k)]
    return ", ".join([*flags, f"tis_clip={config.get('tis_clip')}", f"tis_clip_low={config.get('tis_clip_low')}",
                      f"function={function.rsplit('.', 1)[-1]}"])


def describe_slime_mis(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the MIS helper's level, mode and bounds."""
    if not (config.get("use_tis") or config.get("get_mismatch_metrics")):
        return "none (use_tis=false): train_rollout_logprob_abs_diff only"
    if not config.get("use_tis"):
        return "get_mismatch_metrics=true (use_tis=false): ppl / KL / chi2 keys only"
    parts = [f"tis_level={config.get('tis_level')}", f"tis_mode={config.get('tis_mode')}",
             f"tis_upper_bound={config.get('tis_upper_bound')}"]
    if config.get("tis_lower_bound") is not None:
        parts.append(f"tis_lower_bound={config.get('tis_lower_bound')}")
    if config.get("use_rs"):
        parts.append(f"use_rs=true, rs_level={config.get('rs_level')}")
    if config.get("tis_batch_normalize"):
        parts.append("tis_batch_normalize=true")
    return ", ".join(parts)


_COMMON_KINDS = {"use_tis": "bool", "get_mismatch_metrics": "bool", "use_rollout_logprobs": "bool",
                 "calculate_per_token_loss": "bool"}
_REDUCTION = ("per sample: mean over its loss-mask tokens, then sum over samples / samples in the step "
              "(calculate_per_token_loss: over all tokens)")

# tis_clip_low above tis_clip: slime accepts it (no check), torch.clamp then gives every vanilla TIS weight tis_clip
# and IcePop zeroes every weight (loss.py: vanilla_tis_function, icepop_function).
def _tis_on(values: Mapping[str, Any]) -> bool:
    return bool(values.get("use_tis") or values.get("get_mismatch_metrics"))


_DEGENERATE = (
    reversed_band("tis_clip_low", "tis_clip", "sets every TIS weight to tis_clip (vanilla TIS) or every IcePop "
                  "weight to 0", "train/tis_clipfrac", _tis_on),
    cap_not_positive("tis_clip", "caps every weight at a value <= 0: the policy gradient vanishes or flips its sign",
                     "train/tis_clipfrac", _tis_on),
)


FAMILY = ReplayFamily(
    name="slime",
    accumulator="mismatch_cli.trainers.slime.engine:slime_accumulator",
    keys="mismatch_cli.trainers.slime.keys",
    fixes="mismatch_cli.trainers.slime.fixes",
    position=30,
    degenerate=_DEGENERATE,
    needs=tuple(Needs(name, "use_tis=true (or get_mismatch_metrics=true)",
                      lambda v: bool(v.get("use_tis") or v.get("get_mismatch_metrics")))
                for name in ("tis_clip", "tis_clip_low", "custom_tis_function_path")),
    title=f"slime {SLIME_COMMIT[:8]} TIS / IcePop (policy loss)",
    source=f"{LOSS_FILE}:vanilla_tis_function, icepop_function, policy_loss_function (slime {SLIME_COMMIT[:8]})",
    defaults=SLIME_DEFAULTS,
    kinds={**_COMMON_KINDS, "tis_clip": "number", "tis_clip_low": "number", "custom_tis_function_path": "string"},
    resolve=resolve_slime,
    describe=describe_slime,
    lead_keys=("train/tis", "train/train_rollout_logprob_abs_diff"),
    concepts={"abs_diff": "train/train_rollout_logprob_abs_diff", "weight_mean": "train/tis",
              "truncated": "train/tis_clipfrac"},
    traits={"sequence": "none: token-level weights only",
            "clamp": "none on the log-ratio: exp(d) may overflow to inf",
            "reduction": _REDUCTION,
            "threshold": "tis_clip 2, tis_clip_low 0 (icepop: weight 0 outside [low, clip])"},
)

MIS_FAMILY = ReplayFamily(
    name="slime-mis",
    accumulator="mismatch_cli.trainers.slime.engine:slime_accumulator",
    keys="mismatch_cli.trainers.slime.keys",
    fixes="mismatch_cli.trainers.slime.fixes",
    position=31,
    degenerate=(cap_not_positive("rs_veto_threshold", "runs a veto that can never fire: no ratio is below a "
                                 "threshold <= 0",
                                 active=lambda v: bool(v.get("use_rs"))),),
    title=f"slime {SLIME_COMMIT[:8]} MIS helper (examples/train_infer_mismatch_helper)",
    source=f"{MIS_FILE}:compute_mis_weights, add_ppl_metrics (slime {SLIME_COMMIT[:8]})",
    defaults=MIS_DEFAULTS,
    kinds={**_COMMON_KINDS, "use_rs": "bool", "tis_level": "string", "rs_level": "string", "tis_mode": "string",
           "tis_lower_bound": "number", "tis_upper_bound": "number", "rs_lower_bound": "number",
           "rs_upper_bound": "number", "rs_veto_threshold": "number", "tis_batch_normalize": "bool"},
    resolve=resolve_slime_mis,
    describe=describe_slime_mis,
    # train/train_rollout_logprob_abs_diff leads through semantics slime's list (Key metrics lists each key once).
    lead_keys=("train/mis_is_ratio_mean_final", "train/mis_k3_kl"),
    concepts={"abs_diff": "train/train_rollout_logprob_abs_diff", "kl": "train/mis_kl",
              "chi2": "train/mis_chi2_token", "weight_mean": "train/mis_is_ratio_mean_final",
              "truncated": "train/mis_tis_truncate_fraction", "masked": "train/mis_rs_mask_fraction_high",
              "dropped": "train/mis_rs_catastrophic_seq_fraction"},
    traits={"estimator": "k1: rollout - train per token, then its sample mean (mis_kl)",
            "sequence": "exp(clamp(sum of d, ±20)) (geometric: of the mean)",
            "clamp": "±20 on the log-ratio before exp",
            "reduction": _REDUCTION,
            "threshold": "token truncate at 2.0; RS mask [0.5, 2.0]; veto 1e-4; batch-normalized"},
)
