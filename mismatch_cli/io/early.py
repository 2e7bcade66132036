"""Work items read by other processes while this one loads the engine: `--jobs N`'s first ones, or a GPU run's all.

`import torch` takes a core for about 1.5 s (with CUDA's start on a GPU machine, several) before a worker can fork
or a GPU take a chunk, and a read needs no torch. So, on Linux, before the engine loads, reader processes are forked
(small: pyarrow and numpy only, one Arrow thread each) and read the work items in input order, each into a file in
shared memory (io/handoff.py), while the items handed over and not yet taken stay within READER_BYTES a reader (at
most a quarter of the memory available, a container's limit counted, and half the free shared memory). With
`--jobs N` (N - 1 readers) they stop once the engine has loaded and the workers read the rest; on a GPU (a reader per
core but one) they read every item ahead of the process that feeds it. Whoever folds an item maps its file instead
of reading it: the Batches are the same bit for bit, so every number is too. An item a reader could not hand over
(a read error, shared memory full) is read again by its folder, which meets the same error in input order, in the
same words; no reader goes on after one.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..batch import Batch
from ..errors import MismatchError
from ..system.runtime import worker_process
from . import InputFile, ReadOptions, _Guarded, _read_file, read_work_item
from .handoff import load_batches, write_batches
from .parallel import ReadAhead, WorkItem, plan

READER_BYTES = 512 << 20  # the handed-over Batches one reader may hold (about 55 MiB per 6M tokens)
SHARED_MEMORY = "/dev/shm"
SWITCH = "MISMATCH_EARLY_READS"  # "0": no reader processes (the threads of one process, or the workers, read)
PREFIX = "mismatch-early-"  # + the pid of the run, so that the next run removes the folder of one that was killed
# A container's memory limit and use, cgroup v2 then v1: shared memory counts against it.
CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
_NEXT, _HELD, _STOPPED = range(3)  # the shared counters: next item to claim, bytes handed over and not taken, stop
_POLL_S = 0.05  # how often a consumer waiting for an item looks whether the readers stopped
_FULL_S = 0.005  # how long a reader waits for the budget to free


class EarlyReads:
    """The reader processes and their hand-overs, taken in input order with `handoff(i)` or `tagged()`.

    For `--jobs`, `stop()` once the engine has loaded: the workers read the rest. A GPU run never stops them: they
    read every item ahead of the one process that feeds the GPU, within the budget of what it has yet to take.
    """

    def __init__(self, items: list[WorkItem], options: ReadOptions, readers: int, budget: int,
                 directory: str) -> None:
        self.items, self._options = items, options
        self._directory = directory
        context = multiprocessing.get_context("fork")
        self._shared = context.Array("q", 3)
        self._receive, send = context.Pipe(duplex=False)
        self._processes = [context.Process(target=_read_items, args=(items, options, budget, directory, self._shared,
                                                                     send), daemon=True, name=f"mismatch-early-{i}")
                           for i in range(readers)]
        try:
            for process in self._processes:
                process.start()
        except BaseException:
            self.close()
            raise
        finally:
            send.close()  # the readers hold the only write ends: the pipe ends when the last of them does
        self._claimed: int | None = None
        self._delivered: dict[int, tuple[str | None, int]] = {}

    def stop(self) -> int:
        """Let the readers claim no more items (each finishes the one it is on); how many of the first they claimed."""
        with self._shared.get_lock():
            self._shared[_STOPPED] = 1
            self._claimed = self._shared[_NEXT]
        return self._claimed

    def ready(self, index: int) -> bool:
        """After stop(): whether item `index` can be had without waiting (handed over, or not read early)."""
        if self._claimed is None or index >= self._claimed or index in self._delivered:
            return True
        while index not in self._delivered and self._receive.poll():
            self._receive_one()
        return index in self._delivered

    def handoff(self, index: int) -> str | None:
        """The shared-memory file of item `index`, once its reader is done (None: no reader will read it)."""
        while index not in self._delivered:
            with self._shared.get_lock():
                unclaimed = index >= self._shared[_NEXT]
            if unclaimed and self._stopped():
                return None
            if self._receive.poll(_POLL_S):
                self._receive_one()
        path, size = self._delivered.pop(index)
        with self._shared.get_lock():
            self._shared[_HELD] -= size  # the budget a reader waits for
        return path

    def tagged(self, read_workers: int = 2) -> Iterator[tuple[int, Batch]]:
        """Every item's Batches with its index, in input order: handed over (one too large for the budget read here),
        then, once the readers stop (an error), read here on `read_workers` threads. `close()` stops those threads."""
        return _Guarded(self._tagged(read_workers))

    def _tagged(self, read_workers: int) -> Iterator[tuple[int, Batch]]:
        for index in range(len(self.items)):
            path = self.handoff(index)
            if path is not None:
                yield from ((index, batch) for batch in load_batches(path))
            elif not self._stopped():  # too large to hand over: read here
                yield from ((index, batch) for batch in read_work_item(self.items[index], self._options))
            else:
                rest = ReadAhead(self.items[index:], self._options, _read_file, read_workers, 4)
                try:
                    for batch in rest:
                        yield index + rest.item_index, batch
                finally:
                    rest.close()
                return

    def _stopped(self) -> bool:
        with self._shared.get_lock():
            return bool(self._shared[_STOPPED])

    def _receive_one(self) -> None:
        try:
            index, path, size = self._receive.recv()
        except EOFError:
            raise MismatchError("a process reading ahead stopped before it handed its work over (killed, or out of "
                                "memory)", hint="run again with fewer processes (--jobs 1 reads in this process)") \
                from None
        self._delivered[index] = (path, size)

    def close(self) -> None:
        """Stop the readers and remove the files nobody took."""
        started = [process for process in self._processes if process.pid is not None]
        for process in started:
            if process.is_alive():
                process.terminate()
        for process in started:
            process.join(5.0)
        self._receive.close()
        shutil.rmtree(self._directory, ignore_errors=True)


def _read_items(items: list[WorkItem], options: ReadOptions, budget: int, directory: str, shared: Any,
                send: Any) -> None:
    """A reader: claim the next item, read it, hand its Batches over, until stopped or out of items (waiting while
    the handed-over items not yet taken fill the budget)."""
    worker_process()
    import pyarrow

    pyarrow.set_cpu_count(1)  # one core each: the parent's import has the other one
    while True:
        with shared.get_lock():
            index = shared[_NEXT]
            if shared[_STOPPED] or index >= len(items):
                return
            full = shared[_HELD] >= budget
            if not full:
                shared[_NEXT] = index + 1
        if full:
            time.sleep(_FULL_S)
            continue
        path: str | None = os.path.join(directory, f"item-{index}")
        try:  # an item larger than the whole budget (a big file read whole) is left to its folder
            size = write_batches(read_work_item(items[index], options), path, limit=budget) or 0
        except Exception:  # its folder reads it again and reports the error, in input order; no reader goes on
            size = 0
            with shared.get_lock():
                shared[_STOPPED] = 1
        with shared.get_lock():
            shared[_HELD] += size
        send.send((index, path if size else None, size))


def start_early_reads(files: Sequence[InputFile], options: ReadOptions, readers: int) -> EarlyReads | None:
    """Fork up to `readers` readers of the work items when the engine has yet to load (Linux; None elsewhere, with
    fewer than two items, or where shared memory is short)."""
    if readers < 1 or engine_loaded() or not sys.platform.startswith("linux") or not os.path.isdir(SHARED_MEMORY):
        return None
    if os.environ.get(SWITCH, "").strip() == "0":
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    items = plan(files)
    readers = min(readers, len(items) - 1)
    budget = min(readers * READER_BYTES, _available_memory() // 4, _free_bytes(SHARED_MEMORY) // 2)
    if readers < 1 or budget < READER_BYTES // 8:
        return None
    _remove_stale(SHARED_MEMORY)
    try:
        directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHARED_MEMORY)
    except OSError:
        return None
    try:
        return EarlyReads(items, options, readers, budget, directory)
    except OSError:  # no process, pipe or semaphore to spare: the run reads everything itself, as without them
        shutil.rmtree(directory, ignore_errors=True)
        return None


def _remove_stale(parent: str) -> None:
    """Remove the hand-over folders of runs that were killed before they could (their process is gone)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX):].split("-", 1)[0]
        if not name.startswith(PREFIX) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except (OSError, OverflowError):  # alive and another user's, or no process id at all
            pass


def engine_loaded() -> bool:
    """Whether torch is loaded already (a library caller, a second analysis in one process): no time to read in."""
    return "torch" in sys.modules


def _available_memory() -> int:
    """The memory this process may still take, in bytes: /proc/meminfo's MemAvailable, or less where a container's
    cgroup limit leaves less (0 when neither can be read)."""
    available = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in CGROUP_MEMORY:
        try:
            with open(limit) as limit_file, open(usage) as usage_file:
                cap, used = limit_file.read().strip(), int(usage_file.read())
        except (OSError, ValueError):
            continue
        if cap.isdigit():  # "max" (v2) or a huge number (v1): no limit
            available = min(available, max(0, int(cap) - used))
    return available


def _free_bytes(directory: str) -> int:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


__all__ = ["READER_BYTES", "EarlyReads", "start_early_reads"]
