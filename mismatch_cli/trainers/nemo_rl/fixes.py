"""NeMo-RL's vocabulary of fixes at commit 7ea279ab: Hydra-style overrides of its YAML (`examples/run_grpo.py`).

Lines read from github.com/NVIDIA-NeMo/RL at 7ea279abfbeb698b092856d0dab61e7cf39bc909 (the reference YAML
`examples/configs/grpo_math_1B.yaml`, the loss `nemo_rl/algorithms/loss/loss_functions.py`). Overrides are applied
with OmegaConf struct mode on (`nemo_rl/utils/config.py:186`), so a key the YAML lacks needs `++`. Our replay names
the loss settings by `ClippedPGLossConfig`'s fields (settings.py); `native` writes them as `loss_fn.` overrides. The
correction mapping is checked against our replay (engine.py; docs/nemo-rl-semantics.md) in
tests/trainers/test_fixes_nemo_rl.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, override_value, threshold_bounds

YAML = "examples/configs/grpo_math_1B.yaml"
LOSS = "nemo_rl/algorithms/loss/loss_functions.py"
GRPO = "nemo_rl/algorithms/grpo.py"
WORKER = "nemo_rl/models/generation/vllm/vllm_worker.py"
GEN = "policy.generation."
AT = " (NeMo-RL 7ea279ab)"
IS_ON = "loss_fn.use_importance_sampling_correction=true loss_fn.truncated_importance_sampling_type="

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting(f"{GEN}temperature=T",
                f"{YAML}:371; nemo_rl/models/automodel/setup.py:273; nemo_rl/models/automodel/train.py:193{AT}",
                "one field: vLLM samples at T and the policy worker's TrainingSamplingParams divide its logits by it"),
    ),
    "truncation": (
        Setting(f"{GEN}top_p=1.0 {GEN}top_k=null",
                f"{YAML}:372; {YAML}:373; nemo_rl/distributed/model_utils.py:440{AT}",
                "the defaults. The recompute replays top-k / top-p, so they may stay on with processed log-probs; "
                "NeMo-RL has no min_p"),
    ),
    "logprobs_mode": (
        Setting(f"{GEN}vllm_cfg.logprobs_mode=processed_logprobs", f"{YAML}:415; {WORKER}:600{AT}",
                "the reference YAML's value; forwarded only when present, so a config without the key gets vLLM's "
                "raw_logprobs. Processed ones match the recompute, which replays T, top-k and top-p"),
    ),
    "penalties": (
        Setting(f"++{GEN}bad_words=null", f"{WORKER}:666{AT}",
                "the default; banned words are a sampling-time logit change the recompute does not replay. "
                "NeMo-RL sends no repetition / presence / frequency penalty"),
    ),
    "precision": (
        Setting(f"{GEN}vllm_cfg.precision=bfloat16", f"{YAML}:413; {WORKER}:581{AT}",
                "vLLM's dtype; the YAML interpolates the trainer's policy.precision. NeMo-RL has no fp32 lm_head "
                "or batch-invariant setting"),
        Setting(f"++{GEN}vllm_kwargs.disable_cascade_attn=true", f"{YAML}:435; {WORKER}:596{AT}",
                "vllm_kwargs go straight to vllm.LLM; ++ because struct mode refuses a key the YAML lacks"),
        Setting(f"++{GEN}vllm_kwargs.compilation_config.backend=eager", f"{YAML}:421{AT}",
                "the YAML's own advice for accuracy while enforce_eager is false: vLLM's CUDA kernels instead of "
                "torch.compile's Triton ones"),
    ),
    "low_precision": (
        Setting(f"{GEN}vllm_cfg.precision=fp8", f"{YAML}:413; {WORKER}:478-489; {GRPO}:1321-1324{AT}",
                "fp8 weights through init_fp8; needs loss_fn.use_importance_sampling_correction=true"),
        Setting(f"{GEN}vllm_cfg.kv_cache_dtype=fp8", f"{YAML}:414; {GRPO}:1325-1330{AT}",
                "fp8 KV cache, only together with precision=fp8"),
    ),
    "correction": (
        Setting(f"{IS_ON}tis loss_fn.truncated_importance_sampling_ratio=2.0",
                f"{LOSS}:140; {LOSS}:146; {LOSS}:147{AT}",
                "token TIS, cap 2: each token's ratio, capped at 2, multiplies the per-token loss"),
        Setting(f"{IS_ON}icepop loss_fn.truncated_importance_sampling_ratio=2.0 "
                "loss_fn.truncated_importance_sampling_ratio_min=0.5", f"{LOSS}:149{AT}",
                "IcePop: a weight outside [0.5, 2] becomes 0, the token count unchanged"),
        Setting(f"{IS_ON}seq-mask-tis loss_fn.truncated_importance_sampling_ratio=1.002 "
                "loss_fn.truncated_importance_sampling_ratio_min=0.999", f"{LOSS}:146{AT}",
                "zeroes rows whose geometric-mean ratio is outside the band; kept rows keep raw token weights"),
        Setting("loss_fn.use_importance_sampling_correction=true loss_fn.sequence_level_importance_ratios=true "
                "loss_fn.token_level_loss=false", f"{LOSS}:119; {LOSS}:528-537{AT}",
                "one weight per row, the product of its ratios, but it also turns the PPO ratio into GSPO's "
                "sequence ratio"),
        Setting("grpo.seq_logprob_error_threshold=1.5", f"{GRPO}:296{AT}",
                "masks rows whose mean multiplicative probability error exceeds it: the absolute error, not the "
                "signed ratio"),
    ),
    "policy_version": (
        Setting("grpo.async_grpo.enabled=true grpo.async_grpo.max_trajectory_age_steps=1",
                f"{YAML}:57; {YAML}:59; nemo_rl/algorithms/async_utils/replay_buffer.py:225-249{AT}",
                "the replay buffer records each trajectory group's weight version and samples only groups at most "
                "this many steps old; async needs IS correction on"),
    ),
}
MISSING = {
    "rollout_logprobs": f"NeMo-RL 7ea279ab has no switch: vLLM always returns the sampled token's log-prob "
                        f"(logprobs=0, {WORKER}:662), stored as generation_logprobs; a message without them is "
                        f"filled with zeros and left out of the loss ({GRPO}:1939-1942)",
    "response_mask": f"NeMo-RL 7ea279ab has no loss-mask setting: token_loss_mask is 1 on assistant messages that "
                     f"carry generation_logprobs and 0 on everything else, prompt, earlier turns and tool output "
                     f"({GRPO}:1934-1937); an environment's messages decide it",
}

TRAPS = (
    Trap(("processed_logprobs", "temperature_mismatch", "logprobs_mode", "ratio_mean"),
         "NeMo-RL replays T, top-k and top-p in its recompute; vllm_cfg.logprobs_mode is optional and forwarded "
         "only when set, so a config without it compares vLLM's raw log-probs with tempered, filtered ones",
         f"{WORKER}:600; nemo_rl/distributed/model_utils.py:440{AT}"),
    Trap(("logprobs_mode", "processed_logprobs"),
         "the vLLM config's comment says the recompute uses raw logits and recommends raw_logprobs with sampling "
         "processors, but the recompute divides by T and filters top-k / top-p: raw_logprobs then breaks the match",
         f"nemo_rl/models/generation/vllm/config.py:59{AT}"),
    Trap(("truncation", "processed_logprobs"),
         "NeMo-Gym rollouts stamp only temperature and top_p on requests and refuse top_k: a training top_k is not "
         "honoured there", f"{GRPO}:518{AT}"),
    Trap(("truncation", "temperature"),
         "the reference policy keeps T but drops top-k / top-p, so the KL term compares a filtered policy with an "
         "unfiltered reference", f"nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py:1036{AT}"),
    Trap(("correction",), "use_importance_sampling_correction=true without a truncation type applies the raw, "
                          "uncapped ratio exp(d) to every token", f"{LOSS}:579{AT}"),
    Trap(("correction",), "truncated_importance_sampling_ratio without a type passes validation and raises "
                          "'Invalid truncated importance sampling type: None' on the first step", f"{LOSS}:596{AT}"),
    Trap(("correction",), "grpo.seq_logprob_error_threshold masks on exp(|d|), not the signed ratio: its threshold "
                          "is not comparable with truncated_importance_sampling_ratio", f"{GRPO}:295{AT}"),
    Trap(("precision", "precision_gap"),
         "a key the YAML lacks (any vllm_kwargs entry) needs ++: overrides are applied in struct mode and a plain "
         "key=value fails with 'Could not override'", f"nemo_rl/utils/config.py:186{AT}"),
    Trap(("low_precision",), "kv_cache_dtype reaches vLLM only through init_fp8, i.e. with precision=fp8",
         f"nemo_rl/models/generation/vllm/quantization/fp8.py:308{AT}"),
    Trap(("policy_version",), "async staleness is per trajectory group, stamped at generation start: with "
                              "in_flight_weight_updates=true one trajectory can span several weight versions",
         f"nemo_rl/algorithms/async_utils/replay_buffer.py:60{AT}"),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """ClippedPGLossConfig fields that compute a what-if ladder row exactly (token TIS, token IcePop), or None."""
    # ClippedPGLossFn.__call__ (engine.py; docs/nemo-rl-semantics.md §4), token level: w = exp(d), non-finite -> 0,
    # no ±20 clamp. tis U (ratio_min unset -> 0): clamp(w, 0, U), out of bounds when w > U: the ladder's min(r, U)
    # and its truncated share (is_oob_ratio), apart only below d = -20 (both under e^-20 = 2.1e-9) and where exp
    # overflows (float32 d > 88.7: NeMo 0, the ladder U). icepop [L, U]: w where L <= w <= U (bounds kept), else 0,
    # the mask untouched and the loss divided by the global valid-token count: the ladder's IcePop, zeroed weights
    # and denominator alike, so the same ESS; sampling_importance_ratio is then the ladder's is_weight_mean.
    # Not exact, hence None: sequence TIS / IcePop need sequence_level_importance_ratios=true, which also swaps the
    # PPO ratio for GSPO's sequence ratio and requires token_level_loss=false (loss_functions.py:528-537, 265-268):
    # it changes the policy loss, not only the correction. The RS rows and the veto: seq-mask-tis drops rows by the
    # geometric mean but weighs the kept tokens by their raw ratio (the ladder's RS weighs them 1), and
    # grpo.seq_logprob_error_threshold judges exp(|d|); "none" (no truncation type is no ladder row).
    family, level, threshold = row.get("family"), row.get("level"), row.get("threshold")
    if level != "token" or threshold is None:
        return None
    lower, upper = threshold_bounds(str(threshold))
    base = {"use_importance_sampling_correction": True, "truncated_importance_sampling_ratio": upper}
    if family == "tis" and lower is None:
        return {**base, "truncated_importance_sampling_type": "tis"}
    if family == "icepop" and lower is not None:
        return {**base, "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio_min": lower}
    return None


def native(fields: Mapping[str, Any]) -> str:
    """ClippedPGLossConfig fields as the `loss_fn.` overrides a NeMo-RL user passes (keys of grpo_math_1B.yaml)."""
    return " ".join(f"loss_fn.{name}={override_value(value)}" for name, value in fields.items())


FIXES = Fixes(
    "NeMo-RL 7ea279ab",
    "Hydra-style overrides: uv run examples/run_grpo.py --config <yaml> key=value (struct mode: a key the YAML "
    "lacks needs ++)",
    SETTINGS, MISSING, TRAPS, correction=correction, native=native, context_fields=("reference_policy_kl_type",))

__all__ = ["FIXES", "correction", "native"]
