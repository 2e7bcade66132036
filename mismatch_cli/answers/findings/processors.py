"""Logit processors the rollout applied and the trainer did not: a truncated support against a reweighting.

A rollout side that reports the processed distribution it sampled from keeps the uncapped identity
E_rollout[ratio] = 1 whenever that distribution has the trainer's support (a temperature, a penalty, a logit
bias), and breaks it only by truncation: the uncapped mean is then the mass kept (top-p / top-k / min-p).

- processed_logprobs: the capped ratio mean broken below 1, >= PROCESSED_MIN_BELOW of the ratios below 1, and
  the uncapped mean below 1 as well (or too noisy to say: then a penalty is named beside the truncation).
- logit_processor: the capped mean broken below 1 while the uncapped one lies within MIN_Z standard errors of 1
  and MIN_Z or more above the capped one (the capped mean falls through the cap at e on the tokens the processor
  pushed down and the sampler drew anyway); renormalizing raises every other token, so more than
  PENALTY_MIN_BELOW of the ratios sit below 1. The uncapped mean speaks only when its standard error separates
  1 from the capped mean: a few catastrophic tokens make it too noisy.
- With the sampled token ids in the dump, the tokens the trainer rates above the engine (ratio above 1) are
  tested for repeats of a token earlier in their row against the share of repeats among all tokens (exact
  binomial, one-sided 5 sigma): a repetition penalty pushes exactly those down, a truncation has no such token
  beyond noise, which falls on repeats no more than on others. Concentrated repeats name the penalty.
- A kept set of one token (top-k 1, min-p) reports 0.0: when the other tokens show the truncation on their
  own, those 0.0s are no fill (truncated_beyond_zeros).
"""

from __future__ import annotations

import math
from typing import Any

from mismatch_cli.answers.findings.model import (
    BULK_LOG_RATIO,
    MIN_Z,
    RATIO_MEAN_TOLERANCE,
    Finding,
    metric_value,
    percent,
)
from mismatch_cli.metrics.catalog import ratio_mean_broken, ratio_mean_z

PROCESSED_MIN_BELOW = 0.8  # processed log-probs: the share of tokens whose ratio is below 1
PENALTY_MIN_BELOW = 0.5  # a reweighting processor raises most tokens: the share whose ratio is below 1
REPEAT_P = 2.9e-7  # one-sided 5 sigma: the chance of the repeats among the tokens above 1 by chance alone


def truncated_beyond_zeros(table: dict[str, Any]) -> bool:
    """The tokens whose rollout log-prob is not exactly 0.0 show a truncation on their own: their capped ratio mean
    broken below 1 and >= PROCESSED_MIN_BELOW of their ratios below 1. Then the 0.0s are kept sets of one token
    (top-k 1, min-p), not a fill, which leaves the other tokens' mean at 1."""
    zeros = table.get("zero_tokens")
    n = table["tokens"] - (zeros or 0)
    if zeros is None or n < 2:
        return False
    excess = (table["ratio_excess"] - table["zero_excess"]) / n
    variance = max((table["ratio_excess_sq"] - table["zero_excess_sq"]) / n - excess * excess, 0.0) * n / (n - 1)
    below = sum(b["tokens"] for b in table["buckets"] if b["sign"] < 0) - zeros
    return excess < 0 and ratio_mean_broken(1 + excess, math.sqrt(variance / n)) and below >= PROCESSED_MIN_BELOW * n


