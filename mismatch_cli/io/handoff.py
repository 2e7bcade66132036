"""Batches handed from one process to another through a file in shared memory (`/dev/shm`), without a copy.

The writer appends one record per Batch, as it comes: the Batch pickled with its arrays out of band (pickle
protocol 5), then each array's bytes, 64-byte aligned in the file. The reader maps the file copy-on-write, removes
it, and rebuilds the Batches over the mapping, so the arrays are writable and equal to the written ones bit for bit,
and the memory goes back to the system once the last of them is collected.
"""

from __future__ import annotations

import mmap
import os
import pickle
from collections.abc import Iterable

from ..batch import Batch

_ALIGN = 64
_LENGTH = 8  # the little-endian byte count of the pickled header that starts each record


def _padding(offset: int) -> int:
    return -offset % _ALIGN


def write_batches(batches: Iterable[Batch], path: str, limit: int | None = None) -> int | None:
    """Write Batches to a new file at `path`, one at a time; the bytes written, or None (and no file) once they
    would pass `limit`. The file is removed again if the write fails."""
    offset = 0
    try:
        with open(path, "xb") as out:
            for batch in batches:
                buffers: list[pickle.PickleBuffer] = []
                payload = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
                views = [buffer.raw() for buffer in buffers]
                header = pickle.dumps((payload, [view.nbytes for view in views]), protocol=5)
                offset += out.write(len(header).to_bytes(_LENGTH, "little")) + out.write(header)
                for view in views:
                    offset += out.write(bytes(_padding(offset)))
                    offset += out.write(view)
                if limit is not None and offset > limit:
                    raise _TooLarge
    except BaseException as exc:
        try:
            os.unlink(path)
        except OSError:
            pass
        if isinstance(exc, _TooLarge):
            return None
        raise
    return offset


class _TooLarge(Exception):
    pass


def load_batches(path: str) -> list[Batch]:
    """The Batches of a file write_batches wrote, over a private mapping of it; the file is removed."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(descriptor).st_size
        mapping = mmap.mmap(descriptor, 0, access=mmap.ACCESS_COPY) if size else None
    finally:
        os.close(descriptor)
        os.unlink(path)
    if mapping is None:
        return []
    view = memoryview(mapping)
    batches, start = [], 0
    while start < size:
        end = start + _LENGTH + int.from_bytes(view[start:start + _LENGTH], "little")
        payload, sizes = pickle.loads(view[start + _LENGTH:end])
        buffers = []
        for length in sizes:
            end += _padding(end)
            buffers.append(view[end:end + length])
            end += length
        batches.append(pickle.loads(payload, buffers=buffers))
        start = end
    return batches


__all__ = ["load_batches", "write_batches"]
