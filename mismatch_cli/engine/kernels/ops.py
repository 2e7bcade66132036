"""Primitives over flat token arrays on any device: numpy kernels on the CPU (several times faster there
than torch's on one thread), torch elsewhere; none of them waits for the device (no host round trip).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

F64 = torch.float64
MAX_CHUNK_POSITIONS = 1 << 20  # the CPU's chunk: bounds every per-token temporary to a few MB
_NUMPY_ON_CPU = [True]


def numpy_kernels(where: torch.Tensor | torch.device) -> bool:
    """True where numpy's kernels run: a CPU tensor or device, unless `torch_kernels_on_cpu` is in effect."""
    device = where.device if isinstance(where, torch.Tensor) else where
    return device.type == "cpu" and _NUMPY_ON_CPU[0]


@contextmanager
def torch_kernels_on_cpu() -> Iterator[None]:
    """Run the device path's torch kernels on the CPU too (for tests: CI has no GPU to run them)."""
    _NUMPY_ON_CPU[0] = False
    try:
        yield
    finally:
        _NUMPY_ON_CPU[0] = True


def total(values: torch.Tensor) -> torch.Tensor:
    """Float64 sum of every element as a 0-d tensor: float32 values are accumulated in float64, counts exactly.

    Every sum that crosses a chunk boundary goes through here, so a result never depends on how the
    dump was split into files, row groups or chunks (a float32 partial sum would).
    """
    if not values.is_floating_point():
        if values.dtype == torch.bool and numpy_kernels(values):
            return torch.tensor(float(np.count_nonzero(values.numpy())), dtype=F64)  # ~10x torch's bool sum
        return values.sum().to(F64)  # bool / integer: an exact int64 count
    if numpy_kernels(values):
        # numpy casts buffer by buffer: no float64 copy of the tokens (torch's sum(dtype=) makes one).
        return torch.tensor(np.add.reduce(values.numpy().reshape(-1), dtype=np.float64), dtype=F64)
    return values.sum(dtype=F64)


def exclusive_cumsum(flags: torch.Tensor) -> torch.Tensor:
    """int64 [n + 1]: element i is how many of flags[:i] are set (or their sum, for integers)."""
    if numpy_kernels(flags):
        out = np.zeros(flags.numel() + 1, dtype=np.int64)
        np.cumsum(flags.numpy(), dtype=np.int64, out=out[1:])
        return torch.from_numpy(out)
    out = torch.zeros(flags.numel() + 1, dtype=torch.int64, device=flags.device)
    torch.cumsum(flags, 0, out=out[1:])
    return out


def flag_indices(flags: torch.Tensor, count: int) -> torch.Tensor:
    """int64 indices of the `count` set flags (count known on the host: no device sync to size the result)."""
    if numpy_kernels(flags):
        return torch.from_numpy(np.flatnonzero(flags.numpy()))
    return torch.nonzero_static(flags, size=count).flatten()


def bincount(index: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[size]: how often each value occurs in a non-negative integer index whose values are all < size (int64),
    or the float64 sum of `weights` per value.

    On a device by atomic adds into the fixed size: torch's bincount reads the index's extremes on the host.
    """
    if numpy_kernels(index):
        return torch.bincount(index, weights=None if weights is None else weights.to(F64), minlength=size)
    if weights is None:
        ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())
        return torch.zeros(size, dtype=torch.int64, device=index.device).index_add_(0, index, ones)
    return torch.zeros(size, dtype=F64, device=index.device).index_add_(0, index, weights.to(F64))


def segment_sum(values: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sums of consecutive segments of `values` with the given lengths (0 for an empty segment).

    `dtype` is the accumulation dtype (e.g. float64 sums of float32 values) without a converted copy.
    """
    if not numpy_kernels(values):
        return segment_sum_torch(values, lengths, dtype)
    # reduceat needs strictly increasing starts, so empty segments are left out and stay 0.
    counts = lengths.numpy()
    array = values.numpy()
    out_dtype = array.dtype if dtype is None else torch.empty(0, dtype=dtype).numpy().dtype
    if array.dtype == np.bool_:
        array = array.view(np.int8) if out_dtype != np.bool_ else array
        out_dtype = np.int64 if dtype is None else out_dtype
    out = np.zeros(counts.size, dtype=out_dtype)
    nonempty = counts > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(counts[:-1])))[nonempty]
        out[nonempty] = np.add.reduceat(array, starts, dtype=out_dtype)
    return torch.from_numpy(out)


