"""Read ahead on a few threads (pyarrow releases the GIL), yielding batches in input order.

Work is cut into items (a parquet file's row groups in runs of about ITEM_BYTES uncompressed, or a whole
file of another format); up to `workers` items are read at once, each into a bounded queue, and the consumer
drains them in order, so results are identical to a serial read and memory stays bounded by workers x depth
batches. The same items are the engine's shards: each folds into a partial state of its own, merged in input
order, whether one process folds them, `--jobs N` worker processes or a Ray cluster (api.py), so every number
is the same however many processes ran.

Cancellation always reaches the readers: every hand-over to the consumer waits with a timeout and
gives up once the consumer has stopped (an error, a signal, the iterator closed), and the
reader threads are daemons, so no blocked reader can keep the process from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from mismatch_cli.batch import Batch
from mismatch_cli.io.discover import sha256_file
from mismatch_cli.io.options import ReadOptions
from mismatch_cli.io.parquet import row_group_bytes

ITEM_BYTES = 64 << 20  # a work item's row groups hold at least this much uncompressed data (or the whole file)
TAIL_FROM_BYTES, TAIL_SHARE, TAIL_SPLIT = 256 << 20, 0.1, 4  # the last tenth of a large input in quarter items
_DONE = object()
_FINISHED: queue.Queue = queue.Queue()
_POLL_S = 0.05
_JOIN_S = 5.0


@dataclass(frozen=True)
class WorkItem:
    """One unit of reading: a file, or a run of a parquet file's row groups."""

    path: str
    format: str
    row_groups: tuple[int, ...] | None = None


def plan(files: Sequence, item_bytes: int | None = None) -> list[WorkItem]:
    """Cut the inputs into work items, in input order: a parquet file into runs of row groups that each reach
    `item_bytes` (default ITEM_BYTES) uncompressed (the last run takes the rest), any other file whole. On an input
    of TAIL_FROM_BYTES or more, the last TAIL_SHARE of it is cut TAIL_SPLIT times finer, so that processes sharing
    the items finish together (whatever their number: the plan never depends on it)."""
    item_bytes = item_bytes or ITEM_BYTES
    sizes = [row_group_bytes(file.path) if file.format == "parquet" else [] for file in files]
    total = sum(sum(groups) for groups in sizes)
    tail_from = total * (1 - TAIL_SHARE) if total >= TAIL_FROM_BYTES else total
    items: list[WorkItem] = []
    seen = 0
    for file, groups in zip(files, sizes, strict=True):
        runs: list[list[int]] = [[]]
        held = 0
        for index, size in enumerate(groups):
            if held >= (item_bytes if seen < tail_from else max(1, item_bytes // TAIL_SPLIT)):
                runs.append([])
                held = 0
            runs[-1].append(index)
            held += size
            seen += size
        if len(runs) > 1:
            items += [WorkItem(file.path, file.format, tuple(run)) for run in runs]
        else:
            items.append(WorkItem(file.path, file.format))
    return items


def iter_batches_parallel(files: Sequence, options: ReadOptions,
                          read_file: Callable[..., Iterator[Batch]],
                          workers: int = 2, depth: int = 4) -> ReadAhead:
    """Every input's Batches in input order, read ahead by `workers` threads that start at once.

    `read_file(path, format, options[, row_groups])` is the package's read path (decoder, then validator), so
    every Batch handed over here is checked; a parquet item's row groups are passed as a fourth argument.
    The first items are read from this call on, so a caller can import the engine (torch) meanwhile.
    """
    return ReadAhead(plan(files), options, read_file, workers, depth)


def tagged(batches: ReadAhead) -> Iterator[tuple[int, Batch]]:
    """Each batch with the index of its work item (plan's order), read ahead."""
    for batch in batches:
        yield batches.item_index, batch


def _hand_over(stop: threading.Event, out: queue.Queue, value: object) -> bool:
    # Never block for good: a consumer that stopped reading will not drain this queue.
    while not stop.is_set():
        try:
            out.put(value, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _fill(stop: threading.Event, read_file: Callable[..., Iterator[Batch]], options: ReadOptions, item: WorkItem,
          out: queue.Queue) -> None:
    try:
        source = (read_file(item.path, item.format, options) if item.row_groups is None
                  else read_file(item.path, item.format, options, item.row_groups))
        try:
            for batch in source:
                if not _hand_over(stop, out, batch):
                    return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # the reader's files are closed as soon as it stops, not when it is collected
        _hand_over(stop, out, _DONE)
    except BaseException as exc:  # handed to the consumer, which re-raises it in order
        _hand_over(stop, out, exc)


class ReadAhead(Iterator[Batch]):
    """The read-ahead threads and their queues, drained in input order; `close()` stops every thread."""

    def __init__(self, items: list[WorkItem], options: ReadOptions, read_file: Callable[..., Iterator[Batch]],
                 workers: int, depth: int) -> None:
        self._items, self._options, self._read_file = items, options, read_file
        self._workers, self._depth = workers, depth
        self._stop = threading.Event()
        self._queues: list[queue.Queue] = []
        self._threads: list[threading.Thread] = []
        self._index = 0
        self.item_index = -1  # the work item of the last batch handed over
        self._start_readers()

    def _start_readers(self) -> None:
        while len(self._queues) < min(self._index + self._workers, len(self._items)):
            q: queue.Queue = queue.Queue(maxsize=self._depth)
            # The threads hold no reference to self, so a reader dropped unread is collected and stops them.
            args = (self._stop, self._read_file, self._options, self._items[len(self._queues)], q)
            thread = threading.Thread(target=_fill, args=args, daemon=True, name=f"mismatch-read-{len(self._queues)}")
            thread.start()
            self._queues.append(q)
            self._threads.append(thread)

    def __next__(self) -> Batch:
        try:
            while self._index < len(self._items) and not self._stop.is_set():
                self._start_readers()
                value = self._queues[self._index].get()
                if value is _DONE:
                    self._queues[self._index] = _FINISHED  # drop the drained queue (and its thread) as we go
                    self._index += 1
                    continue
                if isinstance(value, BaseException):
                    raise value
                self.item_index = self._index
                return value
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop the readers: each notices within one batch; one stuck in a system call is a daemon."""
        if self._stop.is_set():
            return
        self._stop.set()
        deadline = time.monotonic() + _JOIN_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __del__(self) -> None:
        self._stop.set()  # never iterated nor closed: the readers stop at their next hand-over


class BackgroundHashes:
    """SHA-256 of files on a daemon thread (hashlib releases the GIL); `cancel()` stops it within one block."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._stop = threading.Event()
        self._digests: dict[str, str] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(list(paths),), daemon=True, name="mismatch-hash")
        self._thread.start()

    def _run(self, paths: list[str]) -> None:
        try:
            for path in paths:
                digest = sha256_file(path, self._stop)
                if digest is None:
                    return
                self._digests[path] = digest
        except BaseException as exc:  # re-raised by result()
            self._error = exc

    def result(self) -> dict[str, str]:
        """Wait for every digest (path -> hex); re-raise the error that stopped the hashing."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._digests)

    def cancel(self) -> None:
        """Stop hashing, without waiting."""
        self._stop.set()
