"""SkyRL 0.4.0's off-policy correction keys (`--semantics skyrl`), exactly as SkyRL logs them."""

from __future__ import annotations

from mismatch_cli.metrics.model import Direction, Family, Metric

LOWER, NONE, CLOSER_TO_1 = Direction.LOWER, Direction.NONE, Direction.CLOSER_TO_1

FAMILY = Family("SkyRL off-policy correction (SkyRL 0.4.0)",
                "`--semantics skyrl` with one part of `off_policy_correction` set (keys exactly as SkyRL logs them)")

SOURCE = ("SkyRL 0.4.0 skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:compute_off_policy_correction; "
          "per micro-batch, reduced by workers/worker_utils.py:reduce_metrics")
MICRO = "per micro-batch (micro_train_batch_size_per_gpu rows, dump order), then"
RATIO = "exp(old − rollout) per token, the log-ratio clamped to [-20, 20] in float32"


def _share(key: str, what: str, unit: str = "fraction", removes: str = "") -> Metric:
    return Metric("policy/loss_metrics/" + key, FAMILY, f"{MICRO} mean over micro-batches (float32 per micro-batch)",
                  unit, LOWER, f"{what}; source: {SOURCE}", removes=removes)


def _metrics() -> list[Metric]:
    p = "policy/loss_metrics/"
    return [
        Metric(p + "is_ratio_mean", FAMILY, f"{MICRO} mean over micro-batches of the token mean", "ratio",
               CLOSER_TO_1, f"mean of {RATIO} over masked-in tokens (before any mask); source: {SOURCE}"),
        Metric(p + "is_ratio_std", FAMILY, f"{MICRO} mean over micro-batches", "ratio", LOWER,
               f"unbiased std of ratio × mask over every padded position (zeros included); source: {SOURCE}"),
        Metric(p + "is_ratio_max", FAMILY, f"{MICRO} max over micro-batches", "ratio", NONE,
               f"largest ratio × mask over the padded positions (0 counts where there is padding); source: {SOURCE}"),
        Metric(p + "is_ratio_min", FAMILY, f"{MICRO} min over micro-batches", "ratio", NONE,
               f"smallest ratio × mask over the padded positions (0 where there is padding); source: {SOURCE}"),
        _share("outlier_seq_masked_ratio", "share of rows with a token ratio outside the outlier thresholds",
               removes="sequences"),
        _share("outlier_seq_over_high_ratio", "share of rows with a token ratio above outlier_token_is_threshold_high"),
        _share("outlier_seq_under_low_ratio", "share of rows with a token ratio below outlier_token_is_threshold_low"),
        _share("token_mask_ratio", "share of the tokens left by the outlier mask whose ratio is outside "
                                   "[token_mask_is_threshold_low, token_mask_is_threshold_high]", removes="tokens"),
        _share("tis_token_clip_high_ratio",
               "share of the remaining tokens whose ratio exceeds token_tis_ratio_clip_high"),
        _share("tis_seq_clip_high_ratio", "share of rows whose exp(clamped sum of the remaining tokens' log-ratios) "
                                          "exceeds sequence_tis_ratio_clip_high"),
        *[_share(f"{name}_sequence_mask_{part}_ratio", f"share of rows whose {what} is {where}",
                 removes="sequences" if part == "masked" else "")
          for name, what in (("geo", "geometric-mean ratio"), ("product", "product ratio"))
          for part, where in (("masked", "outside its band"), ("over_high", "above its band"),
                              ("under_low", "below its band"))],
    ]


METRICS = tuple(_metrics())
