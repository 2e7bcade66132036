"""Every key `mismatch` reports, once: family, reduction, unit, direction, band (with its source), meaning.

Formulas are those of docs/verl-semantics.md and docs/legacy-semantics.md; notation: d = old − rollout
log-prob of a valid token, ratio = exp(d), a row's log-ratio sum S = Σ d over its valid tokens.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

from mismatch_cli.correction.model import RS_OPTIONS
from mismatch_cli.correction.registry import replay_families
from mismatch_cli.metrics.model import Band, Direction, Family, Metric

LOWER, HIGHER, CLOSER_TO_1, LOWER_ABS, NONE = (Direction.LOWER, Direction.HIGHER, Direction.CLOSER_TO_1,
                                               Direction.LOWER_ABS, Direction.NONE)

# ------------------------------------------------------------------------------------------- bands
VERL_DOCS = "verl docs/algo/rollout_corr.md, check_rollout_correction_health"
IS_MEAN_BAND = Band(0.5, 2.0, VERL_DOCS)
IS_ESS_BAND = Band(0.3, None, VERL_DOCS)
RAW_ESS_BAND = Band(0.3, None, "verl docs/algo/rollout_corr.md, its IS ESS band applied to the raw token ratios")
IS_STD_BAND = Band(None, 1.0, VERL_DOCS)
KL_BAND = Band(None, 0.1, VERL_DOCS, absolute=True)
CHI2_BAND = Band(None, 1.0, VERL_DOCS)
VETO_BAND = Band(None, 0.1, VERL_DOCS)
# What a correction may remove from the gradient: verl's band for its veto fraction (the share of sequences the
# veto drops), held to every share of tokens or sequences a correction masks, rejects or drops (Metric.removes).
DROP_BAND = Band(None, 0.1, VERL_DOCS + ": its veto-fraction band, for any share a correction removes")
SEQ_ESS_BAND = Band(0.3, None, "verl docs/algo/rollout_corr.md, its IS ESS band applied to the raw sequence weights "
                    "(checked when the correction is sequence-level)")
# The engines' agreement itself: no correction changes these, so they judge the log-probs, not the weights.
PROB_DIFF_BAND = Band(None, 0.01, "verl docs/faq/faq.rst: training/rollout_probs_diff_mean below 0.005 is normal, "
                      "above 0.01 a precision problem in the inference engine")
MULT_PROB_ERROR_BAND = Band(None, 1.05, "NeMo-RL tests/test_suites/llm/*.sh: a run fails when "
                            "train/token_mult_prob_error reaches 1.05")
RATIO_MEAN_BAND = Band(0.99, 1.01, "E_rollout[pi_train / pi_rollout] = 1 (the importance-sampling identity); "
                       "out of band only when also 5 standard errors from 1 (mismatch)")
RATIO_MEAN_MIN_Z = 5.0


def ratio_mean_z(mean: float, error: float | None) -> float:
    """How many standard errors the token ratio mean lies from 1 (inf without a positive standard error)."""
    return abs(mean - 1.0) / error if error is not None and math.isfinite(error) and error > 0 else math.inf


def ratio_mean_broken(mean: float, error: float | None) -> bool:
    """The ratio-mean test: outside RATIO_MEAN_BAND and RATIO_MEAN_MIN_Z standard errors from 1."""
    return not RATIO_MEAN_BAND.healthy(mean) and ratio_mean_z(mean, error) >= RATIO_MEAN_MIN_Z


# ------------------------------------------------------------------ minimal practical differences
# compare calls a change smaller than these "=" (no practical change), never worse or better; docs/ci.md
# lists them with their reasons. (amount, relative): relative amounts are a fraction of |base|.
ESS_DIFFERENCE = 0.01  # one percent of the sample: below that a change of ESS does not matter in practice
WEIGHT_DIFFERENCE = 0.01  # IS weight mean / std: 1 % of the ideal weight 1 (and of the std band's limit 1)
FRACTION_DIFFERENCE = 0.001  # a tenth of a percent of tokens or rows (1 % of the 0.1 veto band)
PPL_RATIO_DIFFERENCE = 0.001  # perplexities within 0.1 % of each other train the same
SCALE_FREE_DIFFERENCE = 0.10  # relative: KL, χ² and |Δ| span decades; asv's default factor (1.1) of |base|
_PRACTICAL: dict[str, tuple[float, bool]] = {  # off-policy key (no prefix) -> (amount, relative)
    "kl": (SCALE_FREE_DIFFERENCE, True),
    "k3_kl": (SCALE_FREE_DIFFERENCE, True),
    "chi2_token": (SCALE_FREE_DIFFERENCE, True),
    "chi2_seq": (SCALE_FREE_DIFFERENCE, True),
    "log_ppl_abs_diff": (SCALE_FREE_DIFFERENCE, True),
    "ppl_ratio": (PPL_RATIO_DIFFERENCE, False),
}

# ---------------------------------------------------------------------------------------- families
OFFPOLICY = Family("off-policy (verl)", "always with verl 0.8 and 0.9 (`rollout_corr/`); the older families and "
                   "the replayed trainers log their own keys instead")
IS = Family("importance sampling (verl)", "with IS on (`--is`, or a preset with IS); metrics of the applied "
            "(truncated or IcePop-zeroed) weights, of the raw weights up to verl 0.7.1")
VETO = Family("veto (verl 0.6.1 / 0.7.0)", "`--semantics verl-0.6.1` / `verl-0.7.0` (0.0 while the veto is off)")
RS_TOTAL = Family("rejection sampling, all options (verl)", "with RS on (`--rs`)")
RS_OPTION = Family("rejection sampling per option (verl >= 0.7.1)",
                   "with RS on (`--rs OPTION[,OPTION]`), one block per option; the value is the option's k1, k2 "
                   "or k3 statistic per token (token options) or per row (sequence options)")
RS_OLD = Family("rejection sampling (verl 0.6.1 / 0.7.0)",
                "`--semantics verl-0.6.1` / `verl-0.7.0` with `--rs token|sequence|geometric`")
OLD_OFFPOLICY = Family("off-policy (verl 0.6.0 / xtuner)",
                       "`--semantics xtuner`, or `verl-0.6.0` with IS on (`mismatch/`; xtuner: a pack is one row)")
OLD_IS = Family("importance sampling (verl 0.6.0 / xtuner)",
                "`--semantics verl-0.6.0` / `xtuner` with IS on (`mismatch/`; metrics of the raw ratios)")
DIAG = Family("diagnostics (mismatch)", "always (`diag/`)")
ROUNDS = Family("per round (verl PR #5229)", "always (`per_round/`); one key per round index k")
# Each replayed trainer's keys (its `keys` module: FAMILY, METRICS), once a module (slime, slime-mis share one).
_KEY_MODULES = dict.fromkeys(family.keys for family in replay_families().values() if family.keys)
_TRAINER_KEYS = [importlib.import_module(module) for module in _KEY_MODULES]
TRAINER_FAMILIES: tuple[Family, ...] = tuple(module.FAMILY for module in _TRAINER_KEYS)
# A trainer's share of removed tokens or sequences is held to the drop band, as verl's are.
TRAINER_METRICS: tuple[Metric, ...] = tuple(
    replace(metric, band=DROP_BAND) if metric.removes and metric.band is None else metric
    for module in _TRAINER_KEYS for metric in module.METRICS)
FAMILIES = (OFFPOLICY, IS, VETO, RS_TOTAL, RS_OPTION, RS_OLD, OLD_OFFPOLICY, OLD_IS, *TRAINER_FAMILIES, DIAG, ROUNDS)

# -------------------------------------------------------------------------------------- reductions
TOKEN_MEAN = "token-mean over valid tokens"
ROWS_MEAN = "sequence-mean over all rows (empty rows included)"
TOKEN_FRACTION = "fraction of valid tokens"
ROW_FRACTION = "fraction of all rows"
COUNT = "count"

# ------------------------------------------------------------------------------------- off-policy
_OFFPOLICY = (
    ("kl", TOKEN_MEAN, "nats", LOWER_ABS, "k1 KL(rollout || train): rollout − old, signed",
     "KL(rollout || train), k1", KL_BAND),
    ("k3_kl", TOKEN_MEAN, "nats", LOWER, "k3 KL: exp(d) − d − 1, unclamped (may overflow)", "", None),
    ("chi2_token", TOKEN_MEAN, "dimensionless", LOWER, "χ²: ratio² − 1, ratio clamped to exp(±20)",
     "chi-squared, token", CHI2_BAND),
    ("chi2_seq", ROWS_MEAN, "dimensionless", LOWER, "χ² of rows: exp(2·clamp(S, ±20)) − 1", "", None),
    ("training_ppl", ROWS_MEAN, "perplexity", NONE, "trainer perplexity exp(−row mean old log-prob)", "", None),
    ("rollout_ppl", ROWS_MEAN, "perplexity", NONE, "engine perplexity exp(−row mean rollout log-prob)", "", None),
    ("training_log_ppl", ROWS_MEAN, "nats", NONE, "−row mean of old log-probs", "", None),
    ("rollout_log_ppl", ROWS_MEAN, "nats", NONE, "−row mean of rollout log-probs", "", None),
    ("log_ppl_diff", ROWS_MEAN, "nats", LOWER_ABS, "row mean rollout − row mean old log-prob", "", None),
    ("log_ppl_abs_diff", ROWS_MEAN, "nats", LOWER, "|row mean rollout − row mean old log-prob|", "", None),
    ("log_ppl_diff_max", "max over all rows (an empty row offers 0)", "nats", LOWER_ABS,
     "the largest per-row log_ppl_diff", "", None),
    ("log_ppl_diff_min", "min over all rows (an empty row offers 0)", "nats", LOWER_ABS,
     "the smallest per-row log_ppl_diff", "", None),
    ("ppl_ratio", ROWS_MEAN, "ratio", CLOSER_TO_1, "training PPL / rollout PPL, per row", "", None),
)


def _offpolicy() -> list[Metric]:
    return [Metric("rollout_corr/" + name, OFFPOLICY, reduction, unit, direction, meaning, label, band,
                   *_PRACTICAL.get(name, (None, False)))
            for name, reduction, unit, direction, meaning, label, band in _OFFPOLICY]


def _older_offpolicy() -> list[Metric]:
    shared = [Metric("mismatch/mismatch_" + name, OLD_OFFPOLICY, reduction, unit, direction, meaning, label, band,
                     *_PRACTICAL.get(name, (None, False)), alias_of="rollout_corr/" + name)
              for name, reduction, unit, direction, meaning, label, band in _OFFPOLICY
              if name not in ("chi2_token", "chi2_seq")]
    return shared + [
        Metric("mismatch/mismatch_logprob_abs_diff", OLD_OFFPOLICY, TOKEN_MEAN, "nats", LOWER,
               "|old − rollout| log-prob (xtuner only)", practical_difference=SCALE_FREE_DIFFERENCE,
               practical_relative=True, alias_of="diag/logprob_abs_diff_mean"),
        Metric("mismatch/valid", OLD_OFFPOLICY, "flag", "0 or 1", NONE,
               "xtuner: 1 when the input has a valid token, else 0"),
    ]


# ------------------------------------------------------------------------ the ratio-statistics block
def _ratio_block(prefix: str, family: Family, weight: str, rows: str, bands: bool = False,
                 alias_prefix: str | None = None) -> list[Metric]:
    """The 14 statistics verl and xtuner log of a weight or ratio (IS weights, the older RS ratios)."""
    high = "above the upper threshold U"
    low = "below the lower bound (1/U, or L)"
    block = (
        ("mean", TOKEN_MEAN, "ratio", CLOSER_TO_1, f"mean {weight}", "IS weight mean", IS_MEAN_BAND,
         WEIGHT_DIFFERENCE),
        ("max", "max over valid tokens (sequence level: over all rows)", "ratio", CLOSER_TO_1,
         f"the largest {weight} (sequence level: exp(min(max S, 20)))", "", None, None),
        ("min", "min over valid tokens (sequence level: over all rows)", "ratio", CLOSER_TO_1,
         f"the smallest {weight} (sequence level: exp(min S), unclamped)", "", None, None),
        ("ratio_fraction_high", f"{TOKEN_FRACTION} (sequence level: of all rows)", "fraction", LOWER,
         f"share whose raw ratio is {high}", "", None, None),
        ("ratio_fraction_low", f"{TOKEN_FRACTION} (sequence level: of all rows)", "fraction", LOWER,
         f"share whose raw ratio is {low}", "", None, None),
        ("std", "token-weighted population std over valid tokens", "ratio", LOWER,
         f"spread of the {weight} clamped to the band", "IS weight std", IS_STD_BAND, WEIGHT_DIFFERENCE),
        ("eff_sample_size", "token-weighted, in (0, 1]", "fraction", HIGHER,
         f"effective sample size 1 / mean((c / mean c)²), c = the {weight} clamped to the band",
         "IS effective sample size", IS_ESS_BAND, ESS_DIFFERENCE),
        ("seq_mean", f"mean over {rows}", "ratio", CLOSER_TO_1, f"mean of each row's mean {weight}", "", None, None),
        ("seq_std", f"sample std over {rows}", "ratio", LOWER, f"spread of the rows' mean {weight}", "", None, None),
        ("seq_max", f"max over {rows}", "ratio", CLOSER_TO_1, f"the largest row mean {weight}", "", None, None),
        ("seq_min", f"min over {rows}", "ratio", CLOSER_TO_1, f"the smallest row mean {weight} (an empty row gives "
         "0)", "", None, None),
        ("seq_max_deviation", f"max over {rows}", "ratio", LOWER, f"the largest |row mean {weight} − 1|", "", None,
         None),
        ("seq_fraction_high", f"fraction of {rows}", "fraction", LOWER, f"share of rows whose mean {weight} is "
         f"{high}", "", None, None),
        ("seq_fraction_low", f"fraction of {rows}", "fraction", LOWER, f"share of rows whose mean {weight} is "
         f"{low} (an empty row counts)", "", None, None),
    )
    entries = []
    for stat, reduction, unit, direction, meaning, label, band, difference in block:
        alias = alias_prefix + stat if alias_prefix else None
        entries.append(Metric(prefix + stat, family, reduction, unit, direction, meaning,
                              label if bands and band is not None else "", band if bands else None,
                              difference if bands else None, alias_of=alias))
    return entries


def _importance() -> list[Metric]:
    prefix = "rollout_corr/rollout_is_"
    return _ratio_block(prefix, IS, "IS weight", "all rows", bands=True) + [
        Metric(prefix + "oob_ratio", IS, f"{TOKEN_FRACTION} (sequence level: same, per row)", "fraction", LOWER,
               "IcePop: share whose raw weight lies outside [L, U] (and is zeroed)"),
        Metric(prefix + "batch_norm_factor", IS, "token-mean (sequence level: mean over valid rows)", "ratio",
               CLOSER_TO_1, "the mean applied weight the weights are divided by (--is-batch-normalize; 1.0 when "
               "below 1e-8)"),
    ]


def _veto(prefix: str, family: Family, alias: bool = False) -> list[Metric]:
    verl = "rollout_corr/rollout_is_"
    return [
        Metric(prefix + "veto_fraction", family, ROW_FRACTION, "fraction", LOWER,
               "share of rows vetoed: a valid token's ratio is beyond the veto threshold", band=VETO_BAND,
               practical_difference=FRACTION_DIFFERENCE, alias_of=verl + "veto_fraction" if alias else None,
               removes="sequences"),
        Metric(prefix + "catastrophic_token_fraction", family, TOKEN_FRACTION, "fraction", LOWER,
               "share of valid tokens whose ratio is beyond the veto threshold",
               practical_difference=FRACTION_DIFFERENCE,
               alias_of=verl + "catastrophic_token_fraction" if alias else None),
    ]


def _older_importance() -> list[Metric]:
    prefix = "mismatch/rollout_is_"
    quantiles = [Metric(f"{prefix}p{q}", OLD_IS, "quantile over valid tokens (linear interpolation; from the "
                        "sketch beyond 4M tokens)", "ratio", CLOSER_TO_1, f"the {q} % quantile of the raw IS ratio")
                 for q in (25, 50, 75, 95, 99)]
    return (_ratio_block(prefix, OLD_IS, "raw IS ratio", "all rows (valid rows in xtuner)", bands=True,
                         alias_prefix="rollout_corr/rollout_is_")
            + _veto(prefix, OLD_IS, alias=True) + quantiles + [
        Metric(prefix + "masked_fraction", OLD_IS, TOKEN_FRACTION, "fraction", LOWER,
               "mask mode: share of valid tokens whose weight is zeroed", practical_difference=FRACTION_DIFFERENCE,
               band=DROP_BAND, removes="tokens"),
        Metric(prefix + "seq_masked_fraction", OLD_IS, ROW_FRACTION, "fraction", LOWER,
               "mask mode: share of rows with a zeroed weight (sequence / geometric: the row's ratio out of band)",
               practical_difference=FRACTION_DIFFERENCE, band=DROP_BAND, removes="sequences"),
    ])


# ------------------------------------------------------------------------------- rejection sampling
K1 = tuple(o for o in RS_OPTIONS if o.endswith("k1"))
K23 = tuple(o for o in RS_OPTIONS if not o.endswith("k1"))
_ROWS = "valid rows"


def _rejection() -> list[Metric]:
    totals = [
        Metric("rollout_corr/rollout_rs_masked_fraction", RS_TOTAL, TOKEN_FRACTION, "fraction", LOWER,
               "share of valid tokens rejected by RS (all options together)",
               practical_difference=FRACTION_DIFFERENCE, band=DROP_BAND, removes="tokens"),
        Metric("rollout_corr/rollout_rs_seq_masked_fraction", RS_TOTAL, ROW_FRACTION, "fraction", LOWER,
               "share of rows with any valid token rejected (empty rows count in the denominator)",
               practical_difference=FRACTION_DIFFERENCE, band=DROP_BAND, removes="sequences"),
    ]
    # (stat, reduction, unit, meaning, placeholder): `kx` stats are signed for k1 (best near 0 either way).
    stats = (
        ("mean", "token-mean over valid tokens (sequence options: of row values)", "statistic", "mean value", "kx"),
        ("max", "max over valid tokens (sequence options: over valid rows)", "statistic", "largest value", "kx"),
        ("min", "min over valid tokens (sequence options: over valid rows)", "statistic", "smallest value", "kx"),
        ("fraction_high", f"{TOKEN_FRACTION} (sequence options: of {_ROWS})", "fraction",
         "share above the upper bound", "option"),
        ("fraction_low", f"{TOKEN_FRACTION} (sequence options: of {_ROWS})", "fraction",
         "share below the lower bound (k2 / k3: always 0)", "option"),
        ("std", "token-weighted population std over valid tokens", "statistic",
         "spread of the value clamped to the bounds", "option"),
        ("seq_mean", f"mean over {_ROWS}", "statistic", "mean of the per-row values", "kx"),
        ("seq_std", f"sample std over {_ROWS}", "statistic", "spread of the per-row values", "option"),
        ("seq_max", f"max over {_ROWS}", "statistic", "the largest per-row value", "kx"),
        ("seq_min", f"min over {_ROWS}", "statistic", "the smallest per-row value", "kx"),
        ("seq_max_deviation", f"max over {_ROWS}", "statistic", "the largest |per-row value| (0 is ideal)", "option"),
        ("seq_fraction_high", f"fraction of {_ROWS}", "fraction", "share of rows above the upper bound", "option"),
        ("seq_fraction_low", f"fraction of {_ROWS}", "fraction", "share of rows below the lower bound", "k1_option"),
        ("masked_fraction", TOKEN_FRACTION, "fraction", "share of valid tokens this option rejects", "option"),
        ("seq_masked_fraction", f"fraction of {_ROWS}", "fraction", "share of rows with a valid token this option "
         "rejects", "option"),
    )
    values = {"option": RS_OPTIONS, "k1_option": K1, "k23_option": K23}
    entries = []
    for stat, reduction, unit, meaning, which in stats:
        variants = (("k1_option", LOWER_ABS), ("k23_option", LOWER)) if which == "kx" else ((which, LOWER),)
        for placeholder, direction in variants:
            entries.append(Metric(f"rollout_corr/rollout_rs_{{{placeholder}}}_{stat}", RS_OPTION, reduction, unit,
                                  direction, meaning, placeholders={placeholder: values[placeholder]}))
    older = _ratio_block("rollout_corr/rollout_rs_", RS_OLD, "RS ratio", "all rows")
    return totals + entries + older


# ------------------------------------------------------------------------------------- diagnostics
def _diagnostics() -> list[Metric]:
    def diag(name: str, reduction: str, unit: str, direction: Direction, meaning: str, **extra: object) -> Metric:
        return Metric("diag/" + name, DIAG, reduction, unit, direction, meaning, **extra)  # type: ignore[arg-type]

    sketch = "quantile over valid tokens (sketch, within 0.4 %)"
    signed = [diag(f"log_ratio_p{q}", sketch, "nats", LOWER_ABS, f"the {level} % quantile of d")
              for q, level in (("001", "0.1"), ("01", "1"), ("50", "50"), ("99", "99"), ("999", "99.9"))]
    absolute = [diag(f"abs_log_ratio_p{q}", sketch, "nats", LOWER, f"the {level} % quantile of |d|")
                for q, level in (("50", "50"), ("90", "90"), ("99", "99"), ("999", "99.9"))]
    return [
        diag("logprob_abs_diff_mean", TOKEN_MEAN, "nats", LOWER, "|old − rollout| log-prob",
             practical_difference=SCALE_FREE_DIFFERENCE, practical_relative=True),
        diag("logprob_abs_diff_max", "max over valid tokens", "nats", LOWER, "the largest |old − rollout| log-prob"),
        diag("token_mult_prob_error", TOKEN_MEAN, "ratio", LOWER, "NeMo-RL's exp|d| (1 when the sides agree)",
             label="NeMo-RL token_mult_prob_error", band=MULT_PROB_ERROR_BAND),
        diag("ratio_mean", "token-mean over valid tokens of min(exp(d), e)", "ratio", CLOSER_TO_1,
             "1 when the rollout side reports the distribution its tokens were sampled from, whatever the "
             "precision; below 1: probability mass missing (top-p / top-k renormalized log-probs, a 0.0 fill)",
             label="token ratio mean", band=RATIO_MEAN_BAND),
        diag("ratio_mean_se", "standard error of ratio_mean", "ratio", NONE,
             "the sampling error of diag/ratio_mean (sample std / sqrt(tokens))"),
        diag("log_ratio_mean", TOKEN_MEAN, "nats", LOWER_ABS, "signed bias d: a top-p / top-k offset that the mean "
             "|d| hides"),
        diag("log_ratio_median", "median over valid tokens (sketch)", "nats", LOWER_ABS, "the median of d"),
        diag("log_ratio_neg_fraction", TOKEN_FRACTION, "fraction", NONE, "share of tokens with d < 0 (about 0.5 "
             "without bias)"),
        diag("prob_abs_diff_mean", TOKEN_MEAN, "probability", LOWER, "|exp(old) − exp(rollout)| (verl's "
             "training/rollout_probs_diff_mean)", label="mean |p_train − p_rollout|", band=PROB_DIFF_BAND),
        diag("prob_abs_diff_max", "max over valid tokens", "probability", LOWER, "the largest |exp(old) − "
             "exp(rollout)|"),
        diag("prob_abs_diff_std", "sample std over valid tokens", "probability", LOWER, "spread of |exp(old) − "
             "exp(rollout)|"),
        diag("prob_pearson_corr", "Pearson correlation over valid tokens", "correlation", HIGHER,
             "correlation of exp(old) and exp(rollout) (verl's rollout_actor_probs_pearson_corr)"),
        *signed,
        *absolute,
        diag("ess_token", "token-weighted, in (0, 1]", "fraction", HIGHER, "verl's IS ESS formula on the raw "
             "token ratios (no truncation)", label="ESS of raw token ratios", band=RAW_ESS_BAND,
             practical_difference=ESS_DIFFERENCE),
        diag("ess_seq_kish", "over valid rows, in (0, 1]", "fraction", HIGHER, "Kish's (Σw)² / (n Σw²), "
             "w = exp(clamp(S, ±20)) per row", label="ESS of raw sequence ratios", band=SEQ_ESS_BAND,
             practical_difference=ESS_DIFFERENCE),
        # The bug signatures' numbers (engine/accumulators/signatures.py; docs/report.md, "Findings").
        diag("bitwise_equal_fraction", TOKEN_FRACTION, "fraction", NONE, "share of tokens with old == rollout "
             "bit for bit (1.0: the same tensor twice, or a deterministic-inference run)"),
        diag("temperature_slope", "least-squares slope over valid tokens", "ratio", CLOSER_TO_1,
             "slope of the rollout log-prob on the old log-prob (1 / T for a rollout side at temperature T)"),
        diag("best_fit_temperature", "1 / temperature_slope", "temperature", CLOSER_TO_1,
             "apparent temperature of the rollout side against the old side (attenuated toward 1)"),
        diag("temperature_estimate", "1 / the 99.9 % (slope > 1) or 0.1 % (slope < 1) quantile of rollout / old "
             "over valid tokens with old < -1", "temperature", CLOSER_TO_1,
             "the rollout side's temperature relative to the old side's, from the positions where one logit "
             "dominates (rollout = old / T there); within ~1 % on a real T = 0.7 dump"),
        diag("shift_residual_ratio", "ratio of sums over adjacent token pairs within rows", "ratio", HIGHER,
             "Σ(old − rollout shifted one token)² / Σ(old − rollout)², the better shift; below 1: off by one"),
        diag("constant_fill_fraction_old", TOKEN_FRACTION, "fraction", LOWER, "old side exactly 0.0, or repeating "
             "the previous token's value while rollout moves, with |d| > ln 2"),
        diag("constant_fill_fraction_rollout", TOKEN_FRACTION, "fraction", LOWER, "rollout side exactly 0.0, or "
             "repeating the previous token's value while old moves, with |d| > ln 2"),
        diag("k3_k1_ratio", "ratio of token sums", "ratio", CLOSER_TO_1, "Σ k3 / Σ k1 (k3 − k1 = ratio − 1 per "
             "token, so 1 in expectation when the rollout side samples its own normalized distribution)"),
        diag("sequences", COUNT, "rows", NONE, "rows read"),
        diag("valid_tokens", COUNT, "tokens", NONE, "tokens with mask 1 and finite log-probs on both sides"),
        diag("empty_rows", COUNT, "rows", NONE, "rows without a valid token"),
        diag("rounds", COUNT, "rounds", NONE, "rounds (runs of 1s in the mask) in all rows"),
        diag("nonfinite_tokens", COUNT, "tokens", LOWER, "valid tokens with a NaN / inf log-prob (excluded)"),
        diag("sentinel_tokens", COUNT, "tokens", LOWER, "valid tokens with a fill value <= −9000 (excluded)"),
    ]


def _rounds() -> list[Metric]:
    round_k = {"k": None}
    return [
        Metric("per_round/total_rounds", ROUNDS, COUNT, "rounds", NONE, "the most rounds in any row"),
        Metric("per_round/round_{k}_abs_diff_mean", ROUNDS, "token-mean over round k of every row", "nats", LOWER,
               "|old − rollout| in round k (the k-th run of 1s in a row's mask)", placeholders=round_k),
        Metric("per_round/round_{k}_token_count", ROUNDS, COUNT, "tokens", NONE, "valid tokens in round k",
               placeholders=round_k),
        Metric("per_round/max_round_diff", ROUNDS, "round index", "index", NONE,
               "the round with the largest mean |d| (−1 when there is no round)"),
        Metric("per_round/max_diff_value", ROUNDS, "token-mean over that round", "nats", LOWER,
               "that round's mean |d| (0.0 when there is no round)"),
    ]


METRICS: tuple[Metric, ...] = (
    *_offpolicy(), *_importance(), *_veto("rollout_corr/rollout_is_", VETO), *_rejection(), *_older_offpolicy(),
    *_older_importance(), *TRAINER_METRICS, *_diagnostics(), *_rounds(),
)
