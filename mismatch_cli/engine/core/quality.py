"""Data quality of a chunk's tokens: which are excluded (non-finite, sentinel fills) or flagged, and examples.

The same expressions run on numpy arrays (the host) and on torch tensors (any device).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.engine.kernels.ops import isfinite
from mismatch_cli.engine.kernels.sweep import QUALITY_CATEGORIES

# Fill values such as -9999 (or -1e4, finfo.min) are no log-prob of a sampled token; -9000 also
# catches -9999 after bf16 rounding (-9984).
SENTINEL_LOGPROB = -9000.0


def quality_counts(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, dict[str, int]]:
    """Valid-token mask after exclusions, and the data-quality counts of the chunk (host arrays)."""
    keep, flags = quality_flags(old, rollout, mask)
    counts = {"positions": int(mask.size), "masked_tokens": int(np.count_nonzero(mask))}
    counts.update({category: int(np.count_nonzero(flag)) for category, flag in flags.items()})
    return keep, counts


# Which categories are excluded from every metric; the others are counted and kept (SPEC §2.5): a
# probability of exactly 1 (log-prob 0.0) is legitimate for a confident token in bf16, and a tiny
# positive log-prob is fp rounding in log-softmax, so dropping them would bias the metrics.
EXCLUDED_CATEGORIES = ("nonfinite_tokens", "sentinel_tokens")


def quality_flags(old: Any, rollout: Any, mask: Any) -> tuple[Any, dict[str, Any]]:
    """Valid-token mask after exclusions, and one bool array per data-quality category.

    The same expressions for numpy arrays (host) and torch tensors (any device); NaN compares False.
    """
    if isinstance(old, torch.Tensor):
        finite = isfinite(old) & isfinite(rollout)
    else:
        finite = np.isfinite(old) & np.isfinite(rollout)
    nonfinite = mask & ~finite
    with np.errstate(invalid="ignore"):
        sentinel = mask & finite & ((old <= SENTINEL_LOGPROB) | (rollout <= SENTINEL_LOGPROB))
        keep = mask & finite & ~sentinel
        positive = keep & ((old > 0) | (rollout > 0))
        one_side_zero = keep & ((old == 0) != (rollout == 0))
    flags = {
        "nonfinite_tokens": nonfinite,
        "sentinel_tokens": sentinel,
        "positive_logprob_tokens": positive,
        "one_side_zero_tokens": one_side_zero,
    }
    return keep, flags


def quality_examples(batch: Batch, categories: Iterable[str], limit: int) -> dict[str, list[dict[str, Any]]]:
    """The first `limit` flagged tokens of each category: file, row in the file, position in the row, values."""
    _, flags = quality_flags(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask.astype(bool))
    found: dict[str, list[dict[str, Any]]] = {}
    for category in categories:
        positions = np.flatnonzero(flags[category])[:limit]
        if len(positions) == 0:
            continue
        rows = np.searchsorted(batch.offsets, positions, side="right") - 1
        numbers = batch.row_numbers()
        examples = []
        for position, row in zip(positions.tolist(), rows.tolist(), strict=True):  # at most `limit` of them
            example: dict[str, Any] = {
                "file": batch.source,
                "row": int(numbers[row]),
                "position": position - int(batch.offsets[row]),
                "old_log_prob": float(batch.old_log_probs[position]),
                "rollout_log_prob": float(batch.rollout_log_probs[position]),
            }
            if batch.sequence_ids is not None:
                value = batch.sequence_ids[row]
                example["id"] = value.item() if isinstance(value, np.generic) else value
            examples.append(example)
        found[category] = examples
    return found


__all__ = ["EXCLUDED_CATEGORIES", "QUALITY_CATEGORIES", "SENTINEL_LOGPROB", "quality_counts", "quality_examples",
           "quality_flags"]
