"""AReaL 1.0.4's vocabulary of fixes: Hydra compose overrides of its `PPOConfig` dataclasses (`areal/api/cli_args.py`).

Lines read from the PyPI wheel areal-1.0.4, which is NOT git tag v1.0.4 (37d6c640): the wheel was built from later
main (its cli_args.py is commit 4aef98d8's), so each source names the wheel's line and the tag's. The example YAML
`examples/math/gsm8k_grpo.yaml` is not in the wheel: its lines are the tag's. Our replay names the settings by
`PPOActorConfig` / `RejectionSamplingConfig`'s own fields (settings.py); `native` writes them as the overrides. The
correction mapping is checked against our replay (engine.py; docs/areal-semantics.md) in
tests/trainers/test_fixes_areal.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mismatch_cli.correction.fixes import Fixes, Setting, Trap, override_value, threshold_bounds

CLI = "areal/api/cli_args.py"
FUNCTIONAL = "areal/utils/functional/functional.py"
RS = "++actor.rejection_sampling."
YAML = "examples/math/gsm8k_grpo.yaml"


def _at(line: int, tag: int, path: str = CLI) -> str:
    """A wheel line, with the same line at git tag v1.0.4."""
    return f"{path}:{line} (AReaL 1.0.4 wheel, tag v1.0.4 line {tag})"


SETTINGS: dict[str, tuple[Setting, ...]] = {
    "temperature": (
        Setting("gconfig.temperature=T actor.temperature=T", f"{_at(194, 193)}; {_at(1098, 1076)}",
                "two independent fields, both 1.0 by default: the engine samples at gconfig's, the trainer divides "
                "its logits by actor's; nothing links them but the example YAML's ${gconfig.temperature}"),
    ),
    "truncation": (
        Setting("++gconfig.top_p=1.0 ++gconfig.top_k=100000000", f"{_at(186, 185)}; {_at(190, 189)}",
                "the defaults, top_k 1e8 being off: the trainer replays neither, and AReaL has no min_p; "
                "++ because gsm8k_grpo.yaml lacks the keys"),
    ),
    "rollout_logprobs": (
        Setting("actor.use_decoupled_loss=true", f"{_at(1549, 1485)}; {_at(186, 186, 'areal/trainer/ppo/actor.py')}",
                "the engine always returns the sampled tokens' log-probs; only the decoupled loss keeps them as "
                "the behaviour side: without it, recompute_logprob=true overwrites them"),
    ),
    "penalties": (
        Setting("++gconfig.frequency_penalty=0.0", _at(216, 215),
                "the default; only the SGLang backend sends it, AReaL has no repetition or presence penalty, and "
                "the trainer replays none"),
    ),
    "precision": (
        Setting("sglang.dtype=bfloat16 vllm.dtype=bfloat16",
                f"{_at(1854, 1780)}; {_at(1698, 1634)}; {_at(1120, 1098)}",
                "the trainer's actor.dtype, as the example interpolates; AReaL 1.0.4 has no fp32 lm_head, "
                "cascade-attention or deterministic-inference setting"),
        Setting("++sglang.triton_attention_reduce_in_fp32=true", _at(1836, 1762),
                "SGLang's triton attention only: sglang.attention_backend=triton, the default being fa3"),
    ),
    "low_precision": (
        Setting("++sglang.kv_cache_dtype=fp8_e4m3", f"{_at(1855, 1781)}; {_at(1702, 1638)}",
                "SGLang only: vLLMConfig's kv-cache field is commented out. No fp8-weight field: an fp8 rollout "
                "serves an fp8 checkpoint"),
    ),
    "correction": (
        Setting(f"actor.use_decoupled_loss=true {RS}level=token {RS}action=clamp {RS}metric=ratio {RS}upper=2.0",
                f"{_at(1555, 1491)}; {_at(1316, 1252)}",
                "token TIS, cap 2: pi_prox / pi_behave, capped at 2, multiplies the loss; only with the decoupled "
                "loss"),
        Setting(f"actor.use_decoupled_loss=true {RS}level=token {RS}action=mask {RS}metric=ratio {RS}lower=0.5 "
                f"{RS}upper=2.0", f"{_at(1372, 1308)}; {_at(1363, 1299)}",
                "IcePop: weight 0 outside [0.5, 2], the loss still divided by every token"),
        Setting(f"actor.use_decoupled_loss=true {RS}level=sequence {RS}agg=mean {RS}action=mask {RS}metric=ratio "
                f"{RS}lower=0.5 {RS}upper=2.0", _at(1316, 1252),
                "drops rows whose geometric-mean ratio is outside the band; kept tokens weigh that mean"),
    ),
    "response_mask": (
        Setting("++actor.mask_no_eos_with_zero=false", f"{_at(1503, 1439)}; {_at(167, 167, 'areal/workflow/rlvr.py')}",
                "the default; true also masks truncated answers. No mask setting: each workflow builds loss_mask, "
                "0 on prompt and tool tokens, 1 on generated ones"),
    ),
    "policy_version": (
        Setting("rollout.max_head_offpolicyness=2", f"{_at(2113, 2034)}; {_at(168, 168, 'areal/workflow/rlvr.py')}",
                "a request more versions behind is refused; every generated token carries its policy version, the "
                "trajectory key versions, -1 on the prompt"),
        Setting("++actor.prox_logp_method=recompute", _at(1571, 1507),
                "the default; loglinear approximates the proximal policy from those versions"),
    ),
}
MISSING = {
    "logprobs_mode": "AReaL 1.0.4 has no logprobs_mode setting (vLLMConfig, cli_args.py:1689 of the wheel, has none "
                     "and passes only its own fields; no logprobs_mode anywhere in the package): use the SGLang "
                     "backend (the example's rollout.backend), whose log-probs follow the temperature, or keep "
                     "gconfig.temperature=1.0 with vLLM, which reports raw, pre-temperature log-probs",
}

TRAPS = (
    Trap(("temperature_mismatch", "temperature"),
         "gconfig.temperature (sampling) and actor.temperature (the trainer's recompute) are separate, both 1.0 by "
         "default: setting only gconfig.temperature leaves the trainer at T=1",
         f"{YAML}:65 (tag v1.0.4, not in the wheel); {_at(1098, 1076)}"),
    Trap(("temperature_mismatch", "logprobs_mode", "ratio_mean"),
         "with the vLLM backend and T != 1 the engine's log-probs are raw (pre-temperature) while the trainer "
         "divides by actor.temperature, and AReaL has no setting to change it",
         _at(62, 61, "areal/engine/vllm_remote.py")),
    Trap(("processed_logprobs", "truncation"),
         "the trainer's log-probs are log_softmax(logits / T) only: top_p / top_k are never replayed",
         "areal/utils/functional/vocab_parallel.py:18 (AReaL 1.0.4 wheel, same line at tag v1.0.4)"),
    Trap(("identical_sides", "rollout_logprobs"),
         "actor.use_decoupled_loss=false with recompute_logprob=true overwrites the engine's log-probs with the "
         "recomputed ones: both sides are the trainer's and nothing can be corrected",
         _at(186, 186, "areal/trainer/ppo/actor.py")),
    Trap(("correction",), "rejection_sampling is ignored (a warning only) unless actor.use_decoupled_loss=true, and "
                          "use_decoupled_loss without rejection_sampling applies no behaviour weight at all",
         f"{_at(1616, 1552)}; {_at(535, 533, FUNCTIONAL)}"),
    Trap(("correction",), "with action=clamp an explicit lower=0.0 is refused (lower must be positive for ratio) "
                          "although leaving it unset gives exactly 0.0", _at(1441, 1377)),
    Trap(("correction",), "Hydra compose runs in struct mode: a key the YAML lacks needs + or ++, one it has must "
                          "not take +; ++ works for both", _at(3038, 2903)),
    Trap(("penalties",), "the vLLM backend drops gconfig.frequency_penalty: its request carries no penalty",
         _at(53, 52, "areal/engine/vllm_remote.py")),
    Trap(("temperature",), "the reference model is its own PPOActorConfig (ref.temperature, 1.0); the example's "
                           "ref block does not follow gconfig.temperature", _at(2978, 2849)),
)


def correction(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """PPOActorConfig / RejectionSamplingConfig fields that compute a what-if ladder row exactly, or None."""
    # apply_rejection_sampling / ppo_actor_loss_fn (engine.py; docs/areal-semantics.md §3), token level, metric
    # ratio: w = exp(l), l = float32(prox) - float32(behave), non-finite l set to 0, no ±20 clamp.
    # TIS U: action=clamp clamps w to [0, U] (lower unset -> 0.0) and multiplies the loss; the mask is unchanged and
    # rs_filtered_fraction counts the tokens the clamp changed (w > U): the ladder's min(r, U) and its truncated
    # share. Weights part only below l = -20 (both under e^-20 = 2.1e-9) and for a non-finite l (AReaL: 1).
    # IcePop [L, U]: action=mask keeps L <= w <= U (bounds kept, as the ladder), the weight of a kept token is w and
    # of a dropped one 0, and the loss divides by the ORIGINAL token count (functional.py:483, "without this, mask
    # mode would inflate per-token gradients"): the ladder's zeroed weight, same denominator, so the same ESS over
    # every token. Upper bounds of the ladder are > 1 and lower ones > 0, as metric=ratio requires.
    # Not exact, hence None: at sequence level the weight is always the geometric mean exp(mean l) (TIS and IcePop
    # weigh exp(sum l)); the RS rows and the veto apply no weight to the kept tokens, but every AReaL filter also
    # multiplies the loss by its weight, and AReaL's row filters are ratio / k1 / k2 / k3 with agg sum / mean / max
    # (no min, so no veto); "none" (rejection_sampling unset logs nothing).
    family, level, threshold = row.get("family"), row.get("level"), row.get("threshold")
    if level != "token" or threshold is None:
        return None
    lower, upper = threshold_bounds(str(threshold))
    base = {"use_decoupled_loss": True, "level": "token", "metric": "ratio"}
    if family == "tis" and lower is None:
        return {**base, "action": "clamp", "upper": upper}
    if family == "icepop" and lower is not None:
        return {**base, "action": "mask", "lower": lower, "upper": upper}
    return None


def native(fields: Mapping[str, Any]) -> str:
    """Our AReaL fields as the Hydra overrides a user passes (`actor.…`, `++actor.rejection_sampling.…`)."""
    parts = []
    if "use_decoupled_loss" in fields:
        parts.append(f"actor.use_decoupled_loss={override_value(bool(fields['use_decoupled_loss']))}")
    section = {k: v for k, v in fields.items() if k not in ("use_decoupled_loss", "rejection_sampling")}
    switch = fields.get("rejection_sampling")
    if switch is False or (switch is None and "rejection_sampling" in fields):
        parts.append("++actor.rejection_sampling=null")
    elif switch and not section:
        parts.append(f"{RS}level=token")  # one key creates the section, the others at their defaults
    parts += [f"{RS}{name}={override_value(value)}" for name, value in section.items()]
    return " ".join(parts)


FIXES = Fixes(
    "AReaL 1.0.4",
    "Hydra compose overrides: python3 examples/math/gsm8k_rl.py --config examples/math/gsm8k_grpo.yaml key=value "
    "(a key the YAML lacks needs + or ++; ++ is safe either way)",
    SETTINGS, MISSING, TRAPS, correction=correction, native=native)

__all__ = ["FIXES", "correction", "native"]
