"""slime's vocabulary of fixes (commit 624b824a): argparse flags, SGLang's server flags as `--sglang-<flag>`, and the
MIS helper's knobs, which are YAML keys of the file `--custom-config-path` names (not argparse flags).

Lines read from THUDM/slime at 624b824a898ab0ec1fcb4d373004c7f3852bf515. `correction` maps a what-if ladder row
onto settings.py's fields only where slime computes exactly that row's rule (engine.py, docs/slime-semantics.md
§3-4); `native` writes them as the flags, and for the MIS helper the YAML, a slime user passes. Miles (a slime fork)
builds its vocabulary from these helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, threshold_bounds
from mismatch_cli.trainers.slime.settings import MIS_DEFAULTS, MIS_FUNCTION

ARGS = "slime/utils/arguments.py"
LOSS = "slime/backends/megatron_utils/loss.py"
MIS_DIR = "examples/train_infer_mismatch_helper"
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
TRAINER = "slime 624b824a"
# The argparse flag of each hook field (settings.py names them by their dest).
FLAGS = {"use_tis": "--use-tis", "tis_clip": "--tis-clip", "tis_clip_low": "--tis-clip-low",
         "custom_tis_function_path": "--custom-tis-function-path", "get_mismatch_metrics": "--get-mismatch-metrics",
         "use_rollout_logprobs": "--use-rollout-logprobs", "calculate_per_token_loss": "--calculate-per-token-loss"}
# The MIS helper's fields that live in the YAML file (mis.yaml's keys); the others are flags.
YAML_KEYS = ("use_tis", "use_rs", "tis_level", "rs_level", "tis_mode", "tis_lower_bound", "tis_upper_bound",
             "rs_lower_bound", "rs_upper_bound", "rs_veto_threshold", "tis_batch_normalize")


def hook_correction(icepop: str) -> Callable[[Mapping[str, Any]], dict[str, Any] | None]:
    """The policy loss's hook fields for a ladder row, with `icepop` the IcePop function's dotted path."""

    def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
        # Only token rules: the hook has no sequence level, and no rejection or veto (engine.py SlimeAccumulator).
        if row.get("level") != "token" or row.get("family") not in ("tis", "icepop"):
            return None
        lower, upper = threshold_bounds(str(row["threshold"]))
        if row["family"] == "tis":
            # vanilla_tis_function: w = clamp(exp(d), tis_clip_low = 0, tis_clip) = min(exp(d), U) per token, the
            # ladder's cap. Exact but for d < -20, where the ladder's ±20 safety clamp floors the weight at
            # e^-20 and slime does not (a difference below 2.1e-9); `train/tis_clipfrac` counts exp(d) > U as the
            # ladder's truncated share does (float32 compare, U exact in float32).
            return {"use_tis": True, "tis_clip": upper, "tis_clip_low": 0.0}
        # icepop_function: w = exp(d) inside [tis_clip_low, tis_clip] (bounds kept), else 0, the token kept in the
        # loss mask: the ladder's IcePop (zeroed weight, ESS over every valid token) exactly.
        return {"use_tis": True, "custom_tis_function_path": icepop, "tis_clip_low": lower, "tis_clip": upper}

    return correction


def mis_correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The MIS helper's fields that compute a ladder row: its IS rules only (see the comments for RS and the veto)."""
    if row.get("family") not in ("tis", "icepop") or row.get("level") not in ("token", "sequence"):
        # The helper returns before RS when use_tis is off (mis.py:208-209), so RS and the veto always come with
        # IS weights on the kept tokens, where the ladder's RS / veto rows weigh them 1: never the same rule.
        return None
    lower, upper = threshold_bounds(str(row["threshold"]))
    # use_rs false also turns the veto off (it runs only inside use_rs, mis.py:259); batch normalization would
    # divide every weight by the batch mean, which no ladder row does.
    fields: dict[str, Any] = {"use_tis": True, "use_rs": False, "tis_level": row["level"],
                              "tis_batch_normalize": False, "tis_upper_bound": upper}
    if row["family"] == "tis":
        # truncate: exp(clamp(x, ±20)).clamp(0, U) with x = d (token) or the sample's sum of d (sequence):
        # the ladder's min(exp(clamp(., ±20)), U) (engine.py SlimeMisAccumulator._weights; slime-semantics §4); the
        # sample's sum is taken in the compute dtype, the ladder's in float64: rounding only.
        fields["tis_mode"] = "truncate"
    else:
        # mask: the weight exp(clamp(x, ±20)) stays, and a token (token level) or the whole sample (sequence level)
        # outside [L, U] leaves the loss mask. The loss keeps the original denominators (loss.py:1080-1090), so a
        # masked token counts exactly as the ladder's zeroed weight among all valid tokens: the same gradient and
        # the same ESS over all valid tokens, which is how the ladder counts IcePop (zeroed = masked).
        fields.update(tis_mode="mask", tis_lower_bound=lower)
    return fields


