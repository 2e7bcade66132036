"""SkyRL 0.4.0's train-inference off-policy correction: its `OffPolicyCorrectionConfig` fields, defaults and checks.

The formulas (token ratio, TIS caps, the outlier / token / sequence masks, the `policy/loss_metrics/*` keys and
their per-micro-batch reduction) live in `engine.py`; the semantics, with the upstream files and functions,
in docs/skyrl-semantics.md. Here is the data: SkyRL's field names and defaults (the correction's own section,
`trainer.algorithm.off_policy_correction`, plus the trainer's `micro_train_batch_size_per_gpu`, which sets how
the keys are averaged), how SkyRL refuses them, the `SkyrlSpec` the engine reads, and the family as semantics
`skyrl` knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mismatch_cli.correction.model import Needs, ReplayFamily, cap_not_positive, reversed_band
from mismatch_cli.correction.parse import field_number, is_unset
from mismatch_cli.errors import ConfigError, did_you_mean
from mismatch_cli.system.numbers import parse_number


@dataclass(frozen=True)
class SkyrlSpec:
    """SkyRL's off-policy correction as resolved (docs/skyrl-semantics.md): which parts run, and their bounds."""

    tis_ratio_type: str | None  # token | sequence | None
    token_tis_ratio_clip_high: float
    sequence_tis_ratio_clip_high: float
    sequence_mask_metric: str | None  # geometric | product | None
    geo_mask_low: float
    geo_mask_high: float
    product_mask_low: float
    product_mask_high: float
    outlier_low: float | None
    outlier_high: float | None
    token_mask_low: float | None  # the token mask runs only when both bounds are set
    token_mask_high: float | None
    micro_batch_size: int  # rows per micro-batch, in dump order

    @property
    def outlier(self) -> bool:
        """The outlier-token sequence mask runs (either bound set)."""
        return self.outlier_low is not None or self.outlier_high is not None

    @property
    def token_mask(self) -> bool:
        """The per-token mask runs (both bounds set)."""
        return self.token_mask_low is not None and self.token_mask_high is not None


# OffPolicyCorrectionConfig's fields (skyrl/train/config/config.py at 0.4.0) and their defaults, then the
# TrainerConfig field that sets the micro-batches the metrics are averaged over.
SKYRL_DEFAULTS: dict[str, Any] = {
    "tis_ratio_type": None,
    "token_tis_ratio_clip_high": 2.0,
    "sequence_tis_ratio_clip_high": 5.0,
    "sequence_mask_metric": None,
    "geo_mask_high": 1.01,
    "geo_mask_low": 0.99,
    "product_mask_high": 2.0,
    "product_mask_low": 0.5,
    "outlier_token_is_threshold_low": None,
    "outlier_token_is_threshold_high": None,
    "token_mask_is_threshold_low": None,
    "token_mask_is_threshold_high": None,
    "micro_train_batch_size_per_gpu": 1,
}
SKYRL_FIELDS = tuple(SKYRL_DEFAULTS)
STRING_FIELDS = ("tis_ratio_type", "sequence_mask_metric")
OPTIONAL_NUMBERS = ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high",
                    "token_mask_is_threshold_low", "token_mask_is_threshold_high")
NUMBER_FIELDS = tuple(k for k in SKYRL_FIELDS if k not in STRING_FIELDS and k != "micro_train_batch_size_per_gpu")
TIS_TYPES = ("token", "sequence")
SEQUENCE_METRICS = ("product", "geometric")
SKYRL_SOURCE = ("skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:compute_off_policy_correction "
                "(SkyRL 0.4.0)")


def _micro_batch(value: Any) -> int:
    name = "micro_train_batch_size_per_gpu"
    if isinstance(value, bool) or is_unset(value):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", hint=f"write {name}=4")
    number = parse_number(value, name, f"write {name}=4")
    if number != int(number):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", hint=f"write {name}=4")
    if number <= 0:  # skyrl/train/utils/utils.py: validate_batch_sizes
        raise ConfigError(f"{name} must be greater than 0", hint=f"write {name}=1 (SkyRL's default)")
    return int(number)


