"""The shared formulas against their definitions, written out per token in float64 numpy."""

from __future__ import annotations

import math

import numpy as np

from mismatch_cli.engine.core.formulas import ess


def _verl_ess(weights: np.ndarray) -> float:
    # verl: 1 / masked_mean((w / (masked_mean(w) + 1e-8)) ** 2), token by token.
    return 1.0 / np.mean((weights / (weights.mean() + 1e-8)) ** 2)


def test_ess_matches_verl_per_token_definition() -> None:
    rng = np.random.default_rng(0)
    for weights in (rng.lognormal(0, 0.3, 1000), np.ones(17), np.array([0.0, 0.0, 5.0]), rng.uniform(0, 2, 3)):
        got = ess(float(weights.mean()), float((weights**2).mean()))
        assert math.isclose(got, _verl_ess(weights), rel_tol=1e-12)


def test_ess_of_all_zero_weights_is_nan_for_scalars_and_replicates() -> None:
    assert math.isnan(ess(0.0, 0.0))
    replicates = ess(np.array([1.0, 0.0, 0.5]), np.array([1.0, 0.0, 0.5]))
    assert math.isnan(replicates[1])
    assert math.isclose(replicates[0], (1 + 1e-8) ** 2) and math.isclose(replicates[2], (0.5 + 1e-8) ** 2 / 0.5)
