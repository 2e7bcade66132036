"""Turn a reader Batch into device tensors over its valid tokens, once per chunk."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.config import SAFETY_BOUND
from mismatch_cli.engine.state import F64

SENTINEL_LOGPROB = -1e4


@dataclass
class Chunk:
    """Valid tokens of a chunk, grouped by row, with the per-row quantities every family shares.

    A token is valid when its mask is 1 and both log-probs are finite and above the sentinel
    bound; excluded tokens are counted in `quality` and then behave exactly like padding.
    """

    old: torch.Tensor  # [N_valid] compute dtype
    rollout: torch.Tensor  # [N_valid]
    row: torch.Tensor  # [N_valid] int64 row index within the chunk
    num_rows: int
    quality: dict[str, int]

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        """Unclamped token log-ratio log(pi_train / pi_rollout) = old - rollout."""
        return self.old - self.rollout

    @cached_property
    def log_ratio_safe(self) -> torch.Tensor:
        """Token log-ratio clamped to verl's safety bound [-20, 20]."""
        return self.log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)

    @cached_property
    def row_tokens(self) -> torch.Tensor:
        """Valid tokens per row, float64 [B] (0 for an empty row)."""
        counts = torch.bincount(self.row, minlength=self.num_rows)
        return counts.to(F64)

    @cached_property
    def row_valid(self) -> torch.Tensor:
        """Rows with at least one valid token, bool [B]."""
        return self.row_tokens > 0

    @cached_property
    def row_denominator(self) -> torch.Tensor:
        """verl's masked_mean denominator per row: count + 1e-8."""
        return self.row_tokens + 1e-8

    @cached_property
    def log_ratio_row_sum(self) -> torch.Tensor:
        """S_i: per-row sum of the unclamped log-ratio, float64 [B]."""
        return self.row_sum(self.log_ratio)

    @property
    def num_tokens(self) -> int:
        """Number of valid tokens."""
        return int(self.old.numel())

    def row_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row float64 sum of per-token values."""
        out = torch.zeros(self.num_rows, dtype=F64, device=values.device)
        return out.index_add_(0, self.row, values.to(F64))

    def row_mean(self, values: torch.Tensor) -> torch.Tensor:
        """verl's masked_mean along a row: sum / (count + 1e-8); 0 for an empty row."""
        return self.row_sum(values) / self.row_denominator

    def row_max(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row max over valid tokens (0 for an empty row, as verl's seq_max does)."""
        out = torch.full((self.num_rows,), -torch.inf, dtype=F64, device=values.device)
        out = out.scatter_reduce_(0, self.row, values.to(F64), reduce="amax", include_self=True)
        return torch.where(self.row_valid, out, torch.zeros_like(out))

    def row_any(self, flags: torch.Tensor) -> torch.Tensor:
        """Per-row: does any valid token carry the flag, bool [B]."""
        return self.row_sum(flags.to(F64)) > 0


def quality_counts(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, dict[str, int]]:
    """Valid-token mask after exclusions, and the data-quality counts of the chunk."""
    finite = np.isfinite(old) & np.isfinite(rollout)
    nonfinite = mask & ~finite
    with np.errstate(invalid="ignore"):
        sentinel = mask & finite & ((old <= SENTINEL_LOGPROB) | (rollout <= SENTINEL_LOGPROB))
        keep = mask & finite & ~sentinel
        positive = keep & ((old > 0) | (rollout > 0))
        one_side_zero = keep & ((old == 0) != (rollout == 0))
    counts = {
        "positions": int(mask.size),
        "masked_tokens": int(np.count_nonzero(mask)),
        "nonfinite_tokens": int(np.count_nonzero(nonfinite)),
        "sentinel_tokens": int(np.count_nonzero(sentinel)),
        "positive_logprob_tokens": int(np.count_nonzero(positive)),
        "one_side_zero_tokens": int(np.count_nonzero(one_side_zero)),
    }
    return keep, counts


def _tensor(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    with warnings.catch_warnings():
        # Arrow hands out read-only zero-copy arrays; we never write into them, so torch's warning is moot.
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device, dtype, non_blocking=device.type == "cuda")


def make_chunk(batch: Batch, device: torch.device, dtype: torch.dtype) -> Chunk:
    """Select the valid tokens of a batch and move them to the device in the compute dtype."""
    mask = batch.response_mask.astype(bool, copy=False)
    keep, counts = quality_counts(batch.old_log_probs, batch.rollout_log_probs, mask)
    lengths = np.diff(batch.offsets)
    row_of_position = np.repeat(np.arange(batch.num_rows, dtype=np.int64), lengths)
    if keep.all():
        old_np, rollout_np, row_np = batch.old_log_probs, batch.rollout_log_probs, row_of_position
    else:
        old_np, rollout_np, row_np = batch.old_log_probs[keep], batch.rollout_log_probs[keep], row_of_position[keep]
    return Chunk(
        old=_tensor(old_np, device, dtype),
        rollout=_tensor(rollout_np, device, dtype),
        row=_tensor(row_np, device),
        num_rows=batch.num_rows,
        quality=counts,
    )