def resolve_skyrl(fields: dict[str, Any]) -> tuple[SkyrlSpec | None, dict[str, Any]]:
    """The fields as SkyRL's config and `validate_cfg` check them, and what the engine computes (None: off)."""
    values = {**SKYRL_DEFAULTS, **fields}
    for name in STRING_FIELDS:
        value = values[name]
        if is_unset(value):
            values[name] = None
        elif not isinstance(value, str):
            raise ConfigError(f"{name} must be a string or none, got {value!r}", hint=f"write {name}=token")
    for name in NUMBER_FIELDS:
        values[name] = field_number(name, values[name], SKYRL_DEFAULTS[name] or 2.0,
                                    optional=name in OPTIONAL_NUMBERS)
    values["micro_train_batch_size_per_gpu"] = _micro_batch(values["micro_train_batch_size_per_gpu"])
    tis, metric = values["tis_ratio_type"], values["sequence_mask_metric"]
    # skyrl/train/utils/utils.py:validate_cfg asserts these; the compute functions raise the second message.
    if tis is not None and tis not in TIS_TYPES:
        raise ConfigError(f"`tis_ratio_type` must be 'None', 'token', or 'sequence', got {tis} "
                          f"(Unknown tis_ratio_type: {tis})",
                          hint=did_you_mean(tis, TIS_TYPES, "use token, sequence or none"))
    if metric is not None and metric not in SEQUENCE_METRICS:
        raise ConfigError(f"`sequence_mask_metric` must be 'product', or 'geometric', got {metric} "
                          f"(Unknown sequence_mask_metric: {metric})",
                          hint=did_you_mean(metric, SEQUENCE_METRICS, "use product, geometric or none"))
    spec = SkyrlSpec(
        tis_ratio_type=tis, token_tis_ratio_clip_high=values["token_tis_ratio_clip_high"],
        sequence_tis_ratio_clip_high=values["sequence_tis_ratio_clip_high"], sequence_mask_metric=metric,
        geo_mask_low=values["geo_mask_low"], geo_mask_high=values["geo_mask_high"],
        product_mask_low=values["product_mask_low"], product_mask_high=values["product_mask_high"],
        outlier_low=values["outlier_token_is_threshold_low"], outlier_high=values["outlier_token_is_threshold_high"],
        token_mask_low=values["token_mask_is_threshold_low"], token_mask_high=values["token_mask_is_threshold_high"],
        micro_batch_size=values["micro_train_batch_size_per_gpu"],
    )
    # off_policy_correction_enabled: nothing runs and nothing is logged unless one part is switched on.
    if tis is None and metric is None and not spec.outlier and not spec.token_mask:
        return None, values
    return spec, values


def describe_skyrl(config: Mapping[str, Any]) -> str:
    """The first screen's correction line: the parts of SkyRL's correction that run, with their bounds."""
    parts = []
    tis = config.get("tis_ratio_type")
    if tis is not None:
        cap = "token_tis_ratio_clip_high" if tis == "token" else "sequence_tis_ratio_clip_high"
        parts.append(f"tis_ratio_type={tis}, {cap}={config.get(cap)}")
    metric = config.get("sequence_mask_metric")
    if metric is not None:
        prefix = "geo" if metric == "geometric" else "product"
        parts.append(f"sequence_mask_metric={metric} [{config.get(prefix + '_mask_low')}, "
                     f"{config.get(prefix + '_mask_high')}]")
    for name in OPTIONAL_NUMBERS:
        if config.get(name) is not None:
            parts.append(f"{name}={config[name]}")
    if not parts:
        return "none (tis_ratio_type, sequence_mask_metric and the token thresholds unset, as SkyRL's defaults)"
    parts.append(f"micro_train_batch_size_per_gpu={config.get('micro_train_batch_size_per_gpu')}")
    return ", ".join(parts)


