"""verl's vocabulary of fixes, per release (0.9.1 … 0.6.0): Hydra overrides of its PPO trainer's config.

Lines read from each release's PyPI wheel (`verl/trainer/config/rollout/rollout.yaml`, `…/algorithm/
rollout_correction.yaml`, `…/ppo_trainer.yaml`). The correction itself (IS, RS, presets) is the
correction model's (answers/recommend.py maps the what-if ladder onto these fields); `native` writes a chosen
setting as the overrides a verl user pastes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap

ROLLOUT = "actor_rollout_ref.rollout"
CORRECTION = "algorithm.rollout_correction"
YAML = "verl/trainer/config/rollout/rollout.yaml"
HELPER = "verl/trainer/ppo/rollout_corr_helper.py"

# rollout.yaml's line of each field, per release (None: the release has no such field).
LINES: dict[str, dict[str, int | None]] = {
    "0.9.1": {"temperature": 17, "top_k": 20, "top_p": 23, "full_determinism": 27, "dtype": 43, "logprobs_mode": 93,
              "vllm": 142, "sglang": 145, "calculate_log_probs": 237, "quantization": 473},
    "0.8.0": {"temperature": 17, "top_k": 20, "top_p": 23, "full_determinism": None, "dtype": 35, "logprobs_mode": 85,
              "vllm": 134, "sglang": 137, "calculate_log_probs": 225, "quantization": 447},
    "0.7.1": {"temperature": 17, "top_k": 20, "top_p": 23, "full_determinism": None, "dtype": 35, "logprobs_mode": 83,
              "vllm": 129, "sglang": 132, "calculate_log_probs": 212, "quantization": 394},
    "0.7.0": {"temperature": 11, "top_k": 14, "top_p": 17, "full_determinism": None, "dtype": 29, "logprobs_mode": 77,
              "vllm": 120, "sglang": 123, "calculate_log_probs": 200, "quantization": 332},
    "0.6.1": {"temperature": 11, "top_k": 14, "top_p": 17, "full_determinism": None, "dtype": 29, "logprobs_mode": None,
              "vllm": 117, "sglang": 120, "calculate_log_probs": 197, "quantization": None},
    "0.6.0": {"temperature": 11, "top_k": 14, "top_p": 17, "full_determinism": None, "dtype": 29, "logprobs_mode": None,
              "vllm": 117, "sglang": 120, "calculate_log_probs": 197, "quantization": None},
}
# Where a token TIS cap is set, per release: (its overrides, file:line of the level field).
TOKEN_TIS: dict[str, tuple[str, str]] = {
    "0.9.1": (f"{CORRECTION}.rollout_is=token {CORRECTION}.rollout_is_threshold=2.0",
              "verl/trainer/config/algorithm/rollout_correction.yaml:6"),
    "0.8.0": (f"{CORRECTION}.rollout_is=token {CORRECTION}.rollout_is_threshold=2.0",
              "verl/trainer/config/algorithm/rollout_correction.yaml:6"),
    "0.7.1": (f"{CORRECTION}.rollout_is=token {CORRECTION}.rollout_is_threshold=2.0",
              "verl/trainer/config/algorithm/rollout_correction.yaml:6"),
    "0.7.0": (f"{CORRECTION}.rollout_is=token {CORRECTION}.rollout_is_threshold=2.0",
              "verl/trainer/config/algorithm/rollout_correction.yaml:6"),
    "0.6.1": (f"{CORRECTION}.rollout_is=token {CORRECTION}.rollout_is_threshold=2.0",
              "verl/trainer/config/algorithm/rollout_correction.yaml:6"),
    "0.6.0": ("algorithm.rollout_is=true algorithm.rollout_is_level=token algorithm.rollout_is_mode=truncate "
              "algorithm.rollout_is_threshold=2.0 algorithm.rollout_is_veto_threshold=null",
              "verl/trainer/config/ppo_trainer.yaml:119"),
}
FAMILY_RELEASE = {"verl": "0.9.1", "verl-0.8": "0.8.0", "verl-0.7.1": "0.7.1", "verl-0.7.0": "0.7.0",
                  "verl-0.6.1": "0.6.1", "verl-0.6.0": "0.6.0"}


def _at(release: str, field: str) -> str:
    return f"{YAML}:{LINES[release][field]}"


def _settings(release: str) -> dict[str, tuple[Setting, ...]]:
    lines = LINES[release]
    precision = [Setting(f"+{ROLLOUT}.engine_kwargs.vllm.disable_cascade_attn=True", _at(release, "vllm"),
                         "vLLM; the + adds the key to engine_kwargs.vllm, which starts empty")]
    if lines["full_determinism"]:
        precision.append(Setting(f"{ROLLOUT}.full_determinism=True", _at(release, "full_determinism"),
                                 "batch-invariant vLLM kernels, VLLM_BATCH_INVARIANT=1"))
    precision += [
        Setting(f"+{ROLLOUT}.engine_kwargs.sglang.enable_fp32_lm_head=True", _at(release, "sglang"),
                "SGLang: the lm_head in fp32"),
        Setting(f"{ROLLOUT}.dtype=bfloat16", _at(release, "dtype"), "the same dtype as the trainer's compute"),
    ]
    low = [Setting(f"{ROLLOUT}.quantization=fp8", _at(release, "quantization"), "fp8 weights")] \
        if lines["quantization"] else []
    low.append(Setting(f"+{ROLLOUT}.engine_kwargs.vllm.kv_cache_dtype=fp8", _at(release, "vllm"), "fp8 KV cache"))
    mode = (Setting(f"{ROLLOUT}.logprobs_mode=processed_logprobs", _at(release, "logprobs_mode"),
                    "vLLM only: log-probs after the temperature, which the trainer divides by too")
            if lines["logprobs_mode"] else
            Setting(f"+{ROLLOUT}.engine_kwargs.vllm.logprobs_mode=processed_logprobs", _at(release, "vllm"),
                    f"verl {release} has no logprobs_mode field; vLLM takes it through engine_kwargs"))
    tis, tis_source = TOKEN_TIS[release]
    return {
        "temperature": (Setting(f"{ROLLOUT}.temperature=T", _at(release, "temperature"),
                                "one field: the engine samples at T and the trainer divides its logits by T"),),
        "truncation": (Setting(f"{ROLLOUT}.top_p=1.0 {ROLLOUT}.top_k=-1", _at(release, "top_p"),
                               "the trainer replays neither, so training rollouts must not truncate"),),
        "logprobs_mode": (mode,),
        "rollout_logprobs": (Setting(f"{ROLLOUT}.calculate_log_probs=True", _at(release, "calculate_log_probs"),
                                     "" if release == "0.9.1" else f"off by default in verl {release}"),),
        "precision": tuple(precision),
        "low_precision": tuple(low),
        "correction": (Setting(tis, tis_source, "token-level TIS, cap 2"),),
        **({"policy_version": (Setting("trainer.v1.sampler.max_off_policy_threshold=8",
                                       "verl/trainer/config/ppo_trainer.yaml:298",
                                       "the V1 trainer tags each trajectory with its min and max global step"),)}
           if release == "0.9.1" else {}),
    }


TRAPS = (
    Trap(("processed_logprobs", "truncation"),
         "verl reports processed log-probs by default and replays only the temperature, never top_p / top_k",
         f"{YAML}:93"),
    Trap(("rollout_logprobs", "constant_fill", "identical_sides"),
         "up to 0.8.0 calculate_log_probs is off by default, and rollout_correction then does nothing, silently",
         f"{YAML}:225 (verl 0.8.0)"),
    Trap(("correction",), "Hydra reads an unquoted band such as rollout_is_threshold=0.5_5 as the number 0.55: "
                          "quote it, rollout_is_threshold=\"'0.5_5.0'\"", f"{HELPER}:98"),
    Trap(("correction",), "a *_k1 RS band is on pi_rollout / pi_train: 0.5_5.0 keeps pi_train / pi_rollout in "
                          "[0.2, 2.0] (symmetric bands are unaffected)", f"{HELPER}:316"),
    Trap(("correction",), "under the default V1 trainer, bypass_mode=true ignores rollout_is, rollout_rs and "
                          "loss_type", "verl/trainer/ppo/v1/trainer_base.py:1642"),
    Trap(("penalties",), "repetition_penalty is a dead field: the agent loops send 1.0 on every request",
         "verl/trainer/ppo/v1/agent_loop_tq.py:68"),
)
MISSING = {
    "penalties": "verl sends repetition_penalty=1.0 and no other penalty or logit bias; a custom agent loop "
                 "that sends one must apply it on both sides",
    "response_mask": "no setting builds it: verl's agent loop splits the prompt from the response, so prompt "
                     "tokens never enter response_mask, and tool or observation tokens get 0 "
                     "(verl/experimental/agent_loop/agent_loop.py:578 in 0.9.1); a mask that covers the prompt "
                     "comes from the code that wrote the dump",
}
OLD_MISSING = {**MISSING, "policy_version": "no setting bounds a sample's policy lag before verl 0.9.1, whose V1 "
                                             "sampler added trainer.v1.sampler.max_off_policy_threshold"}


def native(fields: Mapping[str, Any]) -> str:
    """verl correction fields as the overrides a user passes (`algorithm.rollout_correction.…`)."""
    if "rollout_is_level" in fields:  # verl 0.6.0's algorithm.rollout_is_* fields
        return " ".join(f"algorithm.{k}={_value(v)}" for k, v in fields.items())
    return " ".join(f"{CORRECTION}.{k}={_value(v)}" for k, v in fields.items())


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    return f"\"'{text}'\"" if "_" in text and text.replace("_", "").replace(".", "").isdigit() else text


FIXES_BY_FAMILY = {
    family: Fixes(f"verl {release}", "Hydra overrides (key=value; +key=value adds a key the YAML lacks)",
                  _settings(release), MISSING if release == "0.9.1" else OLD_MISSING, TRAPS, native=native)
    for family, release in FAMILY_RELEASE.items()
}
FIXES = FIXES_BY_FAMILY["verl"]

__all__ = ["FIXES", "FIXES_BY_FAMILY", "native"]
