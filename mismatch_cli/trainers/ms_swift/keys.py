"""ms-swift 4.6.0's rollout off-policy keys (`--semantics ms-swift`), exactly as ms-swift logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE, CLOSER_TO_1, HIGHER = Direction.LOWER, Direction.NONE, Direction.CLOSER_TO_1, Direction.HIGHER

FAMILY = Family("ms-swift rollout importance sampling (ms-swift 4.6.0)",
                "`--semantics ms-swift` with rollout_importance_sampling_mode set or "
                "log_rollout_offpolicy_metrics=true (keys exactly as ms-swift logs them)")

SOURCE = "ms-swift 4.6.0 swift/rlhf_trainers/grpo_trainer.py:GRPOTrainer"
DIAG = f"{SOURCE}._compute_rollout_offpolicy_metrics"
IS = f"{SOURCE}._compute_is_correction_metrics"
MICRO = "per micro-batch (per_device_train_batch_size rows, dump order), then mean over micro-batches"
TOKEN = f"token mean {MICRO}"
ROW = f"row mean {MICRO}"
D = "d = old − rollout per token"


def _metric(key: str, reduction: str, unit: str, direction: Direction, meaning: str, source: str) -> Metric:
    return Metric("rollout_correction/" + key, FAMILY, reduction, unit, direction, f"{meaning}; source: {source}")


def _metrics() -> list[Metric]:
    return [
        _metric("training_ppl", ROW, "perplexity", NONE, "exp(−row mean of the old log-probs)", DIAG),
        _metric("training_log_ppl", ROW, "nats", NONE, "−row mean of the old log-probs", DIAG),
        _metric("kl", TOKEN, "nats", LOWER, f"k1: mean of −d ({D}, unclamped)", DIAG),
        _metric("k3_kl", TOKEN, "nats", LOWER, "k3: exp(d) − d − 1 with d clamped to [-20, 20], the term clamped "
                                               "to [-10, 10]", DIAG),
        _metric("rollout_ppl", ROW, "perplexity", NONE, "exp(−row mean of the rollout log-probs)", DIAG),
        _metric("rollout_log_ppl", ROW, "nats", NONE, "−row mean of the rollout log-probs", DIAG),
        _metric("log_ppl_diff", ROW, "nats", NONE, "row mean rollout log-prob − row mean old log-prob "
                                                   "(an empty row counts 0)", DIAG),
        _metric("log_ppl_abs_diff", ROW, "nats", LOWER, "|log_ppl_diff| per row", DIAG),
        _metric("log_ppl_diff_max", "max over a micro-batch's rows, then mean over micro-batches", "nats", NONE,
                "largest per-row log_ppl_diff (an empty row counts 0)", DIAG),
        _metric("log_ppl_diff_min", "min over a micro-batch's rows, then mean over micro-batches", "nats", NONE,
                "smallest per-row log_ppl_diff (an empty row counts 0)", DIAG),
        _metric("ppl_ratio", ROW, "ratio", CLOSER_TO_1, "exp(log_ppl_diff) per row, unclamped", DIAG),
        _metric("chi2_token", TOKEN, "ratio", LOWER, "mean of exp(d)² − 1, d clamped to [-20, 20]", DIAG),
        _metric("chi2_seq", ROW, "ratio", LOWER, "mean over rows of (geometric-mean ratio)² − 1: exp(row mean of d, "
                                                 "clamped to [-20, 20])² (not the product its docstring names)", DIAG),
        _metric("is_weight_mean", TOKEN, "ratio", CLOSER_TO_1, "mean of the mode's weights (truncated or masked "
                                                               "token / sequence ratios)", IS),
        _metric("ess", "per micro-batch, then mean over micro-batches", "fraction", HIGHER,
                "1 / mean((w / mean w)²) with the weights clamped to [1/threshold, threshold]", IS),
        _metric("clipped_frac", f"token or row share {MICRO}", "fraction", LOWER,
                "token modes: share of tokens above the threshold (token_mask: weight 0); sequence modes: share of "
                "rows whose geometric-mean ratio exceeds it", IS),
    ]


METRICS = tuple(_metrics())
