"""Miles's vocabulary of fixes (commit 31f1ca96): slime's argparse flags, SGLang's server flags as `--sglang-<flag>`,
and the MIS helper's YAML keys (read through `--custom-config-path`, not argparse flags).

Lines read from radixark/miles at 31f1ca961a94cb860cec3b2dea34ec332bfa8f76. Miles's hooks and MIS helper compute
exactly what slime's do (docs/miles-semantics.md §1), and the MIS helper's masked tokens keep the loss's original
denominators as slime's do (losses.py:265-273), so the ladder mapping is slime's (trainers/slime/fixes.py, whose
comments give each row's exactness) with Miles's function paths.
"""

from __future__ import annotations

from mismatch_cli.correction.fixes import Fixes, Setting, Trap
from mismatch_cli.trainers.miles.settings import CORRECTIONS, MIS_FUNCTIONS
from mismatch_cli.trainers.slime.fixes import (
    CONTEXT,
    hook_correction,
    hook_native,
    mis_correction,
    mis_native,
    mis_yaml_settings,
)

ARGS = "miles/utils/arguments.py"
LOSSES = "miles/backends/training_utils/loss_hub/losses.py"
MIS_DIR = "examples/infra_features/train_infer_mismatch_helper"
SGLANG_ARGS = "miles/backends/sglang_utils/arguments.py:97"
ICEPOP = f"{CORRECTIONS}.icepop_function"
TRAINER = "Miles 31f1ca96"


def _settings(mis: bool) -> dict[str, tuple[Setting, ...]]:
    hook = (
        Setting("--use-tis --tis-clip 2.0", f"{ARGS}:1539; {ARGS}:1545",
                "token TIS: the loss times the ratio pi_old / pi_rollout clamped to [--tis-clip-low 0, 2.0]; refused "
                "together with --use-rollout-logprobs"),
        Setting(f"--use-tis --custom-tis-function-path {ICEPOP} --tis-clip-low 0.5 --tis-clip 2.0",
                f"miles/backends/training_utils/loss_hub/corrections.py:53; {ARGS}:1557",
                "IcePop: weight 0 outside [tis-clip-low, tis-clip]; it runs only with --use-tis or "
                "--get-mismatch-metrics"),
    )
    helper = (
        Setting(f"--use-tis --custom-config-path mis.yaml --custom-tis-function-path {MIS_FUNCTIONS[0]}",
                f"{MIS_DIR}/run-qwen3-4b-mis.sh:126", "the MIS helper, an example plug-in, FSDP: "
                "compute_mis_weights_fsdp; its knobs are YAML keys of mis.yaml; the shipped file also rejects "
                "outside [0.5, 2.0], vetoes at 1.0e-4 and batch-normalizes"),
        *mis_yaml_settings(MIS_DIR),
    )
    return {
        "temperature": (Setting("--rollout-temperature T", f"{ARGS}:505",
                                "one flag: SGLang samples at T and the trainer divides its logits by T when T > 0 "
                                "and != 1; nothing refuses T <= 0"),),
        "truncation": (Setting("--rollout-top-p 1.0 --rollout-top-k -1", f"{ARGS}:511; {ARGS}:514",
                               "the trainer replays neither, so training rollouts must not truncate; there is no "
                               "min-p flag"),),
        "precision": (
            Setting("--sglang-enable-fp32-lm-head", SGLANG_ARGS,
                    "SGLang's ServerArgs flag through Miles's --sglang- pass-through: the installed SGLang must "
                    "have it"),
            Setting("--true-on-policy-mode --sglang-enable-deterministic-inference --sglang-rl-on-policy-target "
                    "fsdp", f"examples/infra_features/true_on_policy/run_simple.py:104; {ARGS}:295",
                    "Miles's true-on-policy recipe, with --sglang-attention-backend fa3, --attn-implementation "
                    "flash_attention_3 and --deterministic-mode"),
            Setting("--sglang-dtype bfloat16", SGLANG_ARGS, "SGLang's --dtype through the pass-through: the "
                                                            "trainer's compute dtype"),
        ),
        "low_precision": (
            Setting("--hf-checkpoint /path/to/Qwen3-4B-FP8", "examples/infra_features/low_precision/"
                    "run-qwen3-4b-fp8.sh:31", "fp8 weights: an FP8 HF checkpoint, whose quantization_config "
                                              "quantises each weight update; no separate flag"),
            Setting("--sglang-kv-cache-dtype fp8_e4m3", "scripts/run_qwen3_30b_a3b.py:380", "fp8 KV cache"),
        ),
        "correction": (*helper, *hook) if mis else (*hook, helper[0]),
        "response_mask": (
            Setting("--mask-offpolicy-in-partial-rollout", f"{ARGS}:663",
                    "with --partial-rollout: drops the older policy's prefix; refused on the class-based rollout "
                    "path unless MILES_USE_LEGACY_ROLLOUT_V1=1; the loss mask covers response tokens only"),
            Setting("--rollout-data-postprocess-path my_module.postprocess", f"{ARGS}:805",
                    "the hook that may edit loss masks after the log-probs are computed"),
        ),
        "policy_version": (
            Setting("--fully-async --max-weight-staleness 2", f"{ARGS}:672",
                    "per-sample weight versions reach the training data; groups staler than the bound are "
                    "recycled, in fully-async mode only"),
            Setting("--update-weights-interval 1", f"{ARGS}:780", "outside fully-async: train_async.py prefetches "
                                                                  "one rollout and syncs every this many"),
        ),
    }


