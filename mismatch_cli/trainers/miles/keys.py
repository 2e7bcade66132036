"""Miles's own train/rollout mismatch keys (`--semantics miles` and `miles-mis`), exactly as Miles logs them.

Miles also logs every key of slime's families (`train/tis`, `train/mis_*`, `train/train_rollout_logprob_abs_diff`,
`train/ois`), computed by the same functions; those keep their one entry in `trainers/slime/keys.py`. Here
are the two keys Miles's policy loss adds.
"""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

FAMILY = Family("Miles train/rollout mismatch (Miles 31f1ca96)",
                "`--semantics miles` (the policy loss's TIS / IcePop hook) or `--semantics miles-mis` (the MIS "
                "helper); Miles logs slime's keys too (listed under slime) and these two of its own")

_AT = "@ Miles 31f1ca96"
LOSS = f"miles/backends/training_utils/loss_hub/losses.py:policy_loss_function {_AT}"
MATH = "miles/backends/training_utils/loss_hub/math_utils.py"
TOKEN = ("per sample: mean over its loss-mask tokens (numerator over the tokens the MIS helper keeps); then sum over "
         "samples / samples in the step (calculate_per_token_loss: over all tokens of the step)")

METRICS = (
    Metric("train/train_rollout_kl", FAMILY, TOKEN, "nats", Direction.LOWER,
           "KL(rollout ‖ train) by k3 per token: exp(d) − 1 − d with d = old − rollout in float32 (NaN → 0, ±inf → "
           "±20), clamped to ±20 before exp and to ±10 after; source: "
           f"{LOSS} with {MATH}:compute_approx_kl (low_var_kl) {_AT}"),
    Metric("train/ess_ratio", FAMILY, "per sample (Σw)² / (n·max(Σw², 1e-8)), summed / samples in the step "
           "(per token: weighted by n)", "ratio", Direction.HIGHER,
           "effective sample size ratio of w = exp(clamp(current − old, ±20)): needs the policy's log-probs at the "
           f"loss step, which a dump lacks (null with a note); source: {MATH}:compute_ess_ratio_contribution {_AT}"),
)
