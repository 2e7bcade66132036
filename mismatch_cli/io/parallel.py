"""Read ahead on a small thread pool (pyarrow releases the GIL), yielding batches in input order.

Work is cut into items (a parquet file's row groups in runs, or a whole file of another format); up to
`workers` items are read at once, each into a bounded queue, and the consumer drains them in order, so
results are identical to a serial read and memory stays bounded by workers x depth batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mismatch_cli.batch import Batch
from mismatch_cli.io.options import ReadOptions
from mismatch_cli.io.parquet import read_parquet, row_group_count

ROW_GROUPS_PER_ITEM = 2
_DONE = object()


@dataclass(frozen=True)
class WorkItem:
    """One unit of reading: a file, or a run of a parquet file's row groups."""

    path: str
    format: str
    row_groups: tuple[int, ...] | None = None


def plan(files: Sequence, row_groups_per_item: int = ROW_GROUPS_PER_ITEM) -> list[WorkItem]:
    """Cut the inputs into work items, in input order."""
    items: list[WorkItem] = []
    for file in files:
        count = row_group_count(file.path) if file.format == "parquet" else 0
        if count > row_groups_per_item:
            for start in range(0, count, row_groups_per_item):
                items.append(WorkItem(file.path, file.format, tuple(range(start, min(start + row_groups_per_item,
                                                                                     count)))))
        else:
            items.append(WorkItem(file.path, file.format))
    return items


def iter_batches_parallel(files: Sequence, options: ReadOptions,
                          read_file: Callable[[str, str, ReadOptions], Iterator[Batch]],
                          workers: int = 2, depth: int = 4) -> Iterator[Batch]:
    """Every input's Batches in input order, read ahead by `workers` threads."""
    items = plan(files)
    stop = threading.Event()

    def fill(item: WorkItem, out: queue.Queue) -> None:
        try:
            source = (read_parquet(item.path, options, item.row_groups) if item.row_groups is not None
                      else read_file(item.path, item.format, options))
            for batch in source:
                while not stop.is_set():
                    try:
                        out.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            out.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which re-raises it in order
            out.put(exc)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mismatch-read") as pool:
        queues: list[queue.Queue] = []
        try:
            for index in range(len(items)):
                while len(queues) < min(index + workers, len(items)):
                    q: queue.Queue = queue.Queue(maxsize=depth)
                    pool.submit(fill, items[len(queues)], q)
                    queues.append(q)
                current = queues[index]
                while True:
                    value = current.get()
                    if value is _DONE:
                        break
                    if isinstance(value, BaseException):
                        raise value
                    yield value
        finally:
            stop.set()
