"""prime-rl's vocabulary of fixes (commit 559b4477): pydantic-config settings, written as dotted kebab-case CLI flags
(`--orchestrator.train.sampling.temperature 0.7`) or as TOML keys of the `@ rl.toml` file.

Lines read from PrimeIntellect-ai/prime-rl at 559b44772e471d1538537b8805cc77f3824a5e64 (the configs under
packages/prime-rl-configs/). prime-rl caps no importance weight: its ratio exp(trainer - inference) enters the loss
unclamped and its own correction is a trust-region mask on the probability difference (docs/prime-rl-semantics.md
§3), which computes none of the what-if ladder's rules, so there is no ladder mapping.
"""

from __future__ import annotations

from mismatch_cli.correction.fixes import Fixes, Setting, Trap

CONFIGS = "packages/prime-rl-configs/src/prime_rl/configs"
ORCHESTRATOR = f"{CONFIGS}/orchestrator.py"
INFERENCE = f"{CONFIGS}/inference.py"
TRAINER_CONFIG = f"{CONFIGS}/trainer.py"
LOSS = "src/prime_rl/trainer/rl/loss.py"

SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (Setting("--orchestrator.train.sampling.temperature T", f"{ORCHESTRATOR}:47",
                            "one setting: the orchestrator stamps it on every token and the trainer divides its "
                            "logits by it; 0 is accepted and then divides by zero"),),
    "logprobs_mode": (Setting("--inference.vllm.logprobs-mode processed_logprobs", f"{INFERENCE}:613",
                              "prime-rl's default for the vLLM servers it launches; an externally launched vLLM "
                              "keeps vLLM's raw_logprobs: pass it there too"),),
    "precision": (
        Setting("inference.enable_fp32_lm_head = true", f"{INFERENCE}:466",
                "TOML, or --inference.enable-fp32-lm-head; the default: prime-rl's own vLLM patch; there is no "
                "deterministic-inference option at 559b4477"),
        Setting("inference.vllm.disable_cascade_attn = true", f"{INFERENCE}:55",
                "TOML: a vLLM argument passed through [inference.vllm]; not checked against the pinned vLLM"),
        Setting("--inference.vllm.dtype bfloat16", f"{INFERENCE}:60", "auto gives FP16 for an FP32 / FP16 model"),
    ),
    "low_precision": (
        Setting("--inference.vllm.quantization fp8", f"{INFERENCE}:108", "fp8 weights; unset, vLLM reads the "
                                                                          "checkpoint's"),
        Setting("--inference.vllm.kv-cache-dtype fp8", f"{INFERENCE}:55; docs/inference.md:290",
                "fp8 KV cache: a vLLM argument passed through [inference.vllm]"),
    ),
    # The nearest own correction: a token mask, not a cap (missing["correction"] says why no ladder row maps).
    "correction": (
        Setting("--trainer.loss.dppo-mask-low 0.2 --trainer.loss.dppo-mask-high 0.2",
                f"{TRAINER_CONFIG}:497; {TRAINER_CONFIG}:500",
                "the default loss: drops a token whose probability already moved more than the bound the way its "
                "advantage pushes, Δp = p_trainer - p_inference; the ratio stays unclamped"),
        Setting("--trainer.loss.type ipo --trainer.loss.ipo-threshold 0.1", f"{TRAINER_CONFIG}:512",
                "symmetric: drops a token with |Δp| > the threshold, whatever the advantage"),
    ),
    "policy_version": (Setting("--orchestrator.max-off-policy-steps 2", f"{ORCHESTRATOR}:532",
                               "the staleness bound, default 8: episodes past it are cancelled in flight and "
                               "dropped; the version is logged as off_policy/* but not in the trainer batch"),),
}
MISSING = {
    "truncation": "prime-rl 559b4477 samples training rollouts untruncated and replays no truncation: top_p is "
                  "fixed at 1.0 (orchestrator.py:62) and top_k / min_p are set to -1 / 0.0 unless given in "
                  "orchestrator.train.sampling.extra_body (orchestrator.py:651-653), which the trainer would not "
                  "replay: leave them out of extra_body. Typed top_p / top_k with trainer-side sampling replay came "
                  "later, in PR #3431, which is not in 559b4477",
    "rollout_logprobs": "prime-rl 559b4477 has no switch and needs none: training sampling always requests "
                        "logprobs (orchestrator.py:63) and they are the importance ratio's denominator (the trainer "
                        "recomputes no old log-probs)",
    "penalties": "prime-rl 559b4477 has no penalty or logit-bias setting for training sampling (only the untyped "
                 "orchestrator.train.sampling.extra_body, never replayed): send none",
    "correction": "prime-rl 559b4477 has no IS-weight cap and no sequence-level correction (searched loss.py and "
                  "configs/trainer.py): exp(trainer - inference) multiplies the advantage unclamped (loss.py:144); "
                  "its own correction is the DPPO trust-region mask on the probability difference "
                  "(--trainer.loss.dppo-mask-low / --trainer.loss.dppo-mask-high, 0.2; or type ipo), which "
                  "computes no ladder rule. A capped TIS needs type = \"custom\" with a loss of your own "
                  "(import_path, trainer.py:525)",
    "response_mask": "prime-rl 559b4477 has no setting for the RL loss mask: it is each branch's sampled-token mask, "
                     "prompt and tool tokens False (trajectories.py:69-89); only orchestrator.algo.type = \"echo\" "
                     "trains env-provided tokens, in a separate CE term outside the RL mask (algorithm.py:211-224)",
}
TRAPS = (
    Trap(("temperature_mismatch", "temperature"),
         "temperature 0 passes validation and the trainer then divides its logits by 0",
         "src/prime_rl/trainer/models/layers/lm_head.py:54"),
    Trap(("temperature_mismatch", "processed_logprobs", "logprobs_mode"),
         "processed_logprobs is set only for the vLLM prime-rl launches: an external server keeps raw_logprobs "
         "(before the temperature) while the trainer divides by T", f"{INFERENCE}:612"),
    Trap(("truncation", "processed_logprobs", "penalties"),
         "top_k / min_p / top_p / penalties in orchestrator.train.sampling.extra_body are sent and never replayed: "
         "with processed_logprobs every ratio is biased", f"{ORCHESTRATOR}:652"),
    Trap(("correction", "ratio_mean"), "the importance ratio is unclamped: a token with tiny probabilities and a "
                                       "huge ratio passes the Δp mask and weighs the gradient", f"{LOSS}:144"),
    Trap(("correction",), "the DPPO mask is sign-aware: a positive-advantage token is masked only when its "
                          "probability rose, any other only when it fell", f"{LOSS}:135"),
    Trap(("precision", "precision_gap"), "enable_fp32_lm_head defaults to true (prime-rl's vLLM patch): a stock "
                                         "vLLM or another engine has a different logit precision", f"{INFERENCE}:466"),
    Trap(("policy_version",), "policy versions live on the orchestrator's episodes only: the trainer batch and the "
                              "token export carry none", "src/prime_rl/orchestrator/dispatcher.py:640"),
)

FIXES = Fixes("prime-rl 559b4477", "pydantic config: dotted kebab-case CLI flags (--section.field value; booleans "
                                   "--flag / --no-flag) or TOML keys of the @ rl.toml file",
              SETTINGS, MISSING, TRAPS)

__all__ = ["FIXES"]