def flag_number(value: Any) -> str:
    """A number as an argparse float flag takes it ("2.0")."""
    return repr(float(value))


def yaml_value(value: Any) -> str:
    """A value as PyYAML reads it back: floats always with a dot (PyYAML reads 1e-4 as a string, mis.yaml:34)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        text = repr(float(value))
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return f'"{value}"'


def hook_native(fields: Mapping[str, Any]) -> str:
    """The hook's fields as slime's argparse flags (a false switch is left out: store_true has no --no- form)."""
    parts = []
    for name, value in fields.items():
        if name not in FLAGS or value is None or value is False:
            continue
        parts.append(FLAGS[name] if value is True else f"{FLAGS[name]} {_text(value)}")
    return " ".join(parts) or "(leave out --use-tis, --get-mismatch-metrics and --custom-tis-function-path)"


def mis_native(function: str) -> Callable[[Mapping[str, Any]], str]:
    """The MIS helper's fields as its flags plus the YAML file, with `function` the helper's dotted path."""

    def native(fields: Mapping[str, Any]) -> str:
        values = {**MIS_DEFAULTS, **fields}
        switches = [FLAGS[k] for k in ("use_tis", "get_mismatch_metrics", "use_rollout_logprobs",
                                       "calculate_per_token_loss") if values.get(k) is True]
        # The YAML must hold every key mis.py reads: they are set on args by --custom-config-path, not declared.
        yaml = ", ".join(f"{key}: {yaml_value(values[key])}" for key in YAML_KEYS)
        return " ".join([*switches, "--custom-config-path mis.yaml --custom-tis-function-path", function]) + \
            f"  # mis.yaml: {{{yaml}}}"

    return native


def _text(value: Any) -> str:
    return flag_number(value) if isinstance(value, (int, float)) else str(value)


def mis_yaml_settings(mis_dir: str) -> tuple[Setting, ...]:
    """The MIS helper's mis.yaml keys a user changes (the same file, line for line, in slime and in Miles)."""
    return (
        Setting('tis_level: "sequence"', f"{mis_dir}/mis.yaml:9", "YAML key: token, sequence = the sample's sum "
                "of log-ratios, or geometric = their mean; clamped to ±20 before exp"),
        Setting('tis_mode: "mask"', f"{mis_dir}/mis.yaml:16", "YAML key: truncate caps at tis_upper_bound; mask "
                "drops tokens / samples outside [tis_lower_bound, tis_upper_bound] from the loss mask"),
        Setting("use_rs: false", f"{mis_dir}/mis.yaml:3", "YAML key: the rejection mask, and the veto with it"),
        Setting("tis_batch_normalize: false", f"{mis_dir}/mis.yaml:39", "YAML key: true rescales the weights to "
                "mean 1 over the batch"),
    )


