"""TRL 1.16.0's vocabulary of fixes: `GRPOConfig` fields as command-line flags, and `trl vllm-serve` for the server.

Lines read from the PyPI wheel trl-1.16.0 (`trl/trainer/grpo_config.py`, `trl/trainer/grpo_trainer.py`,
`trl/generation/`, `trl/scripts/vllm_serve.py`). The correction mapping is checked against our replay of TRL's
weights (engine.py: `trl_log_ratio`, `trl_weights`; docs/trl-semantics.md §3) in tests/trainers/test_fixes_trl.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, flag_value, threshold_bounds

CONFIG = "trl/trainer/grpo_config.py"
TRAINER = "trl/trainer/grpo_trainer.py"
SERVE = "trl/scripts/vllm_serve.py"
SERVER = "trl vllm-serve --model <model>"

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting("--temperature T", f"{CONFIG}:532",
                "one field: vLLM samples at T and the recompute divides its logits by T, "
                f"{TRAINER}:1070; a temperature inside --generation_kwargs changes the sampling side only"),),
    "truncation": (
        Setting("--top_p 1.0 --top_k 0 --min_p 0.0", f"{CONFIG}:536; {CONFIG}:543; {CONFIG}:550",
                "the defaults: top_k 0 is off, an unset min_p is sent as 0.0; the recompute replays none of them, "
                "so training rollouts must not truncate"),),
    "logprobs_mode": (
        Setting(SERVER, f"{SERVE}:271",
                "server mode: trl vllm-serve starts vLLM with --logprobs-mode processed_logprobs; colocate mode is "
                "fixed at processed_logprobs, trl/generation/vllm_generation.py:361"),
        Setting("vllm serve <model> --logprobs-mode processed_logprobs", f"{SERVE}:271",
                "a plain vLLM server, now that trl vllm-serve is deprecated, must be given it: TRL only warns "
                "when the server runs another mode"),
    ),
    "rollout_logprobs": (
        Setting("--use_vllm true", f"{CONFIG}:587",
                f"with vLLM, TRL always asks for the sampled token's log-prob, {TRAINER}:1137; HF generate "
                "returns none, and the correction is then off"),),
    "penalties": (
        Setting("--repetition_penalty 1.0", f"{CONFIG}:573", "the default; the recompute does not replay it"),
        Setting("--generation_kwargs '{\"presence_penalty\": 0.0, \"frequency_penalty\": 0.0}'", f"{CONFIG}:557",
                "no named fields for these; generation_kwargs is merged last and overrides the named sampling "
                "fields"),
    ),
    "precision": (
        Setting(f"{SERVER} --disable-cascade-attn", f"trl/cli/commands/vllm_serve.py:34; {SERVE}:276",
                "server mode: a vLLM flag that trl vllm-serve forwards to vllm serve; colocate cannot set it"),
        Setting(f"{SERVER} --dtype bfloat16", f"{SERVE}:120",
                "server mode: the engine in the trainer's compute dtype, default auto; colocate builds vLLM "
                "without a dtype, so auto"),
        Setting("--cast_lm_head_to_fp32 true", f"{CONFIG}:460",
                "trainer side only: the policy's and reference's lm_head in fp32, vLLM keeps its own; refused when "
                "the lm_head carries a PEFT adapter"),
    ),
    "low_precision": (
        Setting(f"{SERVER} --quantization fp8", f"{SERVE}:276",
                "server mode: fp8 weights, a vLLM flag forwarded to vllm serve; colocate only picks bitsandbytes "
                "for a 4-bit policy"),
        Setting(f"{SERVER} --kv_cache_dtype fp8", f"{SERVE}:150", "server mode: fp8 KV cache"),
    ),
    "correction": (
        Setting("--vllm_importance_sampling_mode token_truncate --vllm_importance_sampling_clip_max 2.0",
                f"{CONFIG}:934; {CONFIG}:947",
                "token-level TIS, cap 2, with clip_min left unset; needs --use_vllm true and "
                "--vllm_importance_sampling_correction true, the default"),
        Setting("--vllm_importance_sampling_mode token_mask --vllm_importance_sampling_clip_min 0.5 "
                "--vllm_importance_sampling_clip_max 2.0", f"{CONFIG}:934; {CONFIG}:955",
                "IcePop-style: a token ratio outside [0.5, 2] gets weight 0"),
        Setting("--vllm_importance_sampling_correction true", f"{CONFIG}:925",
                "on by default, in mode sequence_mask with clip_max 3.0, on the product of the token ratios"),
    ),
    "response_mask": (
        Setting("rollout_func returning \"env_mask\"", f"{TRAINER}:2272",
                f"the loss mask is completion_mask times tool_mask, {TRAINER}:2497, prompt tokens never in it; a "
                "custom rollout_func without env_mask trains on and weighs every returned completion token"),
        Setting("--mask_truncated_completions true", f"{CONFIG}:836",
                "also leaves truncated completions out of the loss"),
    ),
    "policy_version": (
        Setting("--max_staleness 4", "trl/experimental/async_grpo/async_grpo_config.py:360",
                "experimental AsyncGRPOTrainer only: it tags each sample with model_version, "
                "trl/experimental/async_grpo/async_rollout_worker.py:221, and drops staler ones; it has no "
                "vllm_importance_sampling_* correction. GRPOTrainer records no policy version"),),
}

TRAPS = (
    Trap(("temperature_mismatch", "temperature"),
         "--generation_kwargs is merged over the named sampling fields: a temperature in it changes what vLLM "
         "samples at while the recompute still divides by --temperature", "trl/generation/vllm_generation.py:672"),
    Trap(("processed_logprobs", "truncation", "penalties", "ratio_mean"),
         "top_p < 1, top_k > 0, min_p > 0 and repetition_penalty != 1 reach vLLM's processed log-probs but are "
         "not replayed in the recompute", f"{TRAINER}:1131-1135"),
    Trap(("processed_logprobs", "logprobs_mode", "ratio_mean"),
         "a plain `vllm serve` without --logprobs-mode processed_logprobs only gets a warning, and none at all "
         "with the correction off: the ratio then compares log-probs at T with the engine's raw ones",
         f"{TRAINER}:1142-1153"),
    Trap(("logprobs_mode",), "`trl vllm-serve` is deprecated (removal in v2.0.0) and now runs `vllm serve` with "
                             "--logprobs-mode processed_logprobs added: moving to plain vllm serve drops it",
         f"{SERVE}:286"),
    Trap(("correction", "ratio_mean"),
         "the correction is on by default as soon as use_vllm is: sequence_mask with clip_max 3.0 on the PRODUCT "
         "of the token ratios, so long completions with a small per-token drift lose their whole weight",
         f"{CONFIG}:935; {CONFIG}:948; {TRAINER}:2669"),
    Trap(("correction",), "the deprecated vllm_importance_sampling_cap, when set, silently overwrites "
                          "vllm_importance_sampling_clip_max", f"{CONFIG}:1143"),
    Trap(("correction", "identical_sides"),
         "--vllm_importance_sampling_correction false also drops the sampling/* mismatch metrics: the drift "
         "becomes invisible", f"{TRAINER}:2860"),
    Trap(("constant_fill", "rollout_logprobs"),
         "a token whose vLLM log-prob is NaN gets log-ratio 0 (weight exactly 1) and is left out of the logged "
         "difference", f"{TRAINER}:2665"),
    Trap(("response_mask",), "a custom rollout_func without `env_mask` trains on environment / tool tokens and "
                             "puts them in the importance ratio", f"{TRAINER}:2272"),
    Trap(("precision_gap", "precision"),
         "--cast_lm_head_to_fp32 changes only the trainer's lm_head, not vLLM's: it can widen the gap rather "
         "than close it", f"{CONFIG}:460"),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """GRPOConfig fields that compute a what-if ladder row exactly (TIS and IcePop, token and sequence), or None."""
    # TRL's weights (engine.py trl_weights; docs/trl-semantics.md §3): token modes exp(d) per token, sequence modes
    # exp(sum d) per row (a product, no clamp), then *_truncate clamps to [clip_min, clip_max] and *_mask zeroes a
    # ratio strictly outside it, as the ladder's TIS (min(r, U)) and IcePop (zero outside [L, U], bounds kept) do.
    # The ladder clamps d (token) or S (row) to [-20, 20] before exp; TRL does not. With U <= 10 and bands inside
    # [0.5, 5] the clamp above never shows (min(r, U) is U either way, and the band decisions are the same), and
    # below -20 the two weights are both under exp(-20) = 2.1e-9: the same truncated / zeroed tokens and rows, and
    # weights that differ by less than 2.1e-9. A NaN rollout log-prob is weight 1 in TRL and invalid in a dump.
    # RS, the veto and the geometric mean are not TRL rules: sequence_mask over the RS row's band zeroes the same
    # rows as seq-sum-k1 RS 0.5_2.0 but weighs the kept ones by exp(S) and keeps the zeroed tokens in the loss, so
    # it is IcePop sequence 0.5_2.0, not that RS row. "none" (correction off) resolves to no settings at all.
    family, level, threshold = row.get("family"), row.get("level"), row.get("threshold")
    if family not in ("tis", "icepop") or level not in ("token", "sequence") or threshold is None:
        return None
    lower, upper = threshold_bounds(str(threshold))
    if (family == "tis") != (lower is None):
        return None
    fields: dict[str, Any] = {"vllm_importance_sampling_correction": True,
                              "vllm_importance_sampling_mode": f"{level}_{'truncate' if family == 'tis' else 'mask'}"}
    if lower is not None:
        fields["vllm_importance_sampling_clip_min"] = lower
    fields["vllm_importance_sampling_clip_max"] = upper
    return fields


def native(fields: Mapping[str, Any]) -> str:
    """GRPOConfig fields as the flags a TRL user passes (a None field is left out: unset is None)."""
    return " ".join(f"--{name} {flag_value(value)}" for name, value in fields.items() if value is not None)


FIXES = Fixes(
    "TRL 1.16.0",
    "GRPOConfig fields as command-line flags (--field value, HfArgumentParser; bools take true/false, dict fields "
    "a JSON string); server-side vLLM options on `trl vllm-serve`",
    SETTINGS, {}, TRAPS, correction=correction, native=native)

__all__ = ["FIXES", "correction", "native"]