MISSING = {
    "logprobs_mode": "Miles 31f1ca96 has no setting (searched logprobs_mode and SGLANG_RETURN_ORIGINAL_LOGPROB): "
                     "SGLang's default reports log-probs after the temperature, which the trainer recomputes; leave "
                     "SGLANG_RETURN_ORIGINAL_LOGPROB unset on the engines",
    "rollout_logprobs": "Miles 31f1ca96 has no switch and needs none: every generate request asks for the sampled "
                        "tokens' log-probs (generate_endpoint_utils.py:68), shipped as rollout_log_probs; "
                        "--use-rollout-logprobs (arguments.py:1518) only makes them the PPO old log-probs",
    "penalties": "Miles 31f1ca96 has no penalty or logit-bias flag (searched repetition / presence / frequency "
                 "penalty: no match): SGLang's defaults apply; a custom rollout function that sends one must apply "
                 "it on the trainer's side too",
}
TRAPS = (
    Trap(("temperature_mismatch", "temperature"), "--recompute-logprobs-via-prefill re-scores the rollout at "
                                                  "temperature 0 while the trainer divides by --rollout-temperature "
                                                  "(the fix, PR #1345, is not merged at 31f1ca96)",
         "miles/rollout/generate_utils/prefill_logprobs.py:41"),
    Trap(("temperature_mismatch", "temperature"), "--rollout-temperature 0 is not refused: SGLang samples greedily "
                                                  "and the trainer skips the division, scoring at T = 1",
         "miles/backends/training_utils/loss_hub/logit_processors.py:55"),
    Trap(("truncation", "processed_logprobs"), "--rollout-top-p / --rollout-top-k go to SGLang but are never "
                                                "replayed: the trainer scores the full softmax",
         "miles/rollout/inference_rollout/inference_rollout_common.py:45"),
    Trap(("correction",), "a custom TIS function runs only with --use-tis or --get-mismatch-metrics, and "
                          "--get-mismatch-metrics then changes the loss too (IcePop, or a use_tis: true YAML)",
         f"{LOSSES}:230"),
    Trap(("correction",), "--custom-tis-function-path takes a dotted module path (its help shows path:function)",
         "miles/utils/misc.py:58"),
    Trap(("correction",), "--tis-clip-low above --tis-clip is not refused: every TIS weight becomes tis-clip, "
                          "and IcePop zeroes every weight", "miles/backends/training_utils/loss_hub/corrections.py:53"),
    Trap(("correction", "policy_version"), "async GRPO (no critic) runs with no correction and no warning: the "
                                           "check for one applies only with a critic", f"{ARGS}:3601"),
    Trap(("policy_version",), "--max-weight-staleness acts only in fully-async mode (train_async.py alone ignores "
                              "it)", "miles/rollout/fully_async_data_buffer.py:158"),
)
MIS_TRAPS = (
    Trap(("correction", "rollout_logprobs"), "the --use-tis / --use-rollout-logprobs check runs before the YAML "
                                             "is applied: use_tis: true with --use-rollout-logprobs is not refused",
         f"{ARGS}:3480"),
    Trap(("correction",), "rs_veto_threshold acts only inside use_rs", f"{MIS_DIR}/mis.py:260"),
    Trap(("correction",), "write YAML floats with a dot (1.0e-4): PyYAML reads 1e-4 as a string",
         f"{MIS_DIR}/mis.yaml:34"),
)

SYNTAX = "argparse flags (a slime fork; SGLang's server flags as --sglang-<flag>)"
FIXES_BY_FAMILY = {
    "miles": Fixes(TRAINER, SYNTAX, _settings(False), MISSING, TRAPS, hook_correction(ICEPOP), hook_native,
                   context_fields=CONTEXT),
    "miles-mis": Fixes(TRAINER, f"{SYNTAX}; the MIS helper's knobs are YAML keys of the file --custom-config-path "
                                "names, not flags", _settings(True), MISSING, (*MIS_TRAPS, *TRAPS), mis_correction,
                       mis_native(MIS_FUNCTIONS[0]), context_fields=CONTEXT),
}
FIXES = FIXES_BY_FAMILY["miles"]

__all__ = ["FIXES", "FIXES_BY_FAMILY"]
