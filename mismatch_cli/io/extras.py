"""Optional per-row and per-token columns that are evidence, not metrics: policy versions and token ids.

A column here is io.validate's Column (values, offsets, nulls). Neither is checked as strictly as the log-probs:
token ids of another length than the log-prob lists cannot be aligned, so they are left out (the repetition
evidence is then not measured).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def row_versions(column: Any, rows: int) -> np.ndarray:
    """float64 [rows]: each row's policy version (per token: the oldest one >= 0), NaN where unknown."""
    values = np.asarray(column.values, dtype=np.float64)
    if column.nulls is not None:
        values = np.where(column.nulls, np.nan, values)
    if column.offsets is None:
        return values.copy()
    values = np.where(values >= 0, values, np.inf)  # AReaL stamps -1 on prompt tokens
    offsets = np.asarray(column.offsets, dtype=np.int64)
    out = np.full(rows, np.inf)
    filled = offsets[1:] > offsets[:-1]
    if filled.any():
        out[filled] = np.minimum.reduceat(values, offsets[:-1][filled]) if values.size else np.inf
    out[~np.isfinite(out)] = np.nan
    return out


def token_ids_per_position(column: Any, row_offsets: np.ndarray) -> np.ndarray | None:
    """int64 token ids over a chunk's positions, or None when the lists do not line up with the log-probs."""
    if column.offsets is None or not np.array_equal(np.asarray(column.offsets), np.asarray(row_offsets)):
        return None
    values = np.asarray(column.values)
    if values.dtype.kind not in "iu" or column.nulls is not None:
        return None
    return values.astype(np.int64, copy=False)


__all__ = ["row_versions", "token_ids_per_position"]
