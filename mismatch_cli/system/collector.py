"""Python's cycle collector while the engine loads.

`import torch` creates about a million objects that all live until the process ends. The collector walks them
several times while they load (about 0.3 s of a 1.5 s import on the 2-core machine), then again at every full
collection of the run, and in a `--jobs` worker each walk writes to memory pages shared with the parent, which the
kernel then copies. So the engine loads with the collector paused; in the CLI, a process that exits after one
command, what has loaded is then frozen out of later collections (`gc.freeze`, as Python's docs advise before a
fork). A library caller keeps its collector as it was: paused only during the import, nothing frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_FREEZE = [False]


def freeze_after_loading() -> None:
    """Mark this process as one that exits after one command (the CLI): `loading` then freezes what loaded."""
    _FREEZE[0] = True


@contextmanager
def loading() -> Iterator[None]:
    """Run the block (imports) with the cycle collector paused, then restore it; in the CLI, freeze what loaded."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _FREEZE[0]:
            gc.freeze()
        if enabled:
            gc.enable()


__all__ = ["freeze_after_loading", "loading"]
