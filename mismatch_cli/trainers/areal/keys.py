"""AReaL 1.0.4's rejection-sampling keys (`--semantics areal`), exactly as AReaL's stats tracker exports them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE, CLOSER_TO_1, LOWER_ABS = Direction.LOWER, Direction.NONE, Direction.CLOSER_TO_1, Direction.LOWER_ABS

FAMILY = Family("AReaL rejection sampling (AReaL 1.0.4)",
                "`--semantics areal` with `rejection_sampling` set (keys exactly as AReaL's stats tracker exports)")

SOURCE = ("AReaL 1.0.4 areal/utils/functional/functional.py:apply_rejection_sampling / ppo_actor_loss_fn, logged by "
          "areal/trainer/ppo/actor.py:grpo_loss_fn through areal/utils/stats_tracker.py")
KEPT = "over the tokens kept (weight > 0 after the rejection mask), token mean over the whole step"
WEIGHT = "π_prox / π_behave = exp(old − rollout) in float32 (a non-finite log-ratio counts as 0)"
D = "old − rollout log-prob (AReaL's proximal minus behaviour), in the input dtype"


def _metrics() -> list[Metric]:
    p = "ppo_actor/update/"
    return [
        Metric(p + "behave_imp_weight/avg", FAMILY, KEPT, "ratio", CLOSER_TO_1,
               f"mean behaviour importance weight {WEIGHT}; at sequence level with metric ratio the row's geometric "
               f"mean; clamped where action=clamp; source: {SOURCE}"),
        Metric(p + "behave_imp_weight/min", FAMILY, "min over the kept tokens", "ratio", NONE,
               f"smallest kept weight; absent when infinite or no token is kept; source: {SOURCE}"),
        Metric(p + "behave_imp_weight/max", FAMILY, "max over the kept tokens", "ratio", LOWER,
               f"largest kept weight; absent when infinite (float32 exp overflow) or no token is kept; "
               f"source: {SOURCE}"),
        Metric(p + "behave_approx_kl/avg", FAMILY, KEPT, "nats", LOWER_ABS,
               f"mean of {D} (a k1 estimate, opposite in sign to verl's k1); source: {SOURCE}"),
        Metric(p + "behave_approx_kl/min", FAMILY, "min over the kept tokens", "nats", NONE,
               f"smallest kept {D}; source: {SOURCE}"),
        Metric(p + "behave_approx_kl/max", FAMILY, "max over the kept tokens", "nats", NONE,
               f"largest kept {D}; source: {SOURCE}"),
        Metric(p + "unclipped_behave_tokens", FAMILY, "sum over the step", "tokens", NONE,
               f"how many tokens the weight keeps (mask 1, inside the bounds, weight > 0); source: {SOURCE}"),
        Metric(p + "rs_filtered_fraction", FAMILY, "one loss call over the whole dump (AReaL averages it over its "
                                                   "micro-batches), float32", "fraction", LOWER,
               f"share of the masked-in tokens rejected (action=mask) or whose weight was clamped (action=clamp); "
               f"source: {SOURCE}"),
    ]


METRICS = tuple(_metrics())