FAMILY = ReplayFamily(
    name="skyrl",
    accumulator="mismatch_cli.trainers.skyrl.engine:SkyrlAccumulator",
    keys="mismatch_cli.trainers.skyrl.keys",
    fixes="mismatch_cli.trainers.skyrl.fixes",
    position=20,
    degenerate=(
        reversed_band("geo_mask_low", "geo_mask_high", "masks every sequence",
                      "policy/loss_metrics/geo_sequence_mask_masked_ratio",
                      lambda v: v.get("sequence_mask_metric") == "geometric"),
        reversed_band("product_mask_low", "product_mask_high", "masks every sequence",
                      "policy/loss_metrics/product_sequence_mask_masked_ratio",
                      lambda v: v.get("sequence_mask_metric") == "product"),
        reversed_band("token_mask_is_threshold_low", "token_mask_is_threshold_high", "masks every token",
                      "policy/loss_metrics/token_mask_ratio"),
        reversed_band("outlier_token_is_threshold_low", "outlier_token_is_threshold_high", "masks every sequence",
                      "policy/loss_metrics/outlier_seq_masked_ratio"),
        cap_not_positive("token_tis_ratio_clip_high", "caps every token's weight at a value <= 0: the policy "
                         "gradient vanishes or flips its sign", "policy/loss_metrics/tis_token_clip_high_ratio",
                         lambda v: v.get("tis_ratio_type") == "token"),
        cap_not_positive("sequence_tis_ratio_clip_high", "caps every row's weight at a value <= 0: the policy "
                         "gradient vanishes or flips its sign", "policy/loss_metrics/tis_seq_clip_high_ratio",
                         lambda v: v.get("tis_ratio_type") == "sequence"),
    ),
    needs=(
        Needs("token_tis_ratio_clip_high", "tis_ratio_type=token", lambda v: v.get("tis_ratio_type") == "token"),
        Needs("sequence_tis_ratio_clip_high", "tis_ratio_type=sequence",
              lambda v: v.get("tis_ratio_type") == "sequence"),
        *(Needs(f"geo_mask_{end}", "sequence_mask_metric=geometric",
                lambda v: v.get("sequence_mask_metric") == "geometric") for end in ("low", "high")),
        *(Needs(f"product_mask_{end}", "sequence_mask_metric=product",
                lambda v: v.get("sequence_mask_metric") == "product") for end in ("low", "high")),
        # SkyRL runs the token mask only with both bounds set (off_policy_correction_utils.py)
        Needs("token_mask_is_threshold_low", "token_mask_is_threshold_high",
              lambda v: v.get("token_mask_is_threshold_high") is not None),
        Needs("token_mask_is_threshold_high", "token_mask_is_threshold_low",
              lambda v: v.get("token_mask_is_threshold_low") is not None),
    ),
    title="SkyRL 0.4.0 off-policy correction",
    source=SKYRL_SOURCE,
    defaults=SKYRL_DEFAULTS,
    kinds={**{name: "string" for name in STRING_FIELDS}, **{name: "number" for name in NUMBER_FIELDS},
           "micro_train_batch_size_per_gpu": "number"},
    resolve=resolve_skyrl,
    describe=describe_skyrl,
    lead_keys=("policy/loss_metrics/is_ratio_mean", "policy/loss_metrics/tis_token_clip_high_ratio",
               "policy/loss_metrics/tis_seq_clip_high_ratio"),
    concepts={"weight_mean": "policy/loss_metrics/is_ratio_mean",
              "truncated": "policy/loss_metrics/tis_token_clip_high_ratio",
              "masked": "policy/loss_metrics/token_mask_ratio",
              "dropped": "policy/loss_metrics/outlier_seq_masked_ratio"},
    traits={"sequence": "exp(sum of d) over the row, d and the sum clamped to ±20 in float32",
            "clamp": "log-ratio clamped to [-20, 20] before exp (in float32)",
            "reduction": "per micro-batch (micro_train_batch_size_per_gpu rows), then mean over micro-batches "
                         "(_max / _min: max / min)",
            "threshold": "off by default; token TIS cap 2, sequence cap 5, geometric [0.99, 1.01], product [0.5, 2]"},
)
