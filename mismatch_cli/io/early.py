"""`--jobs N`'s first work items, read by N - 1 processes while this one loads the engine.

`import torch` takes a core for about 1.5 s before any worker can start, and a read needs no torch. So, on Linux,
before the engine loads, N - 1 reader processes are forked (small: pyarrow and numpy only) and read the work items
in input order, each into a file in shared memory (io/handoff.py), until the engine has loaded or they hold
READER_BYTES each (at most a quarter of the memory available, a container's limit counted, and half the free
shared memory). Whoever folds an item (the parent or a worker) then maps its file instead of reading it; the Batches
are the same bit for bit, so every number is too. An item a reader could not hand over (a read error, shared memory
full) is read again by its folder, which meets the same error in input order, in the same words.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from ..errors import MismatchError
from ..system.runtime import worker_process
from . import InputFile, ReadOptions, read_work_item
from .handoff import write_batches
from .parallel import WorkItem, plan

READER_BYTES = 512 << 20  # the handed-over Batches one reader may hold (about 55 MiB per 6M tokens)
SHARED_MEMORY = "/dev/shm"
PREFIX = "mismatch-early-"  # + the pid of the run, so that the next run removes the folder of one that was killed
# A container's memory limit and use, cgroup v2 then v1: shared memory counts against it.
CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
_NEXT, _WRITTEN, _STOPPED = range(3)  # the shared counters: next item to claim, bytes handed over, stop flag


class EarlyReads:
    """The reader processes and their hand-overs: `stop()` once the engine has loaded, then `handoff(i)` per item."""

    def __init__(self, items: list[WorkItem], options: ReadOptions, readers: int, budget: int,
                 directory: str) -> None:
        self.items = items
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
        self._delivered: dict[int, str | None] = {}

    def stop(self) -> int:
        """Let the readers claim no more items (each finishes the one it is on); how many of the first they claimed."""
        with self._shared.get_lock():
            self._shared[_STOPPED] = 1
            self._claimed = self._shared[_NEXT]
        return self._claimed

    def ready(self, index: int) -> bool:
        """Whether item `index` can be had without waiting (read ahead and handed over, or not read ahead)."""
        if self._claimed is None or index >= self._claimed or index in self._delivered:
            return True
        while index not in self._delivered and self._receive.poll():
            self._receive_one()
        return index in self._delivered

    def handoff(self, index: int) -> str | None:
        """The shared-memory file of item `index` once its reader is done (None: read it, as if never read ahead)."""
        if self._claimed is None:
            raise RuntimeError("stop() the early reads before taking their items")
        if index >= self._claimed:
            return None
        while index not in self._delivered:
            self._receive_one()
        return self._delivered.pop(index)

    def _receive_one(self) -> None:
        try:
            index, path = self._receive.recv()
        except EOFError:
            raise MismatchError("a process reading ahead stopped before it handed its work over (killed, or out of "
                                "memory)", hint="run again with fewer processes (--jobs 1 reads in this process)") \
                from None
        self._delivered[index] = path

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
    """A reader: claim the next item, read it, hand its Batches over, until stopped, out of items or of budget."""
    worker_process()
    import pyarrow

    pyarrow.set_cpu_count(1)  # one core each: the parent's import has the other one
    while True:
        with shared.get_lock():
            index = shared[_NEXT]
            if shared[_STOPPED] or index >= len(items) or shared[_WRITTEN] >= budget:
                return
            shared[_NEXT] = index + 1
        path: str | None = os.path.join(directory, f"item-{index}")
        try:
            size = write_batches(read_work_item(items[index], options), path)
        except Exception:  # its folder reads it again and reports the error, in input order; no reader goes on
            size, path = 0, None
            with shared.get_lock():
                shared[_STOPPED] = 1
        with shared.get_lock():
            shared[_WRITTEN] += size
        send.send((index, path))


def start_early_reads(files: Sequence[InputFile], options: ReadOptions, jobs: int) -> EarlyReads | None:
    """Fork `jobs` - 1 readers of the first work items when the engine has yet to load (Linux; None elsewhere, with
    fewer than two items, or where shared memory is short)."""
    if jobs < 2 or engine_loaded() or not sys.platform.startswith("linux") or not os.path.isdir(SHARED_MEMORY):
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    items = plan(files)
    readers = min(jobs - 1, len(items) - 1)
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
    except OSError:  # no process to spare (fork refused): the workers read everything, as without early reads
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
        except OSError:  # alive, another user's
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
