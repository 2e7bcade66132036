"""NeMo-RL's mismatch metrics of `ClippedPGLossFn` (`--semantics nemo-rl`), exactly as NeMo-RL logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, CLOSER_TO_1 = Direction.LOWER, Direction.CLOSER_TO_1

FAMILY = Family("NeMo-RL ClippedPGLossFn mismatch metrics (NeMo-RL 7ea279ab)",
                "`--semantics nemo-rl` (keys exactly as ClippedPGLossFn returns them; is_oob_ratio only with "
                "truncated_importance_sampling_type set)")

SOURCE = ("NeMo-RL 7ea279ab nemo_rl/algorithms/loss/loss_functions.py:ClippedPGLossFn.__call__, with "
          "nemo_rl/algorithms/utils.py:masked_mean and calculate_kl")
_TOKENS = ("sum over the masked-in tokens / the global batch's token count (one global batch, one micro-batch); "
           "NaN or inf when a token's log-prob is")


def _metrics() -> list[Metric]:
    return [
        Metric("token_mult_prob_error", FAMILY, f"token-mean: {_TOKENS}", "ratio", CLOSER_TO_1,
               f"exp(|rollout − old|) per token: the multiplicative probability error, 1 when they agree; "
               f"source: {SOURCE}"),
        Metric("gen_kl_error", FAMILY, f"token-mean: {_TOKENS}", "nats", LOWER,
               "KL(rollout ‖ train) estimated per token by reference_policy_kl_type (k3: exp(d) − 1 − d with "
               f"d = old − rollout), no clamp; source: {SOURCE}"),
        Metric("policy_kl_error", FAMILY, f"token-mean: {_TOKENS}", "nats", LOWER,
               "KL(train ‖ rollout) estimated per token by reference_policy_kl_type on −d, no clamp; "
               f"source: {SOURCE}"),
        Metric("js_divergence_error", FAMILY, f"token-mean: {_TOKENS}", "nats", LOWER,
               f"Jensen-Shannon divergence per token against the mixture of the two probabilities; source: {SOURCE}"),
        Metric("sampling_importance_ratio", FAMILY,
               "token level: token-mean of the weights; sequence level: the SUM of the row weights (a [B, 1] "
               "weight broadcast against the [B] sample mask counts each weight B times, then / B)", "ratio",
               CLOSER_TO_1, "the importance weight exp(d) per token (or exp of the row's sum of d), non-finite -> 0, "
               f"after truncation (tis, icepop, seq-mask-tis); computed whether or not the loss uses it; "
               f"source: {SOURCE}"),
        Metric("is_oob_ratio", FAMILY, "float32 fraction: of tokens (tis / icepop at token level), of tokens "
               "weighted by their row (tis / icepop at sequence level) or of rows (seq-mask-tis)", "fraction", LOWER,
               f"the share of weights outside the truncation bounds; only with truncated_importance_sampling_type; "
               f"source: {SOURCE}"),
    ]


METRICS = tuple(_metrics())
