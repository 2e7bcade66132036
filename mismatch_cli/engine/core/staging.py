"""Host buffers that a device chunk's reader batches are joined into, reused chunk after chunk.

Moving a joined chunk to a GPU used to copy its tokens twice on the host (the join, then `pin_memory()`)
and to page-lock a new buffer whenever a chunk's size was new: 25 ms a call for a 2^25-position chunk on
an H200, 40 % of the host time there. Joining straight into page-locked buffers that live for the run
leaves one host copy, and the copy to the device runs asynchronously from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mismatch_cli.engine.kernels.ops import host_tensor


class Staging:
    """Two sets of host buffers used in turn, page-locked on CUDA; a set is refilled once its copies are done."""

    def __init__(self, device: torch.device, positions: int) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self.positions = positions  # the largest usual chunk: a buffer grows by doubling up to it, then as needed
        self._sets: tuple[dict[str, np.ndarray], ...] = ({}, {})  # views of page-locked tensors kept alive by them
        self._copied: list[Any] = [None, None]  # per set: a CUDA event after the work that read it
        self._turn = 0

    def begin(self) -> None:
        """Take the next set of buffers, once the device is done with what it held (two chunks ago)."""
        self._turn ^= 1
        event = self._copied[self._turn]
        if event is not None:
            event.synchronize()  # recorded two chunks ago: long complete, since every chunk waits once itself
            self._copied[self._turn] = None

    def join(self, role: str, arrays: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
        """The arrays of one per-token role joined end to end, cast to `dtype`, in the current set's buffer."""
        dtype = np.dtype(dtype)
        size = sum(len(array) for array in arrays)
        nbytes = size * dtype.itemsize
        buffers = self._sets[self._turn]
        buffer = buffers.get(role)
        if buffer is None or buffer.size < nbytes:
            # Sized to the input at first (a small dump page-locks little), then doubled up to a full chunk.
            grown = min(2 * buffer.size, self.positions * dtype.itemsize) if buffer is not None else 0
            capacity = max(nbytes, grown, 1)
            # a numpy view holds its torch tensor (its base) alive; without CUDA, plain numpy memory
            buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=True).numpy() if self.pinned else \
                np.empty(capacity, dtype=np.uint8)
            buffers[role] = buffer
        out = buffer[:nbytes].view(dtype)
        target, start = torch.from_numpy(out), 0
        for array in arrays:
            target[start:start + len(array)].copy_(host_tensor(array))
            start += len(array)
        return out

    def end(self) -> None:
        """Mark the current set as read by everything queued on the device so far."""
        if self.pinned:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._copied[self._turn] = event
