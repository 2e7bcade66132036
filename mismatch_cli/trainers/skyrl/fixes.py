"""SkyRL 0.4.0's vocabulary of fixes: OmegaConf `key=value` overrides of its `SkyRLTrainConfig` dataclasses.

Lines read from the PyPI wheel skyrl-0.4.0 (the config is the dataclass tree `skyrl/train/config/config.py`, no YAML;
the correction `skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py`). Our replay names the correction's
fields by `OffPolicyCorrectionConfig`'s own names (settings.py); `native` writes them as the overrides. The
correction mapping is checked against our replay (engine.py; docs/skyrl-semantics.md) in
tests/trainers/test_fixes_skyrl.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, override_value, threshold_bounds

CONFIG = "skyrl/train/config/config.py"
OPC = "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"
SERVERS = "skyrl/backends/skyrl_train/inference_servers/utils.py"
GENERATOR = "skyrl/train/generators/skyrl_gym_generator.py"
CORRECTION = "trainer.algorithm.off_policy_correction."
SAMPLING = "generator.sampling_params."
ENGINE = "generator.inference_engine."
V = " (SkyRL 0.4.0)"

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting(f"{SAMPLING}temperature=T", f"{CONFIG}:1088; {CONFIG}:1859-1860{V}",
                "vLLM samples at T; trainer.algorithm.temperature copies it while left unset"),
        Setting("trainer.algorithm.temperature=T", f"{CONFIG}:924{V}",
                "the recompute's own temperature, its logits divided by it: leave it null, or set the same T"),
    ),
    "truncation": (
        Setting(f"{SAMPLING}top_p=1.0 {SAMPLING}top_k=-1 {SAMPLING}min_p=0.0",
                f"{CONFIG}:1091; {CONFIG}:1095; {CONFIG}:1093{V}",
                "the defaults; the recompute replays none of them unless sample-support replay is on"),
        Setting(f"trainer.algorithm.enable_sample_support_replay=true {ENGINE}enable_return_sample_support_set=true",
                f"{CONFIG}:1000; {CONFIG}:1257; {CONFIG}:1862-1890{V}",
                "replays the sampler's top-k / top-p support; needs top_k > 1, T > 0, no additional_kwargs, "
                "strategy fsdp or megatron"),
    ),
    "logprobs_mode": (
        Setting(f"{ENGINE}engine_init_kwargs.logprobs_mode=processed_logprobs", f"{CONFIG}:1298; {SERVERS}:289{V}",
                "vLLM engine argument, applied last; only for engines SkyRL launches, an external server needs "
                "--logprobs-mode itself. Without it vLLM reports raw log-probs, before the temperature"),
    ),
    "rollout_logprobs": (
        Setting(f"{SAMPLING}logprobs=1", f"{CONFIG}:1097{V}",
                "the default; 0 and 1 both return the sampled token's log-prob, null returns none"),
    ),
    "penalties": (
        Setting(f"{SAMPLING}additional_kwargs=null", f"{CONFIG}:1103{V}",
                "the default: no penalty reaches vLLM. Penalties go only through additional_kwargs: "
                "repetition_penalty, presence_penalty, frequency_penalty; the recompute replays none"),
    ),
    "precision": (
        Setting(f"{ENGINE}engine_init_kwargs.disable_cascade_attn=true", f"{CONFIG}:1298{V}",
                "vLLM engine argument, vllm==0.30.0; SkyRL has no fp32 lm_head or batch-invariant setting"),
        Setting(f"{ENGINE}model_dtype=bfloat16", f"{CONFIG}:1190{V}",
                "vLLM's dtype, and the dtype weights are cast to when synced: the trainer's compute dtype"),
    ),
    "low_precision": (
        Setting(f"{ENGINE}fp8_weight_sync_mode=auto", f"{CONFIG}:1194; {CONFIG}:1927-1928{V}",
                "fp8 weights: blockwise, mxfp8 or auto; trainer.strategy=megatron only"),
        Setting(f"{ENGINE}engine_init_kwargs.kv_cache_dtype=fp8", f"{CONFIG}:1298{V}", "fp8 KV cache, vLLM"),
    ),
    "correction": (
        Setting(f"{CORRECTION}tis_ratio_type=token {CORRECTION}token_tis_ratio_clip_high=2.0",
                f"{CONFIG}:875; {CONFIG}:878{V}",
                "token-level TIS, cap 2: each token's ratio, capped at 2, multiplies the loss"),
        Setting(f"{CORRECTION}tis_ratio_type=token {CORRECTION}token_tis_ratio_clip_high=2.0 "
                f"{CORRECTION}token_mask_is_threshold_low=0.5 {CORRECTION}token_mask_is_threshold_high=2.0",
                f"{CONFIG}:896; {CONFIG}:898{V}",
                "IcePop: a token outside [0.5, 2] is masked under the unchanged token count, the others keep their "
                "ratio; both bounds are needed"),
        Setting(f"{CORRECTION}tis_ratio_type=sequence {CORRECTION}sequence_tis_ratio_clip_high=5.0",
                f"{CONFIG}:880{V}", "sequence TIS: the row's product of ratios, capped, weighs its tokens"),
        Setting(f"{CORRECTION}sequence_mask_metric=geometric {CORRECTION}geo_mask_low=0.99 "
                f"{CORRECTION}geo_mask_high=1.01", f"{CONFIG}:882; {CONFIG}:884; {CONFIG}:886{V}",
                "drops rows whose geometric-mean ratio is outside the band; product uses product_mask_low / _high"),
        Setting(f"{CORRECTION}outlier_token_is_threshold_low=1e-4", f"{CONFIG}:892{V}",
                "drops a row holding a token ratio below it; either outlier bound switches it on"),
    ),
    "response_mask": (
        Setting("generator.use_conversation_multi_turn=true", f"{CONFIG}:1365; {GENERATOR}:132-146{V}",
                "the default. No mask setting: the generator sets 1 on generated tokens, 0 on observations and on "
                "an EOS it adds"),
    ),
    "policy_version": (
        Setting("trainer.fully_async.enabled=true trainer.fully_async.max_staleness_steps=4",
                f"{CONFIG}:1033; {CONFIG}:1035; skyrl/train/fully_async_trainer.py:81{V}",
                "the fully async trainer, through its own entrypoint, records each group's scheduling step and logs "
                "async/staleness_*; the synchronous trainer records none"),
    ),
}

TRAPS = (
    Trap(("temperature_mismatch", "logprobs_mode", "ratio_mean"),
         "SkyRL leaves vLLM at raw_logprobs (before temperature) unless sample-support capture is on, while the "
         "trainer divides its logits by trainer.algorithm.temperature: at T != 1 the sides differ. Fix: "
         f"{ENGINE}engine_init_kwargs.logprobs_mode=processed_logprobs", f"{SERVERS}:229{V}"),
    Trap(("processed_logprobs", "truncation"),
         "with processed_logprobs and top_p < 1 or top_k > 0, vLLM renormalises over the kept tokens, which the "
         "recompute replays only with enable_sample_support_replay", f"{CONFIG}:1000{V}"),
    Trap(("temperature_mismatch", "temperature"),
         "trainer.algorithm.temperature is copied from the sampling temperature only while null: a leftover value "
         "that differs is neither reconciled nor warned about", f"{CONFIG}:1859{V}"),
    Trap(("penalties", "ratio_mean"),
         f"{SAMPLING}repetition_penalty is accepted but never sent to vLLM on the typed path: pass penalties "
         "through additional_kwargs, which the recompute does not replay", f"{CONFIG}:1087{V}"),
    Trap(("constant_fill", "response_mask"),
         "generator.use_conversation_multi_turn=false appends an EOS the model did not sample, with loss mask 1 and "
         "rollout log-prob 0.0", f"{GENERATOR}:691{V}"),
    Trap(("rollout_logprobs", "identical_sides", "correction"),
         "the correction is skipped silently when rollout_logprobs is None: a custom chat template in multi-turn "
         "mode returns none (skyrl_gym_generator.py:390), and logprobs=null with only the masks configured",
         f"{OPC}:378{V}"),
    Trap(("correction",), "the token mask runs only with BOTH token_mask_is_threshold_low and _high; one bound "
                          "alone silently disables it (one outlier bound is enough)", f"{OPC}:19{V}"),
    Trap(("correction",), "the deprecated trainer.algorithm.use_tis=true copies tis_imp_ratio_cap (default -1.0) "
                          "into the cap: every weight becomes -1 and the loss flips sign",
         f"skyrl/train/utils/utils.py:515{V}"),
    Trap(("policy_version",), "trainer.fully_async.max_staleness_steps only warns: an older group is still trained "
                              "on", f"skyrl/train/fully_async_trainer.py:1027{V}"),
    Trap(("temperature",), "the FSDP reference model scores at T=1 (Megatron's at the trainer's T), so the KL to "
                           "the reference is untempered on FSDP",
         f"skyrl/backends/skyrl_train/workers/worker.py:1797{V}"),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """OffPolicyCorrectionConfig fields that compute a what-if ladder row exactly, or None (k3 RS, none)."""
    # compute_off_policy_correction (engine.py; docs/skyrl-semantics.md §3): w = safe_exp(d), d clamped to [-20, 20]
    # in float32 as the ladder's r; S = sum of d over the row, safe_exp(S) as the ladder's exp(clamp(S, ±20)).
    # TIS token / sequence U: torch.clamp(w or safe_exp(S), max=U) multiplies the loss: the ladder's min(r, U),
    # truncated when r > U. A mask (token, sequence, outlier) multiplies loss_mask, but SkyRL scales the advantages
    # by the mini-batch's ORIGINAL loss_mask before the loss (trainer.py:1527, reduce_loss sums) so a masked token
    # is a weight of 0 under an unchanged denominator: exactly the ladder's IcePop zeroing. IcePop [L, U] is that
    # mask (bounds kept, as the ladder) with TIS at U, so kept tokens / rows weigh min(r, U) = r: token level the
    # token mask, sequence level the product mask on safe_exp(S). RS and the veto drop rows with weight 1 on the
    # kept ones, as verl's RS; verl also drops the rows from its denominator, SkyRL keeps them there (the step
    # shrinks by kept / all tokens), but the ladder's health checks are over the kept tokens, which are the same.
    # geo-RS (seq_mean_k1) L_U in verl's k1 direction keeps exp(mean d) in [1/U, 1/L]: the geometric mask with
    # those bounds; seq_sum_k1 the product mask on exp(sum d) likewise. Apart only where a token's |d| > 20 (the
    # ladder clamps each token, SkyRL the mean or sum) or at float32 rounding of a bound. Veto V: the outlier mask
    # drops a row with a token w < V (V > e^-20, so the clamp never decides): the ladder's d < log V.
    family, level, threshold = row.get("family"), row.get("level"), row.get("threshold")
    if threshold is None:
        return None
    lower, upper = threshold_bounds(str(threshold))
    if family == "tis" and lower is None:
        if level == "token":
            return {"tis_ratio_type": "token", "token_tis_ratio_clip_high": upper}
        return {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": upper}
    if family == "icepop" and lower is not None:
        if level == "token":
            return {"tis_ratio_type": "token", "token_tis_ratio_clip_high": upper,
                    "token_mask_is_threshold_low": lower, "token_mask_is_threshold_high": upper}
        return {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": upper,
                "sequence_mask_metric": "product", "product_mask_low": lower, "product_mask_high": upper}
    if family == "rs" and row.get("option") in ("seq_mean_k1", "seq_sum_k1"):
        lower = 1.0 / upper if lower is None else lower  # a single k1 U is the band [1/U, U]
        name = "geo" if row["option"] == "seq_mean_k1" else "product"
        return {"sequence_mask_metric": "geometric" if name == "geo" else "product",
                f"{name}_mask_low": 1.0 / upper, f"{name}_mask_high": 1.0 / lower}
    if family == "veto" and lower is None:
        return {"outlier_token_is_threshold_low": upper}
    return None


def native(fields: Mapping[str, Any]) -> str:
    """OffPolicyCorrectionConfig fields as the overrides a SkyRL user passes (`trainer.algorithm.…`)."""
    def prefix(name: str) -> str:
        return "trainer." if name == "micro_train_batch_size_per_gpu" else CORRECTION

    return " ".join(f"{prefix(name)}{name}={override_value(value)}" for name, value in fields.items())


FIXES = Fixes(
    "SkyRL 0.4.0",
    "key=value overrides (OmegaConf dotlist) to python -m skyrl.train.entrypoints.main_base; no '+' prefix (refused); "
    "new keys under dict fields (engine_init_kwargs, additional_kwargs) need none",
    SETTINGS, {}, TRAPS, correction=correction, native=native, context_fields=("micro_train_batch_size_per_gpu",))

__all__ = ["FIXES", "correction", "native"]
