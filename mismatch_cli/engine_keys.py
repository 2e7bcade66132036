"""What each verl off-policy key means (shared by renderers; no torch import)."""

from __future__ import annotations

OFFPOLICY_DESCRIPTIONS = {
    "kl": "token-mean (rollout - old): k1 KL(rollout || train)",
    "k3_kl": "token-mean exp(d) - d - 1, d = old - rollout (unclamped)",
    "chi2_token": "token-mean ratio^2 - 1 (ratio clamped at exp(+-20))",
    "chi2_seq": "sequence-mean (prod ratio)^2 - 1, all rows",
    "training_ppl": "sequence-mean exp(-token-mean old log-prob)",
    "rollout_ppl": "sequence-mean exp(-token-mean rollout log-prob)",
    "training_log_ppl": "sequence-mean of -token-mean old log-prob",
    "rollout_log_ppl": "sequence-mean of -token-mean rollout log-prob",
    "log_ppl_diff": "sequence-mean (rollout - old) token-means",
    "log_ppl_abs_diff": "sequence-mean |rollout - old| token-means",
    "log_ppl_diff_max": "max over rows of the above",
    "log_ppl_diff_min": "min over rows of the above",
    "ppl_ratio": "sequence-mean training PPL / rollout PPL",
}
