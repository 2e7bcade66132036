"""How the process runs: Python's cycle collector while the engine loads, and, in the CLI, the allocators.

`import torch` creates about a million objects that all live until the process ends. The collector walks them
several times while they load (about 0.3 s of a 1.5 s import on the 2-core machine), then again at every full
collection of the run, and in a `--jobs` worker each walk writes to memory pages shared with the parent, which the
kernel then copies. So the engine loads with the collector paused; in the CLI, what has loaded is then frozen out
of later collections (`gc.freeze`, as Python's docs advise before a fork).

Each chunk allocates a few dozen per-token arrays of 1-8 MiB. glibc returns such memory to the system once more
than a few MiB are free at the top of its heap, and the next chunk's arrays then fault in fresh zeroed pages: about
half the page faults of a 100M-token run (0.2-0.4 s of system time). The CLI keeps up to TRIM_BYTES free for reuse.

pyarrow decodes into its own pool (mimalloc), which hands a batch's freed pages back to the system within
milliseconds, so the next batch faults in fresh zeroed pages again: about a fifth of the page faults of a read, and
5-8 % of its CPU time. The CLI asks mimalloc to keep them (MIMALLOC_PURGE_DELAY=-1, unless set), which holds about
one batch's decoded columns per reading thread.

numpy's OpenBLAS starts a pool of threads per process that spin for a while after each call it spreads over
them (a float64 dot product of a chunk's tail tokens, in the signatures' evidence); with `--jobs N`, N processes
would each run such a pool. The CLI asks for one BLAS thread, unless OPENBLAS_NUM_THREADS says otherwise.

A library caller keeps its process as it was: the collector paused only during the import, nothing frozen, the
allocator and BLAS threads untouched.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_FREEZE = [False]

# glibc's mallopt parameters (malloc.h), and the values the CLI sets: blocks up to MMAP_BYTES come from the heap
# (glibc's own upper bound for the threshold on 64-bit), and up to TRIM_BYTES of free heap stay mapped.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_BYTES = 32 << 20
TRIM_BYTES = 256 << 20


def one_command_process() -> bool:
    """Tune this process for one command and exit (the CLI), before numpy and pyarrow load: `loading` freezes what
    loaded, one BLAS thread, glibc and pyarrow's mimalloc keep freed memory for reuse; True when glibc took the
    allocator's settings."""
    _FREEZE[0] = True
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "-1")  # read once, when pyarrow's library loads
    return _keep_freed_memory()


def _keep_freed_memory() -> bool:
    """glibc's allocator: blocks below MMAP_BYTES from its heap, up to TRIM_BYTES of free heap kept (not elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # musl and others: not glibc's allocator
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    # The mmap threshold first: setting either one turns off glibc's own adjustment of both.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))


def worker_process() -> None:
    """In a process forked to work for this one: Ctrl-C and SIGTERM are the parent's to handle (it stops its workers,
    and says so in one line), and on Linux the process dies with its parent, never left blocked on a hand-over
    nobody reads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler, inherited by the fork
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


@contextmanager
def loading() -> Iterator[None]:
    """Run the block (imports) with the cycle collector paused, then restore it; in the CLI, freeze what loaded.

    Only a block that loaded modules freezes: a later analysis in the same process (`compare` reads several runs)
    imports nothing new, and freezing then would keep its predecessors' uncollected cycles for good.
    """
    enabled = gc.isenabled()
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if _FREEZE[0] and len(sys.modules) > modules:
            gc.freeze()
        if enabled:
            gc.enable()


__all__ = ["MMAP_BYTES", "TRIM_BYTES", "loading", "one_command_process", "worker_process"]
