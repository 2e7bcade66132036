"""Segment primitives over flat token arrays: numpy on the CPU (several times faster there), torch elsewhere."""

from __future__ import annotations

import numpy as np
import torch

F64 = torch.float64


def total(values: torch.Tensor) -> torch.Tensor:
    """Float64 sum of every element as a 0-d tensor: float32 values are accumulated in float64, counts exactly.

    Every sum that crosses a chunk boundary goes through here, so a result never depends on how the
    dump was split into files, row groups or chunks (a float32 partial sum would).
    """
    if not values.is_floating_point():
        return values.sum().to(F64)  # bool / integer: an exact int64 count
    if values.device.type == "cpu":
        # numpy casts buffer by buffer: no float64 copy of the tokens (torch's sum(dtype=) makes one).
        return torch.tensor(np.add.reduce(values.numpy().reshape(-1), dtype=np.float64), dtype=F64)
    return values.sum(dtype=F64)



def segment_sum(values: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sums of consecutive segments of `values` with the given lengths (0 for an empty segment).

    `dtype` is the accumulation dtype (e.g. float64 sums of float32 values) without a converted copy.
    """
    if values.device.type != "cpu":
        return torch.segment_reduce(values if dtype is None else values.to(dtype), "sum", lengths=lengths,
                                    unsafe=True)
    # reduceat needs strictly increasing starts, so empty segments are left out and stay 0.
    counts = lengths.numpy()
    array = values.numpy()
    out_dtype = array.dtype if dtype is None else torch.empty(0, dtype=dtype).numpy().dtype
    if array.dtype == np.bool_:
        array = array.astype(out_dtype)
    out = np.zeros(counts.size, dtype=out_dtype)
    nonempty = counts > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(counts[:-1])))[nonempty]
        out[nonempty] = np.add.reduceat(array, starts, dtype=out_dtype)
    return torch.from_numpy(out)


def repeat_segments(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each segment's value repeated over its tokens (int32)."""
    if values.device.type != "cpu":
        return torch.repeat_interleave(values.to(torch.int32), lengths)
    return torch.from_numpy(np.repeat(values.numpy().astype(np.int32), lengths.numpy()))


def count_in_segments(flags: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """How many flagged tokens each segment holds, for flags that are rare (float64)."""
    if flags.device.type != "cpu":
        positions = torch.nonzero(flags).flatten()
        segment = torch.searchsorted(torch.cumsum(lengths, 0), positions, right=True)
        return torch.bincount(segment, minlength=lengths.numel()).to(torch.float64)
    positions = np.flatnonzero(flags.numpy())
    segment = np.searchsorted(np.cumsum(lengths.numpy()), positions, side="right")
    return torch.from_numpy(np.bincount(segment, minlength=lengths.numel()).astype(np.float64))
