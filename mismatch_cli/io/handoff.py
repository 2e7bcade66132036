"""Batches handed from one process to another through a file in shared memory (`/dev/shm`), without a copy.

The writer pickles the Batches with their arrays out of band (pickle protocol 5) and writes each array's bytes
64-byte aligned after the pickle; the reader maps the file copy-on-write, removes it, and rebuilds the Batches over
the mapping, so the arrays are writable and equal to the written ones bit for bit, and the memory goes back to the
system once the last of them is collected.
"""

from __future__ import annotations

import mmap
import os
import pickle
from collections.abc import Iterable

from ..batch import Batch

_ALIGN = 64
_LENGTH = 8  # the little-endian byte count of the pickled header that starts the file


def _padding(offset: int) -> int:
    return -offset % _ALIGN


def write_batches(batches: Iterable[Batch], path: str) -> int:
    """Write Batches to a new file at `path` (removed again if the write fails); the bytes written."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(list(batches), protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    header = pickle.dumps((payload, [view.nbytes for view in views]), protocol=5)
    try:
        with open(path, "xb") as out:
            offset = out.write(len(header).to_bytes(_LENGTH, "little")) + out.write(header)
            for view in views:
                offset += out.write(bytes(_padding(offset)))
                offset += out.write(view)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    return offset


def load_batches(path: str) -> list[Batch]:
    """The Batches of a file write_batches wrote, over a private mapping of it; the file is removed."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(descriptor, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(descriptor)
        os.unlink(path)
    view = memoryview(mapping)
    start = _LENGTH + int.from_bytes(view[:_LENGTH], "little")
    payload, sizes = pickle.loads(view[_LENGTH:start])
    buffers = []
    for size in sizes:
        start += _padding(start)
        buffers.append(view[start:start + size])
        start += size
    return pickle.loads(payload, buffers=buffers)


__all__ = ["load_batches", "write_batches"]