def processed_logprobs(metrics: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """A capped ratio mean broken below 1: a truncated support (every ratio the kept mass, below 1), or a
    reweighting logit processor (the uncapped mean at 1, the capped one pulled under by its right tail)."""
    mean, error = metric_value(metrics, "ratio_mean"), metric_value(metrics, "ratio_mean_se")
    below = metric_value(metrics, "log_ratio_neg_fraction")
    if mean is None or below is None or not mean < 1.0 or not ratio_mean_broken(mean, error):
        return []
    z = ratio_mean_z(mean, error)
    uncapped, spread = uncapped_ratio(table)
    evidence = {"ratio_mean": mean, "ratio_mean_standard_error": error, "z": z, "ratio_below_1_fraction": below,
                "uncapped_ratio_mean": uncapped, "uncapped_ratio_mean_standard_error": spread}
    repeats = repeat_concentration(table)
    if repeats is not None:
        evidence["repetition"] = repeats
    # The uncapped mean speaks only when it is measured well enough to tell 1 from the capped mean; the token ids,
    # when the tokens the trainer rates above the engine are repeats, speak for a penalty whatever it says (a
    # strong penalty hides its tail, and the uncapped mean then reads low, as a truncation's).
    separated = spread > 0 and (uncapped - mean) / spread >= MIN_Z and ratio_mean_z(uncapped, spread) < MIN_Z
    if separated or (repeats is not None and repeats["concentrated"]):
        return logit_processor(evidence, table) if below > PENALTY_MIN_BELOW else []
    if below < PROCESSED_MIN_BELOW:
        return []
    # Uncapped, a truncation's mean is the kept mass; when that mean is too noisy to sit below 1, a penalty
    # (whose uncapped mean is 1) cannot be told from it: both are named.
    either = not (1 - uncapped >= RATIO_MEAN_TOLERANCE and ratio_mean_z(uncapped, spread) >= MIN_Z)
    evidence["or_penalty"] = either
    lowest = metric_value(metrics, "log_ratio_p001")
    kept_low = math.exp(lowest) if lowest is not None and lowest <= 0 else None
    zeros, tokens = table["zero_rollout"], table["tokens"]
    evidence.update({"kept_mass_p001": kept_low, "rollout_exact_zero_tokens": zeros,
                     "rollout_exact_zero_fraction": zeros / tokens if tokens else None})
    floor = f", 0.1 % quantile {kept_low:.3g}" if kept_low is not None else ""
    ones = (f"; {zeros} tokens ({percent(zeros / tokens)}) have a rollout log-prob of exactly 0.0, a nucleus of "
            "one token") if zeros else ""
    tell = (f" Uncapped it averages {uncapped:.4g} ± {spread:.2g}, too noisy to tell a truncation (below 1) from a "
            "penalty or logit bias (at 1): token ids in the dump, or a rollout without penalties, tell them "
            "apart.") if either else ""
    return [Finding(
        "processed_logprobs", "error",
        f"the rollout log-probs look renormalized over a top-p / top-k / min-p kept set (kept mass {mean:.3g})"
        + (", or reweighted by a penalty" if either else ""),
        evidence,
        f"The token ratio averages {mean:.4g} ({z:.3g} standard errors below the 1 it must be when the rollout "
        f"side is the distribution its tokens were sampled from) and is below 1 on {percent(below)} of tokens: "
        f"each ratio is the probability mass the truncation kept (token-mean {mean:.3g}{floor}){ones}.{tell}",
        fix="sample training rollouts without top-p / top-k / min-p truncation"
            + (" (and without penalties or logit bias)" if either else "")
            + ", or renormalize the trainer's log-probs over the same kept set: the engine reports its log-probs "
              "renormalized over what it kept (vLLM's processed_logprobs), the trainer over the whole vocabulary")]


def uncapped_ratio(table: dict[str, Any]) -> tuple[float, float]:
    """Token-mean of the (verl-clamped) ratio over every valid token and its standard error, from the buckets."""
    n = sum(b["tokens"] for b in table["buckets"])
    if n < 2:
        return math.nan, math.nan
    mean = sum(b["ratio_sum"] for b in table["buckets"]) / n
    variance = max(sum(b["chi2_terms"] for b in table["buckets"]) / n - mean * mean, 0.0) * n / (n - 1)
    return mean, math.sqrt(variance / n)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (exact for any n this test sees)."""
    if k <= 0:
        return 1.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
             + (n - i) * math.log1p(-p) for i in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def repeat_concentration(table: dict[str, Any]) -> dict[str, Any] | None:
    """With token ids in the dump: the share of repeats (an id seen earlier in its row) among all tokens and among
    those the trainer rates above the engine (ratio above 1), and the binomial chance of that many or more
    (None without ids or without such a token). Concentrated below REPEAT_P, a one-sided 5-sigma level."""
    n, up = table.get("id_tokens") or 0, table.get("id_tail_tokens") or 0
    if not n or not up:
        return None
    base, hits = table["repeated_tokens"] / n, table["repeated_tail_tokens"]
    chance = binomial_tail(hits, up, base)
    return {"repeated_fraction": base, "tail_repeated_fraction": hits / up, "tail_tokens": up, "p_value": chance,
            "concentrated": chance < REPEAT_P and hits / up > base}


def logit_processor(evidence: dict[str, Any], table: dict[str, Any]) -> list[Finding]:
    """A reweighting logit processor (penalty, logit bias): the uncapped identity holds, the capped mean does not."""
    capped, uncapped, spread = evidence["ratio_mean"], evidence["uncapped_ratio_mean"], \
        evidence["uncapped_ratio_mean_standard_error"]
    tail = sum(b["tokens"] for b in table["buckets"] if b["sign"] > 0 and b["low"] >= BULK_LOG_RATIO)
    evidence = {**evidence, "right_tail_tokens": tail}
    return [Finding(
        "logit_processor", "error",
        "the rollout sampled from a reweighted distribution the trainer never applies (a repetition / presence / "
        "frequency penalty or a logit bias)", evidence,
        f"Capped at e the token ratio averages {capped:.4g} ({evidence['z']:.3g} standard errors below 1), yet "
        f"uncapped it averages {uncapped:.4g} ± {spread:.2g}, the 1 it must be when the rollout side is the "
        f"distribution its tokens were sampled from (a truncation keeps it below 1 too): {tail} tokens lie above e, "
        f"the ones the processor pushed down and the sampler drew anyway, and "
        f"{percent(evidence['ratio_below_1_fraction'])} lie below 1, the ones it raised.{_repeats_text(evidence)}",
        fix="sample training rollouts without repetition / presence / frequency penalties or logit bias (or apply "
            "the same processor to the trainer's logits): the engine reports log-probs after them, the trainer "
            "scores the raw softmax")]


def _repeats_text(evidence: dict[str, Any]) -> str:
    repeats = evidence.get("repetition")
    if not repeats:
        return ""
    return (f" Of the {repeats['tail_tokens']} tokens the trainer rates above the engine, "
            f"{percent(repeats['tail_repeated_fraction'])} repeat a token earlier in their row, against "
            f"{percent(repeats['repeated_fraction'])} of all tokens"
            + (": a repetition penalty." if repeats["concentrated"] else "."))


__all__ = ["PENALTY_MIN_BELOW", "PROCESSED_MIN_BELOW", "logit_processor", "processed_logprobs", "repeat_concentration",
           "truncated_beyond_zeros", "uncapped_ratio"]
