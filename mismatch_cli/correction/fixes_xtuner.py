"""xtuner's vocabulary of fixes (commit b934f462): the pydantic objects of its Python config file (`SampleParams`,
`RolloutConfig`, `RolloutImportanceSampling`, the producer strategy) and `XTUNER_*` environment variables.

Lines read from InternLM/xtuner at b934f462095c1e750229de35367c50ae36caa786. Its trainer never divides its logits
by the sampling temperature (xtuner/v1/rl/utils/misc.py:117), so the fix for a temperature gap is T = 1, not a
matching trainer setting. The correction is the correction model itself (semantics xtuner takes
RolloutImportanceSampling's fields, correction/older.py), so there is no ladder mapping here; `native` writes the
model's xtuner fields as the object a user puts in GRPOLossConfig(rollout_is=...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap
from mismatch_cli.correction.parse import pair

RL_DATA = "xtuner/v1/data_proto/rl_data.py"
WORKER = "xtuner/v1/rl/rollout/worker.py"
IS = "xtuner/v1/rl/rollout_is.py"
FIELDS = ("rollout_is_level", "rollout_is_mode", "rollout_is_threshold", "rollout_is_mask_threshold",
          "rollout_is_veto_threshold")
PAIRS = ("rollout_is_threshold", "rollout_is_mask_threshold", "rollout_is_veto_threshold")

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (Setting("SampleParams(temperature=1.0)", f"{RL_DATA}:30",
                            "keep T = 1: the trainer never divides its logits by a temperature, so at T != 1 its "
                            "log-probs, PPO ratio and IS are those of the untempered policy"),),
    "truncation": (Setting("SampleParams(top_p=1.0, top_k=0)", f"{RL_DATA}:29; {RL_DATA}:28",
                           "the defaults: the trainer replays neither, its log_softmax is over the full vocabulary; "
                           "SampleParams has no min_p"),),
    "logprobs_mode": (Setting('RolloutConfig(extra_rollout_config={"vllm_logprobs_mode": "raw_logprobs"})',
                              "xtuner/v1/rl/rollout/vllm.py:366",
                              "vLLM: raw, untempered log-probs, as the trainer computes; LMDeploy's pytorch backend "
                              "pins them already; SGLang has no xtuner knob; vLLM's argument not read at a pinned "
                              "vLLM"),),
    "rollout_logprobs": (Setting("SampleParams(return_logprob=True)", f"{RL_DATA}:41",
                                 "the default; without rollout log-probs the IS / mismatch step is skipped"),),
    "penalties": (Setting("SampleParams(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)",
                          f"{RL_DATA}:31", "the defaults: never replayed by the trainer; no logit_bias field"),),
    "precision": (
        Setting("RolloutConfig(fp32_lm_head=True)", f"{WORKER}:391",
                "LMDeploy's pytorch backend only; the trainer's side is FSDPConfig.fp32_lm_head"),
        Setting('RolloutConfig(extra_rollout_config={"sglang_enable_fp32_lm_head": True})',
                "xtuner/v1/rl/rollout/sglang.py:421", "SGLang: kept only if the installed SGLang's ServerArgs has "
                                                      "the field, else dropped with a warning"),
        Setting("export XTUNER_DETERMINISTIC=true", "xtuner/v1/rl/rollout/sglang.py:409",
                "SGLang: deterministic inference, fa3 attention, no radix cache"),
        Setting('RolloutConfig(extra_rollout_config={"vllm_disable_cascade_attn": True})',
                "xtuner/v1/rl/rollout/vllm.py:366", "vLLM: written onto the serve arguments"),
    ),
    "low_precision": (
        Setting("RolloutConfig(enable_float8=True)", f"{WORKER}:349", "fp8 weights, LMDeploy only"),
        Setting('RolloutConfig(extra_rollout_config={"sglang_kv_cache_dtype": "fp8_e4m3"})', f"{WORKER}:356",
                'fp8 KV cache on SGLang; vLLM: "vllm_kv_cache_dtype": "fp8"'),
    ),
    "policy_version": (Setting("AsyncProduceStrategyConfig(max_staleness=1, max_token_staleness=0)",
                               "xtuner/v1/rl/agent_loop_manager/producer.py:233",
                               "per-token model steps are recorded in RolloutState.response_model_steps; stale "
                               "groups expire, tokens older than max_token_staleness are masked"),),
}
MISSING = {
    # Said here, not as a Setting: a setting's text must not read as verl's, and xtuner's field shares a name with it.
    "correction": "xtuner's correction is the correction model's own (semantics xtuner takes its fields): "
                  "GRPOLossConfig(rollout_is=RolloutImportanceSampling(rollout_is_level=\"token\", "
                  "rollout_is_mode=\"truncate\", rollout_is_threshold=(2.0, 0.0))) (xtuner/v1/rl/rollout_is.py:323; "
                  "xtuner/v1/rl/loss/base_loss.py:87). The tuple is (upper, lower) and truncate clamps both ends, so "
                  "lower 0.0 for a plain cap; rollout_is_mode=\"mask\" drops tokens outside the band from the loss "
                  "(rollout_is.py:303); rollout_is_level \"sequence\" or \"geometric\" (rollout_is.py:79)",
    "response_mask": "xtuner b934f462 has no config switch for the loss mask: the agent loop writes "
                     "RolloutState.response_mask (None: every response token trains, rl_trainer.py:1201-1202) and "
                     "prompt positions are always -100 (rl_trainer.py:1213); agentic trace loops take the labels "
                     "from the trace (rl_trainer.py:1134-1136), so whatever the trace labels trains",
}
TRAPS = (
    Trap(("temperature_mismatch", "temperature"),
         "the trainer never divides its logits by the temperature: with SGLang (temperature-scaled log-probs) "
         "and T != 1 the two sides differ, and at any T != 1 the ratio is against the untempered policy",
         "xtuner/v1/rl/utils/misc.py:117"),
    Trap(("correction",), "rollout_is_threshold is (upper, lower), asserted upper > lower; the docstring's "
                          "example (0.8, 1.2) fails that assertion", f"{IS}:191-192"),
    Trap(("correction",), "truncate mode clamps from below too: a cap of 2.0 needs lower 0.0, or small ratios "
                          "are raised to the lower bound", f"{IS}:323"),
    Trap(("correction", "response_mask"), "mask mode removes out-of-band tokens from the loss (labels -100) "
                                          "rather than zeroing their weight", "xtuner/v1/rl/loss/base_loss.py:249"),
    Trap(("truncation",), "the SGLang backend drops top_k whenever top_p > 0 (always, with the default 1.0)",
         "xtuner/v1/rl/rollout/sglang.py:444-445"),
    Trap(("logprobs_mode", "processed_logprobs", "temperature_mismatch"),
         "raw_logprobs is pinned only for LMDeploy's pytorch backend: turbomind, vLLM and SGLang report their "
         "engine default", "xtuner/v1/rl/rollout/lmdeploy.py:423"),
    Trap(("precision", "precision_gap"), "RolloutConfig.dtype is declared but no backend reads it",
         f"{WORKER}:175"),
    Trap(("precision", "low_precision"), "an unknown sglang_* key is dropped with only a warning, and a misspelt "
                                         "vllm_* key is written onto the serve arguments unchecked",
         "xtuner/v1/rl/rollout/sglang.py:424; xtuner/v1/rl/rollout/vllm.py:368"),
    Trap(("policy_version",), "enable_partial_rollout continues responses across weight syncs, so one sample's "
                              "rollout log-probs come from several policies",
         "xtuner/v1/rl/agent_loop_manager/producer.py:202-213"),
)


def native(fields: Mapping[str, Any]) -> str:
    """xtuner correction fields as the RolloutImportanceSampling(...) a user puts in GRPOLossConfig(rollout_is=...)."""
    args = []
    for name in FIELDS:
        if name not in fields:
            continue
        value = fields[name]
        if name in PAIRS:
            bounds = pair(name, value)
            text = "None" if bounds is None else f"({float(bounds[0])!r}, {float(bounds[1])!r})"
        else:
            text = "None" if value is None else f'"{value}"'
        args.append(f"{name}={text}")
    return f"RolloutImportanceSampling({', '.join(args)})"


FIXES = Fixes("xtuner b934f462", "a Python config file of pydantic objects (SampleParams, RolloutConfig, "
                                 "GRPOLossConfig(rollout_is=RolloutImportanceSampling(...))) and XTUNER_* variables",
              SETTINGS, MISSING, TRAPS, native=native)
# Shared by xtuner-2025-12: that release (d56c9abe9) has the same RolloutImportanceSampling fields, in
# xtuner/v1/rl/base/rollout_is.py; the lines above are the head's.

__all__ = ["FIXES", "native"]
