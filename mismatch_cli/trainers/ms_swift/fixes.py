"""ms-swift 4.6.0's vocabulary of fixes: flags of `swift rlhf --rlhf_type grpo`, and `swift rollout` for a server.

Lines read from the PyPI wheel ms_swift-4.6.0 (`swift/rlhf_trainers/args_mixin.py`, `…/rollout_mixin.py`,
`…/grpo_trainer.py`, `swift/arguments/`). The correction mapping is checked against our replay of ms-swift's
weights (engine.py `_row_stats`; docs/ms-swift-semantics.md) in tests/trainers/test_fixes_ms_swift.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, flag_value, threshold_bounds

ARGS = "swift/rlhf_trainers/args_mixin.py"
ROLLOUT = "swift/rlhf_trainers/rollout_mixin.py"
TRAINER = "swift/rlhf_trainers/grpo_trainer.py"
RLHF = "swift/arguments/rlhf_args.py"
MICRO = "per_device_train_batch_size"

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting("--temperature T", f"{RLHF}:258",
                f"one field: vLLM samples at T and the recompute divides its logits by T, {TRAINER}:1581; the "
                "default is 0.9, not 1.0"),
        Setting("megatron rlhf --rlhf_type grpo --temperature T", "swift/megatron/arguments/megatron_args.py:71",
                "Megatron GRPO: the same field, the same 0.9 default"),
    ),
    "truncation": (
        Setting("--top_p 1.0 --top_k -1 --min_p 0.0", f"{ARGS}:163; {ARGS}:162; {ARGS}:164",
                "the defaults; the recompute replays none of them, only the temperature, so training rollouts "
                "must not truncate"),),
    "rollout_logprobs": (
        Setting("--use_vllm true --vllm_mode colocate", f"{ARGS}:169",
                f"with vLLM the rollout asks for the sampled tokens' log-probs, {ROLLOUT}:367; vllm_mode "
                "colocate or server is required"),),
    "penalties": (
        Setting("--repetition_penalty 1.0", f"{ARGS}:165",
                "the default; the recompute does not replay it; GRPO sends no presence / frequency penalty"),),
    "precision": (
        Setting("--vllm_disable_cascade_attn true", f"{ARGS}:51",
                f"colocate, {ROLLOUT}:521, and `swift rollout --vllm_disable_cascade_attn true` for a server"),
        Setting("--torch_dtype bfloat16", "swift/arguments/base_args/model_args.py:74",
                "colocate vLLM takes the trained model's dtype; give `swift rollout` the same one"),
    ),
    "low_precision": (
        Setting("--vllm_engine_kwargs '{\"quantization\": \"fp8\"}'", f"{ARGS}:54",
                "colocate fp8 weights, a vLLM engine argument: --vllm_quantization is ignored in colocate"),
        Setting("swift rollout --model <model> --vllm_quantization fp8", f"{ARGS}:49", "server fp8 weights"),
        Setting("--vllm_engine_kwargs '{\"kv_cache_dtype\": \"fp8\"}'", f"{ARGS}:54",
                "fp8 KV cache, a vLLM engine argument, colocate or `swift rollout`"),
    ),
    "correction": (
        Setting("--rollout_importance_sampling_mode token_truncate --rollout_importance_sampling_threshold 2.0",
                f"{ARGS}:478; {ARGS}:480",
                "token-level TIS, cap 2; off by default; needs vLLM >= 0.10.2"),
        Setting("--log_rollout_offpolicy_metrics true", f"{ARGS}:481",
                "logs the rollout_correction/* diagnostics without weighting the loss"),
    ),
    "response_mask": (
        Setting("--loss_scale last_round", f"{RLHF}:243",
                "GRPO's default without a multi-turn scheduler, 'default' with one; --loss_scale all puts the "
                "prompt, user and tool tokens into the loss mask, swift/loss_scale/base.py:30"),),
    "policy_version": (
        Setting("--async_generate true", f"{ARGS}:184",
                "generates with the previous step's weights, server mode and single-turn only; no per-sample "
                "policy version or staleness is recorded"),),
}
MISSING = {
    "logprobs_mode": f"ms-swift 4.6.0 has no logprobs_mode field: it sets processed_logprobs itself when vLLM >= "
                     f"0.10.2 ({ROLLOUT}:500; `swift rollout`: swift/pipelines/infer/rollout.py:851) and overrides "
                     "one given in --vllm_engine_kwargs; with an older vLLM, upgrade it",
}

TRAPS = (
    Trap(("temperature_mismatch", "temperature"),
         "the default temperature is 0.9, not 1.0 (HF and Megatron GRPO): a dump scored at 1.0 mismatches it",
         f"{RLHF}:258; swift/megatron/arguments/megatron_args.py:71"),
    Trap(("processed_logprobs", "truncation", "penalties", "ratio_mean"),
         "top_p < 1, top_k > 0, min_p > 0 and repetition_penalty != 1 reach vLLM's processed log-probs but are "
         "not replayed in the recompute", f"{ROLLOUT}:361-364; {TRAINER}:1581"),
    Trap(("logprobs_mode", "processed_logprobs"),
         "with vLLM < 0.10.2 logprobs_mode stays unset and rollout IS is disabled; setting the mode raises, but "
         "--log_rollout_offpolicy_metrics alone silently does nothing", f"{ROLLOUT}:383; {ROLLOUT}:406-408"),
    Trap(("identical_sides", "rollout_logprobs", "correction"),
         "IS is off by default (mode None): without --rollout_importance_sampling_mode or "
         "--log_rollout_offpolicy_metrics the mismatch is not even measured", f"{ARGS}:478-481"),
    Trap(("rollout_logprobs", "constant_fill", "correction"),
         "rollout IS and its metrics turn off for the whole batch, silently, when any rank's rollout log-probs "
         "are missing or their count differs from the completion mask's", "swift/rlhf_trainers/utils.py:2113"),
    Trap(("low_precision",), "--vllm_quantization is ignored in colocate mode (only `swift rollout` forwards it)",
         f"{ROLLOUT}:496-498; {ARGS}:85"),
    Trap(("correction",), "sequence modes use the geometric mean of the token ratios (TRL uses the product), and "
                          "sequence_mask keeps the raw, unclipped token ratios of the rows it keeps",
         f"{TRAINER}:2339-2341; {TRAINER}:2389"),
    Trap(("correction",), "token_mask has an upper bound only: no IcePop band [L, U]", f"{TRAINER}:2374"),
    Trap(("correction",), "the IS weights multiply the per-token loss after the KL term is added: the KL penalty "
                          "is reweighted too", f"{TRAINER}:1063-1067"),
    Trap(("response_mask",), "--loss_scale all puts prompt / user / tool tokens into the loss mask, and the "
                             "rollout log-prob count then no longer matches, which turns IS off silently",
         "swift/loss_scale/base.py:30; swift/rlhf_trainers/utils.py:2113"),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """ms-swift fields that compute a what-if ladder row exactly (token TIS only), or None."""
    # token_truncate (engine.py _row_stats; grpo_trainer.py _apply_rollout_importance_sampling) is
    # min(exp(clamp(d, -20, 20)), threshold) per token: the ladder's token TIS, clamp included, so the same
    # weights and the same truncated tokens (ratio > U, which its clipped_frac counts). The others are not ladder
    # rules: token_mask zeroes only above the threshold (no lower bound, so no IcePop band); sequence_truncate and
    # sequence_mask judge the GEOMETRIC mean of the token ratios (the ladder's sequence TIS / IcePop use the
    # product), and sequence_mask keeps the raw token ratios of the rows it keeps, not geo-RS's mask alone.
    if row.get("family") != "tis" or row.get("level") != "token" or row.get("threshold") is None:
        return None
    lower, upper = threshold_bounds(str(row["threshold"]))
    if lower is not None:
        return None
    return {"rollout_importance_sampling_mode": "token_truncate", "rollout_importance_sampling_threshold": upper}


def native(fields: Mapping[str, Any]) -> str:
    """ms-swift fields as the `swift rlhf` flags a user passes (an unset mode is left out)."""
    return " ".join(f"--{name} {flag_value(value)}" for name, value in fields.items() if value is not None)


FIXES = Fixes(
    "ms-swift 4.6.0",
    "command-line flags of `swift rlhf --rlhf_type grpo` (--field value; bools take true/false, dict fields a "
    "JSON string); a vLLM server's on `swift rollout`; Megatron GRPO (`megatron rlhf`) uses the same names",
    SETTINGS, MISSING, TRAPS, correction=correction, native=native, context_fields=(MICRO,))

__all__ = ["FIXES", "correction", "native"]
