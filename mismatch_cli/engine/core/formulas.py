"""Formulas several accumulators share, each written once: the chi-squared divergence and verl's ESS.

The terms are tensors over a chunk's tokens or rows; `chi2` turns their (float64) sums into the metric
and works as well on a float as on a numpy array of bootstrap replicates, so every report of chi2_token
or chi2_seq (overall, per round, bootstrap intervals) is the same arithmetic.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import torch

from mismatch_cli.correction import SAFETY_BOUND

Number = TypeVar("Number", float, np.ndarray)


def chi2_token_terms(ratio_safe: torch.Tensor) -> torch.Tensor:
    """chi2_token's per-token term: the square of the safety-clamped ratio."""
    return ratio_safe.square()


def chi2_seq_terms(log_ratio_row_sum: torch.Tensor) -> torch.Tensor:
    """chi2_seq's per-row term: exp(2 clamp(S_i, -20, 20)), the square of the clamped sequence ratio."""
    return torch.exp(2.0 * log_ratio_row_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def chi2(sum_of_terms: Number, count: Number) -> Number:
    """E[rho^2] - 1 from the summed terms and the count they are averaged over (verl's chi2_token / chi2_seq)."""
    return sum_of_terms / count - 1.0


def ess(mean: Number, mean_sq: Number) -> Number:
    """verl's ESS 1 / MM((w / (MM(w) + 1e-8))^2) from the token-means of w and w^2; NaN when all w are 0.

    verl raises ZeroDivisionError there; the ratio is written as (MM(w) + 1e-8)^2 / MM(w^2).
    """
    if isinstance(mean_sq, np.ndarray):
        return (mean + 1e-8) ** 2 / np.where(mean_sq > 0, mean_sq, np.nan)
    return (mean + 1e-8) ** 2 / mean_sq if mean_sq > 0 else math.nan


__all__ = ["chi2", "chi2_seq_terms", "chi2_token_terms", "ess"]