def _settings(mis: bool) -> dict[str, tuple[Setting, ...]]:
    hook = (
        Setting("--use-tis --tis-clip 2.0", f"{ARGS}:1061; {ARGS}:1067",
                "token TIS: the loss times the ratio pi_old / pi_rollout clamped to [--tis-clip-low 0, 2.0]; refused "
                "together with --use-rollout-logprobs"),
        Setting(f"--use-tis --custom-tis-function-path {ICEPOP} --tis-clip-low 0.5 --tis-clip 2.0",
                f"{LOSS}:922; {ARGS}:1079", "IcePop: weight 0 outside [tis-clip-low, tis-clip]; it runs only with "
                "--use-tis or --get-mismatch-metrics"),
    )
    helper = (
        Setting(f"--use-tis --custom-config-path mis.yaml --custom-tis-function-path {MIS_FUNCTION}",
                f"{MIS_DIR}/run-qwen3-4b-mis.sh:125", "the MIS helper, an example plug-in: its knobs are YAML keys "
                "of mis.yaml; the shipped file also rejects outside [0.5, 2.0], vetoes at 1.0e-4 and "
                "batch-normalizes"),
        *mis_yaml_settings(MIS_DIR),
    )
    return {
        "temperature": (Setting("--rollout-temperature T", f"{ARGS}:343",
                                "one flag: SGLang samples at T and the Megatron recompute divides its logits by T; "
                                "T must be > 0"),),
        "truncation": (
            Setting("--rollout-top-p 1.0 --rollout-top-k -1", f"{ARGS}:349; {ARGS}:352",
                    "untruncated training rollouts; there is no min-p flag"),
            Setting("--rollout-top-p P", f"{LOSS}:558; slime/rollout/sglang_rollout.py:107",
                    "replayed: SGLang returns each token's kept set, top-k and min-p inside it, and the trainer "
                    "renormalises over it; needs slime's patched SGLang, ENABLE_SGLANG_PATCH=1; top-k alone is not "
                    "replayed"),
        ),
        "precision": (
            Setting("--sglang-enable-fp32-lm-head", "slime/backends/sglang_utils/arguments.py:96",
                    "SGLang's ServerArgs flag through slime's --sglang- pass-through: the installed SGLang must "
                    "have it; the trainer already scores in fp32"),
            Setting("--sglang-enable-deterministic-inference", "slime/rollout/sglang_rollout.py:109",
                    "with --sglang-attention-backend flashinfer and Megatron's --deterministic-mode"),
            Setting("--sglang-dtype bfloat16", "slime/backends/sglang_utils/arguments.py:96",
                    "SGLang's --dtype through the pass-through: the trainer's compute dtype"),
        ),
        "low_precision": (
            Setting("--hf-checkpoint /path/to/model-fp8-hf", "docs/en/advanced/low-precision.md:41",
                    "fp8 weights: a blockwise-FP8 HF checkpoint; the BF16 weights are re-quantised at every sync"),
            Setting("--sglang-kv-cache-dtype fp8_e4m3", "docs/en/advanced/low-precision.md:49", "fp8 KV cache"),
        ),
        "correction": (*helper, *hook) if mis else (*hook, helper[0]),
        "response_mask": (
            Setting("--mask-offpolicy-in-partial-rollout", f"{ARGS}:468",
                    "with --partial-rollout: drops the part an older policy generated; the loss mask covers response "
                    "tokens only, tool tokens 0"),
            Setting("--rollout-data-postprocess-path my_module.postprocess", f"{ARGS}:549",
                    "the hook that may edit loss masks after the log-probs are computed"),
        ),
        "policy_version": (Setting("--update-weights-interval 1", f"{ARGS}:537",
                                   "train_async.py generates rollout N+1 while training on N and syncs every this "
                                   "many rollouts: the lag's bound"),),
    }


