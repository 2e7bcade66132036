"""prime-rl's trainer-side mismatch keys (`--semantics prime-rl`), exactly as its trainer logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE = Direction.LOWER, Direction.NONE

FAMILY = Family("prime-rl RL loss (commit 559b447)",
                "`--semantics prime-rl` (keys exactly as prime-rl's trainer logs them after its W&B filter)")

_COMMIT = "@ 559b44772e471d1538537b8805cc77f3824a5e64"
_ALL_SOURCE = (f"src/prime_rl/trainer/rl/train.py:train (mismatch_kl/all) and "
               f"src/prime_rl/trainer/utils.py:Tensors.compute_stats {_COMMIT}")
_LOSS_SOURCE = (f"src/prime_rl/trainer/rl/loss.py:default_loss_fn / ipo_loss_fn via compute_loss, reduced by "
                f"src/prime_rl/trainer/utils.py:Tensors.compute_stats {_COMMIT}")
_KL = "mismatch_kl = exp(d) − d − 1 with d = old − rollout, unclamped"
_SAMPLES = "over samples (dump rows, empty ones giving 0) of each sample's {what}; one step, one process"
_ADV = " (default loss: needs per-token advantages)"


def _metrics() -> list[Metric]:
    tokens = "over every loss-mask token (NaN included); NaN without a token, std NaN for one token"
    out = [
        Metric("mismatch_kl/all/mean", FAMILY, f"token-mean {tokens}", "nats", LOWER,
               f"{_KL}: the k3 estimate of KL(rollout ‖ trainer); source: {_ALL_SOURCE}"),
        Metric("mismatch_kl/all/std", FAMILY, f"unbiased token std {tokens}", "nats", NONE,
               f"the spread of {_KL}; source: {_ALL_SOURCE}"),
        Metric("mismatch_kl/all/max", FAMILY, f"token max {tokens}", "nats", LOWER,
               f"the largest {_KL}; source: {_ALL_SOURCE}"),
    ]
    per_sample = {
        "masked_mismatch_kl": ("mismatch_kl mean over its masked (trust-region) tokens, 0 without one", "nats",
                               LOWER, "mismatch_kl of the tokens the trust region drops from the policy gradient"),
        "unmasked_mismatch_kl": ("mismatch_kl mean over its kept tokens, 0 without one", "nats", LOWER,
                                 "mismatch_kl of the tokens the policy gradient keeps"),
        "is_masked": ("share of its tokens masked (float32)", "fraction", LOWER,
                      "tokens masked: default loss, Δp = exp(old) − exp(rollout) > dppo_mask_high where the "
                      "advantage is positive, else Δp < −dppo_mask_low; ipo, |Δp| > ipo_threshold"),
        "is_masked_low": ("share of its tokens with advantage < 0 and Δp < −dppo_mask_low (float32)", "fraction",
                          LOWER, "tokens masked on the low side (default loss only)"),
        "is_masked_high": ("share of its tokens with advantage > 0 and Δp > dppo_mask_high (float32)", "fraction",
                           LOWER, "tokens masked on the high side (default loss only)"),
        "masked_advantage_positive": ("share of its masked tokens with advantage > 0, 0 without one (float32)",
                                      "fraction", NONE, "the masked tokens' advantage sign (default loss only)"),
        "masked_advantage_negative": ("share of its masked tokens with advantage < 0, 0 without one (float32)",
                                      "fraction", NONE, "the masked tokens' advantage sign (default loss only)"),
    }
    for key, (what, unit, direction, meaning) in per_sample.items():
        for stat, word in (("mean", "mean"), ("max", "max")):
            out.append(Metric(f"{key}/{stat}", FAMILY, f"{word} " + _SAMPLES.format(what=what), unit,
                              direction if stat == "mean" else NONE, f"{meaning}{_ADV}; source: {_LOSS_SOURCE}",
                              removes="tokens" if (key, stat) == ("is_masked", "mean") else ""))
    return out


METRICS = tuple(_metrics())
