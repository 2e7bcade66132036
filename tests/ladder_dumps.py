"""Batches for the trainers' correction-mapping tests (tests/trainers/): rows whose log-ratios reach every threshold
of the what-if ladder, and the ladder's rows as the mappings take them."""

from __future__ import annotations

import numpy as np

from mismatch_cli.engine.accumulators.whatif import LADDER

ROWS = [{"name": s.name, "family": s.family, "level": s.level, "threshold": s.threshold, "option": s.option}
        for s in LADDER]


def batch(rows: int = 60, width: int = 48, seed: int = 11,
          veto_band: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and rollout log-probs and a 0/1 mask: rows near-identical, close, or far apart, with a few outliers (one
    below log(1e-4) every 7th row, one above every TIS cap every 11th; `veto_band` adds one between log(1e-4) and
    log(1e-3), which one veto drops and the other keeps)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, width + 1, rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    rollout = -rng.exponential(1.5, (rows, width))
    scale = np.array([1e-4, 4e-3, 0.35])[np.arange(rows) % 3][:, None]
    delta = rng.normal(0.0, 1.0, (rows, width)) * scale
    spikes = (rng.random((rows, width)) < 0.03) & (scale > 0.1)
    delta += spikes * rng.choice([-1.0, 1.0], (rows, width)) * rng.uniform(1.0, 3.0, (rows, width))
    delta[np.arange(rows) % 7 == 0, 1] = -12.0  # below log(1e-4): both vetoes drop the row
    if veto_band:
        delta[np.arange(rows) % 7 == 3, 2] = -8.0  # between log(1e-4) and log(1e-3)
    delta[np.arange(rows) % 11 == 5, 3] = 3.0  # above every TIS cap
    return rollout + delta, rollout, mask.astype(np.int8)