def segment_sum_torch(values: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`segment_sum` in torch kernels only (the path on a device), exact for bool and integer values."""
    out_dtype = dtype or (torch.int64 if values.dtype == torch.bool else values.dtype)
    if not out_dtype.is_floating_point:
        # torch's segment_reduce has no integer kernel on CUDA: differences of a prefix count are exact.
        before = exclusive_cumsum(values)
        ends = torch.cumsum(lengths, 0)
        return (before[ends] - before[ends - lengths]).to(out_dtype)
    return torch.segment_reduce(values.to(out_dtype), "sum", lengths=lengths, unsafe=True)


def segment_count(flags: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """How many set flags (bool) each consecutive segment holds, int64."""
    if numpy_kernels(flags):
        return segment_sum(flags, lengths)
    before = exclusive_cumsum(flags)
    ends = torch.cumsum(lengths, 0)
    return before[ends] - before[ends - lengths]


def segment_max(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-segment max in float64 (0 for an empty segment)."""
    if not numpy_kernels(values):
        out = torch.segment_reduce(values.to(F64), "max", lengths=lengths, unsafe=True)
        return torch.where(lengths > 0, out, torch.zeros_like(out))
    counts = lengths.numpy()
    out = np.zeros(counts.size, dtype=np.float64)
    nonempty = counts > 0
    if nonempty.any():
        starts = np.concatenate(([0], np.cumsum(counts[:-1])))[nonempty]
        out[nonempty] = np.maximum.reduceat(values.numpy(), starts)
    return torch.from_numpy(out)


def repeat_segments(values: torch.Tensor, lengths: torch.Tensor, total_length: int) -> torch.Tensor:
    """Each segment's value repeated over its `total_length` tokens (int32)."""
    if not numpy_kernels(values):
        return torch.repeat_interleave(values.to(torch.int32), lengths, output_size=total_length)
    return torch.from_numpy(np.repeat(values.numpy().astype(np.int32), lengths.numpy()))


def count_in_segments(flags: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """How many flagged tokens each segment holds (float64)."""
    if not numpy_kernels(flags):
        return segment_sum(flags.to(F64), lengths)
    # Flags are rare: locate them instead of summing every segment.
    positions = np.flatnonzero(flags.numpy())
    segment = np.searchsorted(np.cumsum(lengths.numpy()), positions, side="right")
    return torch.from_numpy(np.bincount(segment, minlength=lengths.numel()).astype(np.float64))


def count(flags: torch.Tensor) -> torch.Tensor:
    """How many flags are set, as a 0-d int64 tensor on their device."""
    if numpy_kernels(flags):
        return torch.tensor(np.count_nonzero(flags.numpy()), dtype=torch.int64)
    return torch.count_nonzero(flags)


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index] for a 1-D int64 index (numpy's take on the CPU)."""
    if numpy_kernels(values):
        return torch.from_numpy(np.take(values.numpy(), index.numpy()))
    return values[index]


def isfinite(values: torch.Tensor) -> torch.Tensor:
    """Elementwise isfinite (numpy's on the CPU: several times faster than torch's there)."""
    if numpy_kernels(values):
        return torch.from_numpy(np.isfinite(values.numpy()))
    return torch.isfinite(values)


_SCRATCH: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over a numpy array, without a copy when it is contiguous (Arrow's read-only arrays included)."""
    with warnings.catch_warnings():
        # Arrow hands out read-only zero-copy arrays; we never write into them, so torch's warning is moot.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(array))


def scratch(name: str, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reused 1-D work buffer of `size` elements: fresh per-chunk temporaries cost page faults every time.

    Updates run one at a time and never keep a buffer past their return, so all accumulators share them.
    """
    key = (name, dtype, device)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = torch.empty(max(size, MAX_CHUNK_POSITIONS), dtype=dtype, device=device)
        _SCRATCH[key] = buffer
    return buffer[:size]
