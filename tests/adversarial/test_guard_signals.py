"""SIGINT and SIGTERM mid-run: exit 130 / 143, one stderr line, and no file left behind (no temporary, no partial)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from adversarial.conftest import ROOT, snapshot
from adversarial.guard_helpers import subprocess_env

from mismatch_cli.system.guard import HOLD_ENV

RULE = "rollout_corr/kl<=1"


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dump of several reader chunks; the run waits after the first one (MISMATCH_TEST_HOLD), so size is no race."""
    folder = tmp_path_factory.mktemp("signal_input")
    path = folder / "dump.parquet"
    subprocess.run([sys.executable, "-m", "mismatch_cli", "synth", str(path), "--tokens", "200000", "--steps", "2"],
                   check=True, capture_output=True, timeout=120, env=subprocess_env(), cwd=ROOT)
    return path


COMMANDS = {
    "analyze": lambda d, w: ["analyze", d, "--out-dir", w / "out", "-o", w / "report.md", "--format", "markdown"],
    "convert": lambda d, w: ["convert", d, "-o", w / "converted.parquet"],
    "compare": lambda d, w: ["compare", d, d, "--out-dir", w / "out", "--fail-on", RULE],
    "check": lambda d, w: ["check", d, "--fail-on", RULE, "--junit-xml", w / "junit.xml", "--out-dir", w / "out"],
}


def _interrupt(work: Path, dump: Path, command: str, signum: int, ignore_sigint: bool = False,
               args: list[str] | None = None, workers: bool = False) -> tuple[int, str, list[int]]:
    """Start `command` on the dump (or `mismatch ARGS`), send `signum` once it is mid-run (and, with `workers`, has
    started its worker processes); its exit code, stderr and the workers it had."""
    args = args or [str(a) for a in COMMANDS[command](dump, work)]

    def ignore() -> None:  # what a script's background job (`mismatch ... &`) inherits
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    held = work.parent / "held"  # outside `work`, which must stay empty
    env = {**subprocess_env(), HOLD_ENV: str(held)}
    proc = subprocess.Popen([sys.executable, "-m", "mismatch_cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=work,
                            preexec_fn=ignore if ignore_sigint else None)
    try:
        deadline = time.monotonic() + 60
        while (not held.exists() or (workers and not _children(proc.pid))) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.exists() and proc.poll() is None, ("the run never reached its first batch", proc.poll())
        if command == "convert":  # its temporary output is open: the signal must remove it
            assert any(p.name.startswith(".") for p in work.iterdir()), list(work.iterdir())
        started = _children(proc.pid) if workers else []
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stderr, started


def _assert_stopped_cleanly(code: int, stderr: str, expected: int, name: str, work: Path) -> None:
    assert code == expected, (code, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], stderr
    assert "Traceback" not in stderr
    assert snapshot(work) == {}, "a file was left behind"
    assert list(work.iterdir()) == [], [p.name for p in work.iterdir()]


# SIGINT for every command; SIGTERM, which the same guard turns into its own exception, for one command that writes
# through --out-dir and one that streams a temporary file (compare and check share analyze's path).
@pytest.mark.parametrize(("command", "signum", "code", "name"),
                         [(command, signal.SIGINT, 130, "SIGINT") for command in COMMANDS]
                         + [(command, signal.SIGTERM, 143, "SIGTERM") for command in ("analyze", "convert")])
def test_a_signal_mid_run_leaves_nothing(tmp_path: Path, dump: Path, command: str, signum: int, code: int,
                                         name: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    returncode, stderr, _ = _interrupt(work, dump, command, signum)
    _assert_stopped_cleanly(returncode, stderr, code, name, work)


def test_sigint_stops_a_run_whose_parent_ignored_it(tmp_path: Path, dump: Path) -> None:
    # The "SIGINT during convert exits 0": a job started with `&` from a script inherits SIGINT
    # ignored; `kill -INT` must still stop it, and its temporary file must go.
    work = tmp_path / "work"
    work.mkdir()
    returncode, stderr, _ = _interrupt(work, dump, "convert", signal.SIGINT, ignore_sigint=True)
    _assert_stopped_cleanly(returncode, stderr, 130, "SIGINT", work)


def _swallowed(signum: int) -> None:
    """Deliver `signum` to this process and drop its exception, as a Cython function without `except` does."""
    try:
        os.kill(os.getpid(), signum)
        time.sleep(0.5)  # the handler runs here, between two bytecodes
    except BaseException:  # noqa: BLE001, S110 - the library's swallowing, on purpose
        pass


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_swallowed_signal_still_stops_the_read_and_the_writes(tmp_path: Path, signum: int) -> None:
    # pyarrow imports pandas lazily inside a Cython function that drops exceptions: a signal arriving
    # then was lost, and `convert` went on to write its file and exit 0.
    from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
    from mismatch_cli.system.guard import Terminated, signals_raise
    from mismatch_cli.system.output import Outputs

    expected = KeyboardInterrupt if signum == signal.SIGINT else Terminated
    files = discover_inputs([str(ROOT / "sample_data" / "single_turn.parquet")])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with signals_raise():
        _swallowed(signum)
        with pytest.raises(expected):
            next(iter_batches(files, ReadOptions()))
        outputs = Outputs()
        outputs.add(tmp_path / "report.json", "{}", "-o")
        with pytest.raises(expected):
            outputs.commit()
    assert list(tmp_path.iterdir()) == []
    assert {s: signal.getsignal(s) for s in before} == before  # the block gives the process its handlers back


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("early_reads", ["1", "0"])
def test_a_signal_stops_every_worker_of_jobs(tmp_path: Path, dump: Path, monkeypatch: pytest.MonkeyPatch,
                                             early_reads: str) -> None:
    # A worker stopped mid-item must not outlive the run: one left blocked writing its state to a pipe nobody reads
    # kept its memory until it was killed by hand. (SIGTERM takes the same path in the parent: its `except`.) With
    # early reads the first process to hold is a reader forked before torch loads; without, a worker of the pool.
    monkeypatch.setenv("MISMATCH_EARLY_READS", early_reads)
    work = tmp_path / "work"
    work.mkdir()
    second = tmp_path / "second.parquet"
    second.write_bytes(dump.read_bytes())  # two files: two work items, so a worker takes one
    args = ["analyze", str(dump), str(second), "--jobs", "2", "--out-dir", str(work / "out")]
    returncode, stderr, workers = _interrupt(work, dump, "analyze", signal.SIGINT, args=args, workers=True)
    assert workers, "no worker had started"
    _assert_stopped_cleanly(returncode, stderr, 130, "SIGINT", work)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "a worker outlived the run"
