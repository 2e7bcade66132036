"""slime's train/rollout mismatch keys (`--semantics slime` and `slime-mis`), exactly as slime logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE, CLOSER_TO_1, LOWER_ABS = Direction.LOWER, Direction.NONE, Direction.CLOSER_TO_1, Direction.LOWER_ABS

FAMILY = Family("slime train/rollout mismatch (slime 624b824a)",
                "`--semantics slime` (the policy loss's TIS / IcePop hook) or `--semantics slime-mis` (the MIS helper "
                "of examples/train_infer_mismatch_helper); keys exactly as slime logs them")

_AT = "@ slime 624b824a"
LOSS = f"slime/backends/megatron_utils/loss.py:policy_loss_function {_AT}"
HOOK = f"slime/backends/megatron_utils/loss.py:vanilla_tis_function / icepop_function {_AT}"
PPL = f"examples/train_infer_mismatch_helper/mis.py:add_ppl_metrics {_AT}"
WEIGHTS = f"examples/train_infer_mismatch_helper/mis.py:compute_mis_weights {_AT}"
TOKEN = ("per sample: mean over its loss-mask tokens; then sum over samples / samples in the step "
         "(calculate_per_token_loss: over all tokens of the step)")
SAMPLE = ("a per-sample value spread over the sample's tokens, then per sample the mean over its tokens, sum over "
          "samples / samples in the step (an empty sample counts 0)")


def _metrics() -> list[Metric]:
    def metric(key, reduction, unit, direction, meaning, source):
        return Metric(key, FAMILY, reduction, unit, direction, f"{meaning}; source: {source}")

    mis = "train/mis_"
    out = [
        metric("train/train_rollout_logprob_abs_diff", TOKEN, "nats", LOWER,
               "|old − rollout| (slime-mis: over the tokens the helper's rejection keeps, the denominator still "
               "every loss-mask token)", LOSS),
        metric("train/ois", TOKEN, "ratio", CLOSER_TO_1, "exp(current − old): needs the policy's log-probs at the "
               "loss step, which a dump lacks (null with a note)", LOSS),
        metric("train/tis", TOKEN, "ratio", CLOSER_TO_1, "exp(old − rollout), unclamped (inf on overflow)", HOOK),
        metric("train/tis_clipfrac", TOKEN, "fraction", LOWER, "share of tokens whose weight differs from the raw "
               "ratio (vanilla: clamped to [tis_clip_low, tis_clip]; icepop: zeroed outside it; NaN counts)", HOOK),
        metric("train/tis_abs", TOKEN, "ratio", LOWER, "|exp(old − rollout) − 1|", HOOK),
        metric(mis + "training_log_ppl", SAMPLE, "nats", NONE, "−mean old log-prob of the sample", PPL),
        metric(mis + "training_ppl", SAMPLE, "ppl", NONE, "exp(−mean old log-prob) of the sample", PPL),
        metric(mis + "rollout_log_ppl", SAMPLE, "nats", NONE, "−mean rollout log-prob of the sample", PPL),
        metric(mis + "rollout_ppl", SAMPLE, "ppl", NONE, "exp(−mean rollout log-prob) of the sample", PPL),
        metric(mis + "kl", TOKEN, "nats", LOWER_ABS, "rollout − old per token (direct KL(rollout ‖ train) estimate)",
               PPL),
        metric(mis + "k3_kl", TOKEN, "nats", LOWER, "exp(d) − d − 1 with d = old − rollout, unclamped", PPL),
        metric(mis + "log_ppl_diff", SAMPLE, "nats", LOWER_ABS, "mean rollout − mean old log-prob of the sample",
               PPL),
        metric(mis + "log_ppl_abs_diff", SAMPLE, "nats", LOWER, "|mean rollout − mean old log-prob| of the sample",
               PPL),
        metric(mis + "ppl_ratio", SAMPLE, "ratio", CLOSER_TO_1, "exp(mean rollout − mean old log-prob)", PPL),
        metric(mis + "chi2_token", SAMPLE, "ratio", LOWER, "the sample's mean of exp(clamp(d, ±20))² − 1", PPL),
        metric(mis + "chi2_seq", SAMPLE, "ratio", LOWER, "exp(2·clamp(Σd, ±20)) − 1 of the sample", PPL),
        metric(mis + "tis_weight_before_bound", TOKEN, "ratio", CLOSER_TO_1,
               "exp(clamp(log-ratio at tis_level, ±20)) before the bound", WEIGHTS),
        metric(mis + "tis_weight_after_bound", TOKEN, "ratio", CLOSER_TO_1, "the weight after tis_mode's bound",
               WEIGHTS),
        metric(mis + "is_ratio_mean_after_tis_rs", TOKEN, "ratio", CLOSER_TO_1,
               "the weight after the bound (the same numbers as tis_weight_after_bound)", WEIGHTS),
        metric(mis + "tis_truncate_fraction", TOKEN, "fraction", LOWER, "share of weights above tis_upper_bound "
               "(tis_mode truncate)", WEIGHTS),
    ]
    for mode in ("clip", "mask"):
        for side, word in (("low", "below tis_lower_bound"), ("high", "above tis_upper_bound")):
            out.append(metric(f"{mis}tis_{mode}_fraction_{side}", TOKEN, "fraction", LOWER,
                              f"share of weights {word} (tis_mode {mode})", WEIGHTS))
    for side, word in (("low", "below rs_lower_bound"), ("high", "above rs_upper_bound")):
        out.append(metric(f"{mis}rs_mask_fraction_{side}", TOKEN, "fraction", LOWER,
                          f"share of rejection weights (exp(clamp(log-ratio at rs_level, ±20))) {word}", WEIGHTS))
    out += [
        metric(mis + "rs_catastrophic_token_fraction", TOKEN, "fraction", LOWER,
               "share of tokens with old − rollout < log(rs_veto_threshold)", WEIGHTS),
        metric(mis + "rs_catastrophic_seq_fraction", SAMPLE, "fraction", LOWER,
               "share of samples with a catastrophic token (vetoed)", WEIGHTS),
        metric(mis + "batch_norm_factor", SAMPLE, "ratio", CLOSER_TO_1, "the batch mean weight the final weights "
               "are divided by (tis_batch_normalize; 1 when ≤ 1e-8 or NaN)", WEIGHTS),
        metric(mis + "is_ratio_mean_final", SAMPLE, "ratio", CLOSER_TO_1, "the sample's mean final weight",
               WEIGHTS),
        metric(mis + "is_ratio_min_final", SAMPLE, "ratio", NONE, "the sample's smallest final weight", WEIGHTS),
        metric(mis + "is_ratio_max_final", SAMPLE, "ratio", NONE, "the sample's largest final weight", WEIGHTS),
    ]
    return out


METRICS = tuple(_metrics())