MISSING = {
    "logprobs_mode": "slime 624b824a has no setting (searched logprobs_mode and SGLANG_RETURN_ORIGINAL_LOGPROB): "
                     "SGLang's default reports log-probs after the temperature, which the trainer recomputes; leave "
                     "SGLANG_RETURN_ORIGINAL_LOGPROB unset on the engines",
    "rollout_logprobs": "slime 624b824a has no switch and needs none: every /generate request asks SGLang for the "
                        "sampled tokens' log-probs (sglang_rollout.py:178), shipped as rollout_log_probs "
                        "(ray/rollout.py:716); --use-rollout-logprobs only makes them the PPO old log-probs",
    "penalties": "slime 624b824a has no training-rollout penalty flag (searched repetition / presence / frequency "
                 "penalty: only the eval dataset config, eval_config.py:161): SGLang's defaults apply; a custom "
                 "rollout function that sends one must apply it on the trainer's side too",
}
TRAPS = (
    Trap(("correction",), "a custom TIS function (icepop_function, the MIS helper) runs only with --use-tis or "
                          "--get-mismatch-metrics: the path alone is ignored", f"{LOSS}:1050"),
    Trap(("correction",), "--get-mismatch-metrics is documented as metrics-only, but the loaded function's loss "
                          "and masks replace the loss's (icepop_function always masks)", f"{LOSS}:1078"),
    Trap(("correction",), "--custom-tis-function-path takes a dotted module path (its help shows file:function)",
         "slime/utils/misc.py:45"),
    Trap(("correction",), "--tis-clip-low above --tis-clip is not refused: every TIS weight becomes tis-clip, "
                          "and IcePop zeroes every weight", f"{LOSS}:922"),
    Trap(("truncation", "processed_logprobs"), "top-k is replayed only inside a top-p kept set: with "
                                                "--rollout-top-p 1.0 a --rollout-top-k > 0 is not replayed",
         f"{LOSS}:84"),
    Trap(("truncation",), "top-p replay needs slime's SGLang patch; a stock SGLang returns no kept sets and the "
                          "run fails an assert (ray/rollout.py:720)", "slime/rollout/sglang_rollout.py:107"),
    Trap(("policy_version",), "per-sample weight versions are recorded but never reach the training data or the "
                              "loss", "slime/utils/types.py:408"),
)
MIS_TRAPS = (
    Trap(("correction",), "the MIS README documents --tis-mode, --tis-level, --rs-* flags that argparse does not "
                          "define: they are YAML keys for --custom-config-path", f"{MIS_DIR}/README.md:115"),
    Trap(("correction", "rollout_logprobs"), "the --use-tis / --use-rollout-logprobs check runs before the YAML "
                                             "is applied: use_tis: true with --use-rollout-logprobs is not refused",
         f"{ARGS}:2019"),
    Trap(("correction",), "rs_veto_threshold acts only inside use_rs, though the README calls it independent",
         f"{MIS_DIR}/mis.py:259"),
    Trap(("correction",), "write YAML floats with a dot (1.0e-4): PyYAML reads 1e-4 as a string",
         f"{MIS_DIR}/mis.yaml:34"),
)

SYNTAX = "argparse flags (SGLang's server flags as --sglang-<flag>)"
# The reducer's switch: how the keys are averaged, not what is corrected.
CONTEXT = ("calculate_per_token_loss",)
FIXES_BY_FAMILY = {
    "slime": Fixes(TRAINER, SYNTAX, _settings(False), MISSING, TRAPS, hook_correction(ICEPOP), hook_native,
                   context_fields=CONTEXT),
    "slime-mis": Fixes(TRAINER, f"{SYNTAX}; the MIS helper's knobs are YAML keys of the file --custom-config-path "
                                "names, not flags", _settings(True), MISSING, (*MIS_TRAPS, *TRAPS), mis_correction,
                       mis_native(MIS_FUNCTION), context_fields=CONTEXT),
}
FIXES = FIXES_BY_FAMILY["slime"]

__all__ = ["CONTEXT", "FIXES", "FIXES_BY_FAMILY", "hook_correction", "hook_native", "mis_correction", "mis_native",
           "yaml_value"]
