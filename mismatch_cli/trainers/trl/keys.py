"""TRL 1.16.0's five `sampling/*` keys (`--semantics trl`), exactly as TRL logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE, CLOSER_TO_1 = Direction.LOWER, Direction.NONE, Direction.CLOSER_TO_1

FAMILY = Family("TRL vLLM importance sampling (TRL 1.16.0)",
                "`--semantics trl`, unless `vllm_importance_sampling_correction=false` (keys exactly as TRL logs them)")

TRL_BLOCKS = ("TRL 1.16.0 trl/trainer/grpo_trainer.py:GRPOTrainer._generate_and_score_completions, ratio block "
              "(lines 2660-2707) and metrics block (lines 2860-2896)")
_TRL_WEIGHTS = ("the weights: exp(d) per token (token modes) or exp(S) per row (sequence modes, unclamped), then "
                "truncated to or masked outside [clip_min, clip_max]")


def _metrics() -> list[Metric]:
    logp, ratio = "sampling/sampling_logp_difference/", "sampling/importance_sampling_ratio/"
    tokens = "over masked-in tokens (NaN left out; 0.0 without one), one process"
    weights = ("over the masked-in tokens' weights (token modes, zeros from masking included) or every row's weight "
               "(sequence modes, empty rows = 1); 0.0 when empty; one process")
    return [
        Metric(logp + "mean", FAMILY, f"token-mean {tokens}", "nats", LOWER,
               f"|old − rollout| (raw: an infinite log-prob gives inf); source: {TRL_BLOCKS}"),
        Metric(logp + "max", FAMILY, f"max {tokens}", "nats", LOWER,
               f"the largest |old − rollout|; source: {TRL_BLOCKS}"),
        Metric(ratio + "min", FAMILY, f"min {weights}", "ratio", NONE, f"the smallest of {_TRL_WEIGHTS}; source: "
               f"{TRL_BLOCKS}"),
        Metric(ratio + "mean", FAMILY, f"mean {weights}", "ratio", CLOSER_TO_1, f"the mean of {_TRL_WEIGHTS}; source: "
               f"{TRL_BLOCKS}"),
        Metric(ratio + "max", FAMILY, f"max {weights}", "ratio", NONE, f"the largest of {_TRL_WEIGHTS} (inf when exp "
               f"overflows and clip_max is none); source: {TRL_BLOCKS}"),
    ]

METRICS = tuple(_metrics())
