"""OpenRLHF 0.11.2's train/rollout mismatch keys (`--semantics openrlhf`), exactly as its loggers write them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE = Direction.LOWER, Direction.NONE

FAMILY = Family("OpenRLHF train/rollout mismatch correction (OpenRLHF 0.11.2)",
                "`--semantics openrlhf` with is_correction_level token or seq (keys as OpenRLHF's W&B / TensorBoard "
                "loggers write them)")

SOURCE = ("OpenRLHF 0.11.2 openrlhf/models/loss.py:PolicyLoss.forward, per micro-batch; reduced by "
          "openrlhf/trainer/ray/ppo_actor.py:PolicyActor.ppo_train")
REDUCTION = ("per micro-batch (micro_train_batch_size rows, dump order; float32), then mean over micro-batches "
             "weighted by their token counts")

METRICS = (
    Metric("train/vllm_kl", FAMILY, f"{REDUCTION}: a global token mean", "nats", NONE,
           "token mean of rollout − old log-prob over masked-in tokens: the k1 estimate of KL(rollout ‖ trainer), "
           f"signed, unclamped; source: {SOURCE}"),
    Metric("train/is_filter_ratio", FAMILY, REDUCTION, "fraction", LOWER,
           "share of units the gate filters: token level, the share of masked-in tokens whose statistic (ratio "
           "exp(old − rollout), or binary_kl / tv) is outside is_correction_threshold; seq level, the share of rows "
           "(empty rows included) whose mean statistic (the ratio's geometric mean) is outside it; mask mode counts "
           f"NaN as outside, clip mode does not; source: {SOURCE}"),
)
