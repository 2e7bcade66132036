"""OpenRLHF 0.11.2's vocabulary of fixes: the dotted argparse flags of `python -m openrlhf.cli.train_ppo_ray`.

Lines read from the PyPI wheel openrlhf-0.11.2 (`openrlhf/cli/train_ppo_ray.py`, `openrlhf/models/loss.py`,
`openrlhf/trainer/`). Our replay names the settings by `PolicyLoss`'s parameters (settings.py); `native` writes
them as the flags. The correction mapping is checked against our replay of OpenRLHF's gate (engine.py;
docs/openrlhf-semantics.md) in tests/trainers/test_fixes_openrlhf.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, threshold_bounds

CLI = "openrlhf/cli/train_ppo_ray.py"
LOSS = "openrlhf/models/loss.py"
SAMPLES = "openrlhf/trainer/ppo_utils/samples_generator.py"
VLLM = "openrlhf/trainer/ray/vllm_engine.py"
AGENT = "openrlhf/utils/agent.py"
ADVANTAGE = "--algo.advantage."
# Our replay's field (PolicyLoss's parameter) -> the flag train_ppo_ray.py defines for it.
FLAGS = {**{name: ADVANTAGE + name for name in ("is_correction_level", "is_correction_mode", "is_correction_gating",
                                                "is_correction_threshold")},
         "policy_loss_type": "--actor.policy_loss_type", "micro_train_batch_size": "--train.micro_batch_size"}

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting("--rollout.temperature T", f"{CLI}:418",
                "one flag: vLLM samples at T, the actor and the reference divide their logits by T, "
                "openrlhf/models/actor.py:271"),),
    "truncation": (
        Setting("--rollout.top_p 1.0", f"{CLI}:417",
                "the default; the recompute replays only the temperature; top_k is always -1, no min_p"),),
    "logprobs_mode": (
        Setting(f"{ADVANTAGE}is_correction_level token", f"{CLI}:78",
                "no flag of its own: vLLM reports processed_logprobs only while the correction is on, "
                "with vLLM > 0.10.0; off, vLLM keeps its default"),),
    "rollout_logprobs": (
        Setting(f"{ADVANTAGE}is_correction_level token", f"{SAMPLES}:206",
                "off, the default, asks vLLM for no log-probs at all"),),
    "precision": (
        Setting("--ds.param_dtype bf16", f"{CLI}:331",
                f"the default; vLLM runs bfloat16, fixed at {VLLM}:273, so fp16 training opens a gap"),
        Setting("--train.full_determinism_enable", f"{CLI}:421",
                "deterministic training, transformers' enable_full_determinism; on the vLLM side it only turns "
                "V1 multiprocessing off, no batch-invariant kernels"),
    ),
    "correction": (
        Setting(f"{ADVANTAGE}is_correction_level token {ADVANTAGE}is_correction_mode clip "
                f"{ADVANTAGE}is_correction_threshold 2.0", f"{CLI}:261; {CLI}:269; {CLI}:285",
                "token-level TIS, cap 2: one value is the band [0, 2]; only with --actor.policy_loss_type ppo"),
        Setting(f"{ADVANTAGE}is_correction_level token {ADVANTAGE}is_correction_mode mask "
                f"{ADVANTAGE}is_correction_threshold 0.5 2.0", f"{LOSS}:238",
                "IcePop-style: a token ratio outside [0.5, 2] gets weight 0"),
    ),
    "response_mask": (
        Setting("--train.agent_func_path /path/to/agent.py", f"{CLI}:563",
                f"no flag builds the mask: action_mask is 1 on the generated spans, {SAMPLES}:258; a custom "
                "agent's action_ranges decide them, and wrong ranges let prompt or environment tokens in"),),
    "policy_version": (
        Setting("--train.async_enable --train.async_queue_size 1", f"{CLI}:293; {CLI}:294",
                "no per-sample policy version is recorded: the queue size bounds the staleness; "
                "--train.partial_rollout_enable mixes weights inside one sample"),),
}
MISSING = {
    "penalties": f"OpenRLHF 0.11.2 sends no repetition / presence / frequency penalty or logit bias (its "
                 f"SamplingParams, {SAMPLES}:199-207, holds none); a custom agent that returns its own "
                 f"sampling_params ({AGENT}:165) must leave them neutral",
    "low_precision": f"OpenRLHF 0.11.2 has no fp8 weight or KV-cache flag: the vLLM engine's arguments are fixed "
                     f"({VLLM}:264-280, no quantization or kv_cache_dtype); a low-precision rollout needs a patched "
                     "create_vllm_engines",
}

TRAPS = (
    Trap(("processed_logprobs", "truncation", "ratio_mean"),
         "top_p < 1 reaches vLLM's processed log-probs but the actor's recompute only divides by the temperature",
         f"{SAMPLES}:201; openrlhf/models/actor.py:270-271"),
    Trap(("identical_sides", "rollout_logprobs", "logprobs_mode"),
         f"vLLM returns log-probs, processed ones, only while {ADVANTAGE}is_correction_level is not off: with the "
         "correction off there is no engine log-prob and no mismatch metric", f"{CLI}:78; {SAMPLES}:206"),
    Trap(("constant_fill", "rollout_logprobs"),
         "a sampled token without a vLLM log-prob is recorded as 0.0 (probability 1) in rollout_log_probs",
         f"{AGENT}:264"),
    Trap(("temperature_mismatch", "temperature"),
         "a custom agent's step() may return other sampling_params (another temperature) mid-episode; the trainer "
         "still divides by --rollout.temperature", f"{AGENT}:165-166; openrlhf/trainer/ray/ppo_actor.py:525"),
    Trap(("temperature", "correction"),
         "the flat flags of older releases (--temperature, --enable_vllm_is_correction, "
         "--vllm_is_truncated_threshold, …) are refused as unrecognized arguments", f"{CLI}:627"),
    Trap(("precision_gap", "precision"),
         "vLLM's dtype is fixed to bfloat16 while --ds.param_dtype fp16 trains in fp16: a built-in precision gap",
         f"{VLLM}:273; {CLI}:331"),
    Trap(("correction",), "the correction only runs with --actor.policy_loss_type ppo; with gspo the ratio "
                          "silently becomes exp(mean(log_probs - rollout_log_probs)), ungated and unclipped",
         f"{LOSS}:191-192; {LOSS}:216"),
    Trap(("correction",), "turning the correction on without a mode gives IcePop-style masking on [0.5, 5.0], not "
                          "TIS; clip with two values also floors the ratio at LOW",
         f"{CLI}:271; {CLI}:288; {LOSS}:235-239"),
    Trap(("correction",), "is_correction_threshold takes LOW > HIGH and negative values without an error: mask "
                          "then keeps nothing, and clip with a negative HIGH flips the loss's sign",
         f"{CLI}:639-642; {LOSS}:235"),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """PolicyLoss fields that compute a what-if ladder row exactly (token TIS, token IcePop), or None."""
    # PolicyLoss.forward (engine.py; docs/openrlhf-semantics.md), ratio gating, token level: stat = exp(d), unclamped.
    # clip with one value U (the band [0, U]) weighs a token by clamp(exp(d), 0, U) = min(exp(d), U) and counts it
    # filtered when exp(d) > U: the ladder's token TIS (min(exp(clamp(d, -20, 20)), U), truncated when r > U), the
    # same truncated tokens, weights apart only below d = -20 where both are under exp(-20) = 2.1e-9.
    # mask with [L, U] weighs a token by exp(d) when L <= exp(d) <= U, else 0 (the mask is left alone): the ladder's
    # token IcePop, bounds included; its bands lie inside [0.5, 5], where the ladder's ±20 clamp never acts.
    # Not exact, hence None: sequence TIS / IcePop (OpenRLHF has no sequence weight: clip at seq level is refused,
    # and seq mask gates on the GEOMETRIC mean); geo-RS L_U (seq mask over [1/U, 1/L] keeps the same rows, verl's k1
    # direction, but weighs the kept tokens by their raw ratio and leaves the dropped rows in the loss with weight
    # 0, where RS takes them out of the mask: a different rule, and a different ESS over kept tokens); the k3 RS
    # (OpenRLHF's other gates are binary_kl and tv); the veto; "none" (level off logs nothing).
    family, level, threshold = row.get("family"), row.get("level"), row.get("threshold")
    if family not in ("tis", "icepop") or level != "token" or threshold is None:
        return None
    lower, upper = threshold_bounds(str(threshold))
    if family == "tis" and lower is None:
        return {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_gating": "ratio",
                "is_correction_threshold": upper}
    if family == "icepop" and lower is not None:
        return {"is_correction_level": "token", "is_correction_mode": "mask", "is_correction_gating": "ratio",
                "is_correction_threshold": f"{lower}_{upper}"}
    return None


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    if isinstance(value, str) and "_" in value and value.replace("_", "").replace(".", "").isdigit():
        return value.replace("_", " ")  # our LOW_HIGH is the flag's two values
    return str(value)


def native(fields: Mapping[str, Any]) -> str:
    """PolicyLoss fields as the train_ppo_ray.py flags a user passes (`--algo.advantage.is_correction_*`)."""
    return " ".join(f"{FLAGS.get(name, '--' + name)} {_value(value)}" for name, value in fields.items())


FIXES = Fixes(
    "OpenRLHF 0.11.2",
    "dotted argparse flags of `python -m openrlhf.cli.train_ppo_ray` (--section.flag value; store_true flags take "
    "no value; is_correction_threshold takes HIGH or LOW HIGH)",
    SETTINGS, MISSING, TRAPS, correction=correction, native=native, context_fields=("micro_train_batch_size",))

__all__ = ["FIXES", "correction", "native"]
