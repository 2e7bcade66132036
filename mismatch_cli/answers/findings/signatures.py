"""Bug signatures: patterns a correct pair of log-prob streams cannot produce, each from the engine's sums.

Thresholds and why (docs/report.md, "Findings", says the same in prose):

- constant_fill: a side exactly 0.0, or repeating its previous token's value while the other side moves,
  on a token whose |d| > ln 2. bf16 rounding turns log-probs above about -0.06 into 0.0, never one below
  -ln 2, and two consecutive tokens of a real stream agree bit for bit only where both are near-certain,
  so such tokens are fills. Fires at >= 0.1 % of the valid tokens and >= 10 tokens: two orders above the
  rate of catastrophic tokens (~1e-5) that could meet the pattern by chance.
- shifted_streams: the squared residual of old[t] against rollout[t +- 1] (pairs inside a row) below half
  the aligned one. For aligned streams the shifted residual is the aligned one plus twice the variance
  of the log-probs (a clean dump gives ratios of hundreds); for shifted ones it is the noise alone.
- temperature_mismatch: the least-squares slope of rollout on old off 1 by more than 0.05 and by more
  than 5 standard errors. With rollout = log_softmax(z / T) and old = log_softmax(z), rollout = old / T
  + c, with c per position (the two normalizers); c shrinks toward 0 as the distribution gets peaked, so
  the slope estimates 1 / T, attenuated toward 1 by the positions where c moves with old (on tempered
  softmax dumps, T = 0.7 / 1.3, the best-fit T lies between T and 1, within 0.2 of T). 0.05 catches a 10 %
  temperature mismatch; clean dumps sit within 0.01.
- k3_k1_ratio: per token k3 − k1 = ratio − 1, whose mean is 0 whenever the rollout side is the normalized
  distribution the tokens were sampled from (E_rollout[pi_train / pi_rollout] = 1). Fires when the ratio
  k3 / k1 is outside [0.5, 2] and the mean ratio over the bulk (tokens with |d| < 1, where the ratio lies
  in [1/e, e], so no handful of tokens can move it and its standard error is honest) is off 1 by >= 0.01
  (1 % of probability mass missing or added, e.g. a top-p-renormalized or constant-filled side; bf16
  noise gives ~1e-4) and by >= 5 standard errors. Catastrophic tokens (|d| >= 1) swing k3 / k1 on clean
  dumps but are left to concentrated_divergence; truncating at |d| < 1 biases a correct pair's mean by
  only the trainer's probability of such tokens.
- collapsed_correlation: Pearson correlation of exp(old) and exp(rollout) below 0.9 (19 % of the
  variance unexplained; bf16 noise keeps it above 0.99).
- identical_sides: every valid token bitwise equal; bitwise_equal (info): at least half of them.
- mask_covers_prompt: at least half of the non-empty rows lead with a run of two or more valid tokens whose
  rollout log-prob is exactly 0.0 while the old one is real (the engine reports none for a prompt token), and
  such runs hold >= FILL_MIN_TOKENS tokens. The count is exact (engine/accumulators/evidence.py); a fill
  finding is then left for the 0.0s outside those runs only.
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.answers.findings.model import (
    BULK_LOG_RATIO,
    FILL_MIN_TOKENS,
    MIN_Z,
    RATIO_MEAN_TOLERANCE,
    Finding,
    metric_value,
    percent,
)
from mismatch_cli.answers.findings.processors import processed_logprobs, truncated_beyond_zeros

FILL_MIN_FRACTION = 1e-3
SHIFT_MAX_RATIO = 0.5
SHIFT_MIN_PAIRS = 10  # as FILL_MIN_TOKENS: a handful of pairs can line up by chance
SLOPE_TOLERANCE = 0.05
K3_K1_BAND = (0.5, 2.0)
MIN_PEARSON = 0.9
PROMPT_MIN_ROW_SHARE = 0.5  # mask_covers_prompt: the share of non-empty rows that lead with a 0.0 run
BITWISE_INFO_FRACTION = 0.5


def identical_sides(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """Both sides bitwise equal on every valid token: nothing to measure (or a 0-diff run reached its goal)."""
    equal, tokens = table["bitwise_equal"], table["tokens"]
    if tokens == 0 or equal != tokens:
        return []
    return [Finding("identical_sides", "warning", "old and rollout log-probs are identical: nothing to measure",
                    {"tokens": tokens, "bitwise_equal_fraction": 1.0},
                    f"All {tokens} valid tokens are bitwise equal on both sides: the same tensor dumped twice, "
                    "or a deterministic-inference run that reached 0 diff.",
                    fix="dump the engine's own log-probs as rollout_log_probs, not the trainer's twice (ignore "
                        "this for a deterministic-inference run that reached 0 diff)")]


def bitwise_equal(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """Most tokens bitwise equal (a deterministic-inference run): the fraction and the largest |d|, as info."""
    fraction = metric_value(metrics, "bitwise_equal_fraction")
    if fraction is None or fraction < BITWISE_INFO_FRACTION or table["bitwise_equal"] == table["tokens"]:
        return []
    largest = metric_value(metrics, "logprob_abs_diff_max")
    differ = table["tokens"] - table["bitwise_equal"]
    return [Finding("bitwise_equal", "info", f"{percent(fraction)} of tokens are bitwise equal",
                    {"bitwise_equal_fraction": fraction, "differing_tokens": differ, "max_abs_log_ratio": largest},
                    f"{percent(fraction)} of valid tokens match bit for bit; {differ} differ, by at most "
                    f"{largest:.3g} nats (a 0-diff recipe expects none).")]


def mask_covers_prompt(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """Most rows lead with rollout log-probs of exactly 0.0: the response mask covers the prompt."""
    prefix, rows = table.get("prefix_zero_tokens") or 0, table.get("prefix_zero_rows") or 0
    nonempty = table["tokens"] - table["pairs"]
    if prefix < FILL_MIN_TOKENS or not nonempty or rows < PROMPT_MIN_ROW_SHARE * nonempty:
        return []
    fraction = prefix / table["tokens"]
    return [Finding(
        "mask_covers_prompt", "error",
        f"the response mask covers the prompt: {prefix} valid tokens ({percent(fraction)}) lead {rows} of "
        f"{nonempty} rows with a rollout log-prob of 0.0",
        {"prefix_tokens": prefix, "prefix_fraction": fraction, "rows": rows, "nonempty_rows": nonempty,
         "tokens_per_row": prefix / rows if rows else None},
        f"{rows} of {nonempty} rows start with a run of valid tokens whose rollout log-prob is exactly 0.0 while the "
        f"trainer's is real, {prefix} tokens in all ({percent(fraction)} of the valid ones): the engine reports no "
        "log-prob for prompt tokens, so the mask trains on the prompt and every metric here counts it.",
        fix="build the response mask over the sampled response tokens only (0 on the prompt), or cut the prompt "
            "off the dumped streams")]


def constant_fill(metrics: dict[str, Any], table: dict[str, Any], prompt: bool = False) -> list[Finding]:
    """One side padded with 0.0 or another constant where the other side holds real log-probs (beyond a prompt
    the mask covers, when `prompt`)."""
    found = []
    tokens = table["tokens"]
    for side, other in (("rollout", "old"), ("old", "rollout")):
        fills = table[f"fill_{side}"] - (table.get("prefix_zero_fills") or 0 if prompt and side == "rollout" else 0)
        fraction = fills / tokens if tokens else 0.0
        if fills < FILL_MIN_TOKENS or fraction < FILL_MIN_FRACTION:
            continue
        zero, repeat = table[f"zero_{side}"], table[f"repeat_{side}"]
        what = "0.0" if zero >= repeat else "a repeated constant"
        evidence = {"side": side, "fill_tokens": fills, "fill_fraction": fraction, "zero_tokens": zero,
                    "repeat_tokens": repeat, "k3_k1_ratio": metric_value(metrics, "k3_k1_ratio"),
                    "prob_pearson_corr": metric_value(metrics, "prob_pearson_corr")}
        found.append(Finding(
            "constant_fill", "error", f"the {side} side looks filled with {what} on {percent(fraction)} of tokens",
            evidence,
            f"{fills} valid tokens ({percent(fraction)}) have a {side} log-prob of exactly 0.0 ({zero} in all) or "
            f"one repeating the previous token's ({repeat} in all) while the {other} side differs by more than "
            "ln 2: the dump pads that side instead of holding its log-probs.",
            fix=f"write the {side} side's real log-probs where the mask is 1 (pad only where it is 0)"
                + (", returned by the engine for every sampled token" if side == "rollout" else "")))
    return found


def shifted_streams(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """The rollout stream matches the old one better when shifted by one token inside rows."""
    ratio = metric_value(metrics, "shift_residual_ratio")
    if ratio is None or ratio >= SHIFT_MAX_RATIO or table["pairs"] < SHIFT_MIN_PAIRS:
        return []
    late = table["shift_forward"] <= table["shift_backward"]
    direction = "one token late" if late else "one token early"
    return [Finding(
        "shifted_streams", "error", f"the rollout log-probs are shifted {direction} against the old ones",
        {"shift_residual_ratio": ratio, "direction": "rollout_late" if late else "rollout_early",
         "pairs": table["pairs"], "aligned_residual": table["shift_aligned"],
         "shifted_residual": min(table["shift_forward"], table["shift_backward"])},
        f"Over {table['pairs']} adjacent token pairs, old[t] against rollout[t{'+' if late else '-'}1] leaves "
        f"{ratio:.3g} times the squared residual of the aligned streams: an off-by-one between the two sides.",
        fix="align the two sides token for token: the logits at position t - 1 predict token t, so gather the "
            "response's log-probs from logits[:, -response_length - 1:-1]")]


def slope_standard_error(table: dict[str, Any]) -> float:
    """Standard error of the least-squares slope of rollout on old (NaN when undefined)."""
    n = table["tokens"]
    if n < 3:
        return math.nan
    sxx = table["xx"] - table["x"] ** 2 / n
    syy = table["yy"] - table["y"] ** 2 / n
    sxy = table["xy"] - table["x"] * table["y"] / n
    if sxx <= 0:
        return math.nan
    residual = max(syy - sxy * sxy / sxx, 0.0)
    return math.sqrt(residual / (n - 2) / sxx)


def bulk_slope(table: dict[str, Any]) -> float:
    """Least-squares slope of rollout on old over the tokens with |delta| < 1 (NaN when undefined)."""
    if "tail_tokens" not in table:
        return math.nan
    n = table["tokens"] - table["tail_tokens"]
    if n < 3:
        return math.nan
    x, y = table["x"] - table["tail_x"], table["y"] - table["tail_y"]
    sxx = table["xx"] - table["tail_xx"] - x * x / n
    sxy = table["xy"] - table["tail_xy"] - x * y / n
    return sxy / sxx if sxx > 0 else math.nan


def temperature_mismatch(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """A systematic slope of rollout against old: one side tempered (or otherwise rescaled)."""
    slope, temperature = metric_value(metrics, "temperature_slope"), metric_value(metrics, "best_fit_temperature")
    if slope is None or abs(slope - 1) <= SLOPE_TOLERANCE:
        return []
    error = slope_standard_error(table)
    z = abs(slope - 1) / error if error > 0 else math.inf
    if not z >= MIN_Z:
        return []
    estimate = metric_value(metrics, "temperature_estimate")
    fitted = f"{temperature:.3g}" if temperature is not None else "undefined"
    shown = f"{estimate:.3g}" if estimate is not None else fitted
    how = (f"from the positions where one logit dominates; the least-squares fit, pulled toward 1, gives {fitted}"
           if estimate is not None else "the least-squares fit, pulled toward 1: the real ratio is further from 1")
    return [Finding(
        "temperature_mismatch", "error", f"the rollout log-probs are at temperature {shown} of the old ones",
        {"temperature_slope": slope, "best_fit_temperature": temperature, "temperature_estimate": estimate,
         "slope_standard_error": error, "z": z},
        f"The rollout log-prob is {slope:.3g} times the old one on average ({z:.3g} standard errors from 1): "
        f"the rollout side samples at about {shown} times the trainer's temperature ({how}).",
        fix=f"score the trainer's log-probs at the temperature the engine sampled at (the rollout side is at "
            f"about {shown} times the trainer's): divide the logits by that temperature before log_softmax, and "
            "report the engine's log-probs after it")]


def ratio_moments(table: dict[str, Any]) -> tuple[float, float, int]:
    """Mean token ratio over the bulk (|d| < BULK_LOG_RATIO), its standard error and the bulk's token count.

    Per token k3 - k1 = ratio - 1, so the bucket sums of the ratio give the mean, chi2_terms (ratio^2) the variance.
    """
    bulk = [b for b in table["buckets"] if b["high"] <= BULK_LOG_RATIO]
    n = sum(b["tokens"] for b in bulk)
    if n < 2:
        return math.nan, math.nan, n
    mean = sum(b["ratio_sum"] for b in bulk) / n
    variance = max(sum(b["chi2_terms"] for b in bulk) / n - mean * mean, 0.0) * n / (n - 1)
    return mean, math.sqrt(variance / n), n


def k3_k1_ratio(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """k3 far from k1: the rollout side is not the normalized distribution its tokens were sampled from."""
    ratio = metric_value(metrics, "k3_k1_ratio")
    if ratio is None or K3_K1_BAND[0] <= ratio <= K3_K1_BAND[1]:
        return []
    mean, error, bulk = ratio_moments(table)
    if not abs(mean - 1) >= RATIO_MEAN_TOLERANCE:
        return []
    z = abs(mean - 1) / error if error > 0 else math.inf
    if not z >= MIN_Z:
        return []
    n = table["tokens"]
    k3, k1 = table["k3"] / n, table["k1"] / n
    return [Finding(
        "k3_k1_ratio", "warning", f"k3 is {ratio:.3g} times k1",
        {"k3_k1_ratio": ratio, "k3": k3, "k1": k1, "ratio_mean": mean, "ratio_mean_standard_error": error, "z": z,
         "bulk_tokens": bulk},
        f"k3 = {k3:.3g} against k1 = {k1:.3g}: over the {bulk} tokens with |Δ| < {BULK_LOG_RATIO:g} the mean token "
        f"ratio is {mean:.4g}, {z:.3g} standard errors from the 1 it must be when the rollout side is the "
        "distribution its tokens were sampled from.")]


def _one_of(processed: list[Finding], tempered: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """Which of two findings that both break the ratio mean explains the dump: a temperature or processed log-probs.

    Renormalizing raises every rollout log-prob by -log(kept mass) >= 0, more where old is low, so it can only
    lower the slope of rollout on old: a slope above 1 is a temperature below the trainer's, whose capped ratio
    mean falls through the cap at e. A rollout temperature above the trainer's (slope below 1) leaves ratios
    well under e and the capped mean at 1, so with a slope below 1 a broken ratio mean is the truncation.
    """
    if tempered[0].evidence["temperature_slope"] > 1:
        return [], tempered
    return processed, []


def collapsed_correlation(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """The probabilities of the two sides barely correlate."""
    pearson = metric_value(metrics, "prob_pearson_corr")
    if pearson is None or pearson >= MIN_PEARSON:
        return []
    return [Finding(
        "collapsed_correlation", "warning", f"probability correlation collapsed to {pearson:.3g}",
        {"prob_pearson_corr": pearson, "threshold": MIN_PEARSON},
        f"The Pearson correlation of exp(old) and exp(rollout) is {pearson:.3g} (below {MIN_PEARSON}); "
        "matching engines keep it above 0.99.")]


def signatures(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """Every bug signature present; the temperature finding only when no fill or shift explains the slope."""
    if not table or not table.get("tokens"):
        return []
    found = identical_sides(metrics, table)
    if found:
        return found
    prompt = mask_covers_prompt(metrics, table)
    fills = [f for f in constant_fill(metrics, table, bool(prompt)) if not (
        f.evidence["side"] == "rollout" and f.evidence["zero_tokens"] >= f.evidence["repeat_tokens"]
        and truncated_beyond_zeros(table))]
    structural = prompt + fills + shifted_streams(metrics, table)
    found = structural + bitwise_equal(metrics, table)
    processed = [] if structural else processed_logprobs(metrics, table)
    tempered = [] if structural else temperature_mismatch(metrics, table)
    if processed and tempered:
        processed, tempered = _one_of(processed, tempered)
    found += tempered
    # k3 / k1 off is the processed log-probs' symptom: it is shown as a finding of its own only without them.
    return found + processed + ([] if processed else k3_k1_ratio(metrics, table)) + collapsed_correlation(metrics,
                                                                                                         table)


__all__ = ["signatures"]
