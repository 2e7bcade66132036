"""How the terminal and Markdown show an input path: readable at the width, the file name always whole.

Rule: a local path under the current working folder is shown relative to it; any other path as it was given
(absolute, `../…`, an `s3://` or `gs://` URI). When that is longer than the room it has, the middle folders
give way to `…`, keeping the first folders and those nearest the file: `/mnt/data/…/dumps/step_00012.parquet`.
The file name is never cut by `display_path`. A table column (`fit_path`) is the one exception: its numbers
come first, so when even `…/NAME` is wider than the column, the name's middle gives way too, keeping its
start and its end (the extension, a `:row` after it). JSON, CSV, HTML and JUnit keep every path whole, as the
report records it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

ELLIPSIS = "…"


def display_path(path: str, width: int | None = None) -> str:
    """`path` as a person reads it in `width` columns (None: no limit), by the rule of the module doc."""
    shown = _relative(path)
    if width is None or len(shown) <= width:
        return shown
    trail = "/" if shown.endswith("/") and shown != "/" else ""  # a folder given as `dumps/` keeps its slash
    parts = shown[: len(shown) - len(trail)].split("/")
    if len(parts) < 3:  # a bare name, or one folder and the name: nothing worth eliding
        return shown
    head, tail = 0, 1  # parts kept from the start and from the end (the file name)
    prefer_tail = True  # alternate: a folder next to the file, then one from the start
    while True:
        grown = [(head, tail + 1), (_next_head(parts, head), tail)]
        fitting = [(h, t) for h, t in (grown if prefer_tail else grown[::-1])
                   if h + t < len(parts) and len(_joined(parts, h, t) + trail) <= width]
        if not fitting:
            return _joined(parts, head, tail) + trail
        prefer_tail = fitting[0][1] == tail  # the head grew: the tail's turn next
        head, tail = fitting[0]


def fit_path(path: str, width: int) -> str:
    """`path` in a table column `width` wide: `display_path`, then, if the file name alone is wider, its middle
    cut to `…`, keeping its start and its extension (and a `:row` after it)."""
    shown = display_path(path, width)
    if len(shown) <= width or width < 3:
        return shown
    shown = shown.removeprefix(ELLIPSIS + "/")  # one `…` says that something is left out
    room = width - 1
    dot = shown.rfind(".")
    suffix = len(shown) - dot if dot > shown.rfind("/") else 0
    tail = min(max(room // 2, suffix), room - 1)  # keep at least one leading character
    return shown[: room - tail] + ELLIPSIS + shown[len(shown) - tail:]


def paths_in_text(text: str, paths: Iterable[str], width: int | None = None) -> str:
    """`text` (a warning, a finding) with each of `paths` in it shown by `display_path`."""
    for path in sorted(set(paths), key=len, reverse=True):
        shown = display_path(path, width)
        if shown != path:
            text = text.replace(path, shown)
    return text


def _relative(path: str) -> str:
    if "://" in path:
        return path
    try:
        here = os.getcwd()
        absolute = os.path.abspath(path)
        if os.path.commonpath([absolute, here]) != here or absolute == here:
            return path
    except (OSError, ValueError):  # no working folder any more, or another drive (Windows)
        return path
    relative = os.path.relpath(absolute, here).replace(os.sep, "/")
    return relative + "/" if path.endswith(("/", os.sep)) else relative


def _next_head(parts: list[str], head: int) -> int:
    """One more leading part, taking the empty parts of `/` and `s3://` along with their neighbours."""
    head += 1
    while head < len(parts) and (parts[head - 1] == "" or parts[head] == ""):
        head += 1
    return head


def _joined(parts: list[str], head: int, tail: int) -> str:
    return "/".join([*parts[:head], ELLIPSIS, *parts[len(parts) - tail:]])


__all__ = ["ELLIPSIS", "display_path", "fit_path", "paths_in_text"]
