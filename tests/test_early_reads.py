"""`--jobs N` reads its first work items in N - 1 processes while the engine loads, and hands them over through
shared memory: the Batches, and so every number, are the same as a read's, whatever was read early (issue 36)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mismatch_cli.api as api
import mismatch_cli.io.early as early_reads
from mismatch_cli.api import analyze
from mismatch_cli.batch import Batch
from mismatch_cli.errors import MismatchError
from mismatch_cli.io import ReadOptions, discover_inputs, read_work_item
from mismatch_cli.io.handoff import load_batches, write_batches
from mismatch_cli.io.parallel import plan
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="early reads fork: Linux only")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("early")
    paths = []
    for i, turns in enumerate((3, 1, 2)):
        path = folder / f"part{i}.parquet"
        write_synthetic_dump(path, SynthSpec(tokens=60_000, turns=turns, seed=10 + i, steps=3,
                                             row_group_tokens=8_000, catastrophic_rate=1e-4))
        paths.append(str(path))
    return paths


@pytest.fixture
def small_items(monkeypatch: pytest.MonkeyPatch) -> None:
    import mismatch_cli.io.parallel as parallel

    monkeypatch.setattr(parallel, "ITEM_BYTES", 100_000)  # several work items per file


def report(paths: list[str], jobs: int) -> str:
    data = analyze(paths, hash_inputs=False, jobs=jobs, device="cpu", group_by=("step",), bootstrap=30).to_dict()
    data.pop("created_at")
    return json.dumps(data, sort_keys=True)


def same_bits(one: object, other: object) -> bool:
    if isinstance(one, np.ndarray):
        return (isinstance(other, np.ndarray) and one.dtype == other.dtype and one.shape == other.shape
                and (one.tolist() == other.tolist() if one.dtype == object else one.tobytes() == other.tobytes()))
    if isinstance(one, dict):
        return one.keys() == other.keys() and all(same_bits(one[k], other[k]) for k in one)
    return one == other


def test_a_handed_over_batch_is_the_written_one_bit_for_bit(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    old = rng.normal(size=11).astype(np.float32)
    old[3] = np.nan
    batch = Batch(old, old[::-1].copy(), rng.random(11) > 0.3, np.array([0, 4, 4, 11]), "dump.parquet", first_row=7,
                  steps=np.array([2, 2, 5]), sequence_ids=np.array([9, 8, 7]), labels={"model": "x"},
                  groups={"env_name": np.array(["math", None, "code"], dtype=object), "k": np.array([1, 2, 3])},
                  advantages=rng.normal(size=11), process_index=np.array([0, 1, 0]), rows=np.array([7, 9, 12]),
                  policy_versions=np.array([1.0, np.nan, 3.0]), version_kind="lag",
                  token_ids=rng.integers(0, 50_000, size=11))
    second = Batch(np.zeros(0, np.float64), np.zeros(0, np.float64), np.zeros(0, bool), np.array([0]), "other")
    path = str(tmp_path / "item")
    written = write_batches(iter([batch, second]), path)
    assert written == os.path.getsize(path)
    loaded = load_batches(path)
    assert not os.path.exists(path)  # mapped, then removed: the memory goes with the last array
    assert len(loaded) == 2
    for original, copy in zip([batch, second], loaded, strict=True):
        for field in dataclasses.fields(Batch):
            assert same_bits(getattr(original, field.name), getattr(copy, field.name)), field.name
    assert loaded[0].old_log_probs.flags.writeable and loaded[0].old_log_probs.ctypes.data % 64 == 0
    loaded[0].old_log_probs[0] = 5.0  # copy-on-write: writable like a read's arrays
    write_batches(iter([second, batch]), path)  # the full record second: its arrays aligned all the same
    again = load_batches(path)[1]
    assert all(getattr(again, name).ctypes.data % 64 == 0 for name in ("old_log_probs", "token_ids", "advantages"))
    assert write_batches(iter([]), path) == 0 and load_batches(path) == [] and not os.path.exists(path)


def test_a_failed_hand_over_leaves_no_file(tmp_path: Path) -> None:
    def batches():
        yield Batch(np.zeros(2, np.float32), np.zeros(2, np.float32), np.ones(2, bool), np.array([0, 2]), "d")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_batches(batches(), str(tmp_path / "item"))
    assert list(tmp_path.iterdir()) == []


def started(dumps: list[str], directory: Path, readers: int = 1) -> early_reads.EarlyReads:
    reads = early_reads.start_early_reads(discover_inputs(dumps), ReadOptions(), readers)
    assert reads is not None
    return reads


def every_item_read_early(directory: Path, items: int) -> None:
    deadline = time.monotonic() + 60
    while not any(len(os.listdir(folder)) == items for folder in directory.iterdir()):
        assert time.monotonic() < deadline, "the early readers did not claim every item"
        time.sleep(0.01)


@pytest.mark.parametrize("jobs, wait", [(2, True), (3, True), (3, False)])
def test_every_number_is_the_same_whatever_was_read_early(dumps: list[str], small_items: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, jobs: int,
                                                          wait: bool) -> None:
    one = report(dumps, 1)
    items = len(plan(discover_inputs(dumps)))
    assert items >= 8
    real, opened, left = early_reads.start_early_reads, [], []

    def start(files: object, options: object, readers: int) -> early_reads.EarlyReads | None:
        reads = real(files, options, readers)
        assert (reads is not None) == (readers > 0)
        if reads is None:
            return None
        opened.append(reads)
        if wait:  # all of them read before the engine "loads"; else none or some, as the race goes
            every_item_read_early(tmp_path, items)
        close = reads.close

        def closing() -> None:  # every hand-over was taken (mapped and removed) by the time the run ends
            left.extend(name for folder in tmp_path.iterdir() for name in os.listdir(folder))
            close()

        reads.close = closing  # type: ignore[method-assign]
        return reads

    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    monkeypatch.setattr(api, "start_early_reads", start)
    assert report(dumps, jobs) == one
    assert opened and left == [] and list(tmp_path.iterdir()) == []  # every hand-over taken, the folder removed
    if wait:
        assert opened[0].stop() == items


def test_an_item_its_reader_could_not_hand_over_is_read_again(dumps: list[str], small_items: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    one = report(dumps, 1)

    def full(batches: object, path: str) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(early_reads, "write_batches", full)  # inherited by the forked readers
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    assert report(dumps, 2) == one


def test_a_bad_item_read_early_fails_as_it_would_have_in_input_order(dumps: list[str], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "data" / "zz.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"PAR1 not parquet at all PAR1")
    paths = [*dumps, str(bad)]
    with pytest.raises(MismatchError) as plain:
        analyze(paths, hash_inputs=False, jobs=1, device="cpu")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(shm))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    with pytest.raises(MismatchError) as early:
        analyze(paths, hash_inputs=False, jobs=4, device="cpu")
    assert str(early.value) == str(plain.value) and "zz.parquet" in str(early.value)
    assert list(shm.iterdir()) == []


def test_a_reader_killed_mid_item_is_one_line(dumps: list[str], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    claimed = tmp_path / "claimed"

    def stuck(item: object, options: object) -> object:
        claimed.touch()
        time.sleep(120)
        return read_work_item(item, options)

    monkeypatch.setattr(early_reads, "read_work_item", stuck)
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    reads = started(dumps, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not claimed.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert reads.stop() == 1
        assert not reads.ready(0) and reads.ready(1)
        os.kill(reads._processes[0].pid, signal.SIGKILL)
        with pytest.raises(MismatchError, match="a process reading ahead stopped"):
            reads.handoff(0)
        assert reads.handoff(1) is None  # not read early: its folder reads it
    finally:
        reads.close()
    assert [p for p in tmp_path.iterdir() if p.name != "claimed"] == []


def test_no_early_reads_without_an_engine_to_wait_for(dumps: list[str]) -> None:
    files = discover_inputs(dumps)
    assert early_reads.start_early_reads(files, ReadOptions(), 4) is None  # torch is loaded in this process


def test_the_cli_reads_early_while_torch_loads(dumps: list[str], tmp_path: Path) -> None:
    # A fresh process, as a user's: the readers start before torch loads and hand over some items, and the report is
    # the same as one process's.
    code = ("import sys, json, mismatch_cli.io.early as e, mismatch_cli.io.parallel as p; p.ITEM_BYTES = 100_000; "
            "e.SHARED_MEMORY = sys.argv[1]; stop = e.EarlyReads.stop; claimed = []; "
            "e.EarlyReads.stop = lambda self: claimed.append(stop(self)) or claimed[-1]; "
            "from mismatch_cli.api import analyze; "
            "one = analyze(sys.argv[2:], jobs=2, device='cpu', hash_inputs=False, bootstrap=0).to_dict(); "
            "two = analyze(sys.argv[2:], jobs=1, device='cpu', hash_inputs=False, bootstrap=0).to_dict(); "
            "one.pop('created_at'); two.pop('created_at'); assert one == two, 'early reads changed the report'; "
            "assert claimed and claimed[0] > 0, claimed")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), *dumps], check=True, timeout=120)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_hand_overs_are_removed_by_the_next_run(dumps: list[str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    stale = tmp_path / f"{early_reads.PREFIX}{gone.stdout.strip()}-abc"
    alive = tmp_path / f"{early_reads.PREFIX}{os.getpid()}-def"
    unrelated = tmp_path / "mismatch-early-notes"
    huge = tmp_path / f"{early_reads.PREFIX}{'9' * 30}-ghi"  # no process id could be this
    for folder in (stale, alive, unrelated, huge):
        folder.mkdir()
        (folder / "item-0").write_bytes(b"x")
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    started(dumps, tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, unrelated.name, huge.name])


@pytest.mark.parametrize("limit, used, starts", [("max\n", "900000000", True), ("1073741824", "900000000", False),
                                                 ("9223372036854771712", "900000000", True)])
def test_a_containers_memory_limit_bounds_the_early_reads(dumps: list[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, limit: str, used: str,
                                                          starts: bool) -> None:
    (tmp_path / "max").write_text(limit)
    (tmp_path / "current").write_text(used)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(early_reads, "CGROUP_MEMORY", ((str(tmp_path / "max"), str(tmp_path / "current")),
                                                       ("/nonexistent/limit", "/nonexistent/usage")))
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(shm))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    reads = early_reads.start_early_reads(discover_inputs(dumps), ReadOptions(), 2)
    assert (reads is not None) == starts  # 1 GiB with 0.9 GB used leaves a quarter of 0.17 GB: too little
    if reads is not None:
        reads.close()


def batches_of(tagged: object) -> list[tuple[int, Batch]]:
    try:
        return list(tagged)  # type: ignore[call-overload]
    finally:
        tagged.close()  # type: ignore[attr-defined]


def assert_same_batches(one: list[tuple[int, Batch]], other: list[tuple[int, Batch]]) -> None:
    assert [index for index, _ in one] == [index for index, _ in other]
    for (_, mine), (_, theirs) in zip(one, other, strict=True):
        for field in dataclasses.fields(Batch):
            assert same_bits(getattr(mine, field.name), getattr(theirs, field.name)), field.name


@pytest.mark.parametrize("readers, budget", [(1, 0), (3, 0), (2, 1 << 30)])
def test_a_gpu_runs_readers_hand_over_every_item_in_order(dumps: list[str], small_items: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, readers: int,
                                                          budget: int) -> None:
    # On a GPU the readers are never stopped: they read every item ahead of the one process that feeds it, within
    # the budget of what it has not taken yet (0: the largest item's size, so a reader waits for the consumer).
    from mismatch_cli.io import iter_item_batches

    files = discover_inputs(dumps)
    items = plan(files)
    if budget == 0:
        sizes = [write_batches(read_work_item(item, ReadOptions()), str(tmp_path / f"size{i}"))
                 for i, item in enumerate(items)]
        budget = max(size or 0 for size in sizes)
    taken: list[str] = []

    def load(path: str) -> list[Batch]:
        taken.append(path)
        return load_batches(path)

    monkeypatch.setattr(early_reads, "load_batches", load)
    (tmp_path / "early").mkdir()
    reads = early_reads.EarlyReads(items, ReadOptions(), readers, budget, str(tmp_path / "early"))
    assert len(items) >= 8
    try:
        handed = batches_of(reads.tagged())
    finally:
        reads.close()
    assert_same_batches(handed, batches_of(iter_item_batches(files, ReadOptions(), workers=2)))
    assert len(taken) == len(items) >= 8  # every item handed over, none read here


def test_a_gpu_runs_bad_item_fails_where_a_read_would(dumps: list[str], tmp_path: Path) -> None:
    from mismatch_cli.io import iter_item_batches

    bad = tmp_path / "zz.parquet"
    bad.write_bytes(b"PAR1 not parquet at all PAR1")
    files = discover_inputs([dumps[0], str(bad), dumps[1]])

    def until_error(tagged: object) -> tuple[list[tuple[int, Batch]], str]:
        seen: list[tuple[int, Batch]] = []
        try:
            for pair in tagged:  # type: ignore[attr-defined]
                seen.append(pair)
        except MismatchError as exc:
            return seen, str(exc)
        finally:
            tagged.close()  # type: ignore[attr-defined]
        raise AssertionError("no error")

    shm = tmp_path / "early"
    shm.mkdir()
    reads = early_reads.EarlyReads(plan(files), ReadOptions(), 2, 1 << 30, str(shm))
    try:
        handed, error = until_error(reads.tagged())
    finally:
        reads.close()
    read, expected = until_error(iter_item_batches(files, ReadOptions(), workers=2))
    assert error == expected and "zz.parquet" in error
    assert_same_batches(handed, read)


def test_one_process_fed_by_the_readers_reports_the_same(dumps: list[str], small_items: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The path a GPU run takes (readers never stopped, one process taking every item), folded on the CPU here.
    one = report(dumps, 1)
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    monkeypatch.setattr(api, "early_readers", lambda jobs, files, device: 2)
    monkeypatch.setattr(api, "resolve_jobs", lambda jobs, files, device: 1)
    opened = []
    real = early_reads.EarlyReads.tagged
    monkeypatch.setattr(early_reads.EarlyReads, "tagged", lambda self, *a: opened.append(self) or real(self, *a))
    assert report(dumps, 1) == one
    assert opened and list(tmp_path.iterdir()) == []


def test_the_switch_turns_the_readers_off(dumps: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    monkeypatch.setenv("MISMATCH_EARLY_READS", "0")
    assert early_reads.start_early_reads(discover_inputs(dumps), ReadOptions(), 2) is None
    monkeypatch.setenv("MISMATCH_EARLY_READS", "1")
    started(dumps, tmp_path).close()


def test_an_item_larger_than_the_budget_is_read_by_its_folder(dumps: list[str], small_items: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A whole file of another format is one item: a reader gives it up past the budget (no file, no stop), and its
    # folder reads it, while the items around it are still handed over.
    from mismatch_cli.io import iter_item_batches

    files = discover_inputs(dumps)
    items = plan(files)
    sizes = [write_batches(read_work_item(item, ReadOptions()), str(tmp_path / f"size{i}")) or 0
             for i, item in enumerate(items)]
    budget = sorted(sizes)[-2]  # the largest item does not fit
    taken: list[str] = []
    monkeypatch.setattr(early_reads, "load_batches", lambda path: taken.append(path) or load_batches(path))
    (tmp_path / "early").mkdir()
    reads = early_reads.EarlyReads(items, ReadOptions(), 2, budget, str(tmp_path / "early"))
    try:
        handed = batches_of(reads.tagged())
    finally:
        reads.close()
    assert_same_batches(handed, batches_of(iter_item_batches(files, ReadOptions(), workers=2)))
    assert len(taken) == len(items) - sizes.count(max(sizes))
    assert write_batches(read_work_item(items[0], ReadOptions()), str(tmp_path / "small"), limit=10) is None
    assert not (tmp_path / "small").exists()


def test_no_process_to_spare_means_no_early_reads_and_no_folder(dumps: list[str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(early_reads, "SHARED_MEMORY", str(tmp_path))
    monkeypatch.setattr(early_reads, "engine_loaded", lambda: False)
    monkeypatch.setattr(multiprocessing.get_context("fork"), "Array", refused)
    assert early_reads.start_early_reads(discover_inputs(dumps), ReadOptions(), 2) is None
    assert list(tmp_path.iterdir()) == []
