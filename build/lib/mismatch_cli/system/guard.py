"""Process-level guards around a command: signals become exceptions, and standard output failures are told apart.

SIGINT raises KeyboardInterrupt and SIGTERM raises `Terminated` in the main thread, so every
`except BaseException` cleanup (temporary files, staged outputs, read-ahead threads) runs before the
CLI exits 130 / 143. A closed standard output (the reader of a pipe went away, as with `| head`)
raises `StdoutClosed`, which the CLI turns into a quiet exit 141, as a process killed by SIGPIPE
reports to a shell; any other standard output failure (a full disk) becomes a one-line error.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from mismatch_cli.system.oserrors import explain_os_error

EXIT_SIGINT = 130
EXIT_SIGPIPE = 141
EXIT_SIGTERM = 143


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException like KeyboardInterrupt, so `except Exception` never swallows it."""


class StdoutClosed(Exception):  # noqa: N818 - a state, not an error of ours
    """The reader of standard output went away (EPIPE)."""


_pending: list[int] = []  # the signal received in the current block, until the block ends


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _raise_once(signum: int, frame: FrameType | None) -> None:
    # Further signals of the same kind would interrupt the cleanup this one starts: ignore them.
    signal.signal(signum, signal.SIG_IGN)
    _pending.append(signum)
    raise _exception(signum)


def raise_pending() -> None:
    """Raise again a signal whose exception was swallowed on its way up.

    The handler raises in whatever Python code runs when the signal arrives; code that cannot pass
    an exception on (pyarrow's lazy pandas import runs in a Cython function that only reports it as
    "ignored") drops it. Checkpoints (each batch read, each output about to be moved into place, the
    end of a command) call this, so a signal always stops the run and no output appears after it.
    """
    if _pending:
        raise _exception(_pending[0])


HOLD_ENV = "MISMATCH_TEST_HOLD"
_HOLD_S = 60.0


def hold_for_test() -> None:
    """For the signal tests: with MISMATCH_TEST_HOLD=PATH set, create PATH, then wait there for a signal.

    Called once a run has read its first batch (outputs staged, temporary files open), so a test can
    send SIGINT / SIGTERM at a known point instead of racing a run that may finish first. Each process
    holds once; without the variable this returns at once.
    """
    marker = os.environ.pop(HOLD_ENV, None)
    if not marker:
        return
    Path(marker).touch()  # an empty marker for the test, not an output
    deadline = time.monotonic() + _HOLD_S
    while time.monotonic() < deadline:
        time.sleep(0.02)
        raise_pending()


def import_pandas_now() -> None:
    """Import pandas (when installed) from Python code, before pyarrow would import it from C++.

    pyarrow imports pandas lazily, from C++, the first time it converts an array (most of a second);
    an exception raised during that import, such as the KeyboardInterrupt of a Ctrl-C, is cleared or
    left pending there, so the signal was lost (the run went on and exited 0) or killed the process
    outside the CLI's guard. Imported here, a signal during the import propagates like any other.
    """
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated, once each.

    SIGINT is taken over even when the parent ignored it (a background job of a script): `kill -INT`
    is a request to stop, and a stop that leaves no file behind is what every command promises.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    if all(handler is _raise_once for handler in previous.values()):
        yield  # an outer block already holds them
        return
    _pending.clear()
    for signum in previous:
        signal.signal(signum, _raise_once)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        _pending.clear()


class _GuardedStdout:
    """sys.stdout, with its OSErrors turned into StdoutClosed or a one-line error naming standard output.

    rich answers a BrokenPipeError with SystemExit(1) ("breach" in our exit codes) and click with exit 1;
    StdoutClosed is neither's to catch, so it reaches the CLI's guard.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _stdout_error(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _stdout_error(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_error(exc: OSError) -> Exception:
    if isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.ECONNRESET):
        return StdoutClosed()
    return explain_os_error(exc, "standard output", writing=True)


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """Within the block, sys.stdout raises StdoutClosed on a closed pipe and MismatchError on other failures."""
    if isinstance(sys.stdout, _GuardedStdout) or sys.stdout is None:
        yield
        return
    original = sys.stdout
    sys.stdout = _GuardedStdout(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = original


def flush_stdout() -> None:
    """Flush standard output now, so that a closed pipe or a full disk is reported by the guard, not at exit."""
    if sys.stdout is not None:
        sys.stdout.flush()


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's final flush cannot fail again.

    Python's documented recipe for SIGPIPE (library/signal.html, "Note on SIGPIPE").
    """
    stream = sys.stdout
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError, AttributeError):
        return  # not a real file (a test runner's buffer): nothing to protect
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


__all__ = [
    "EXIT_SIGINT",
    "EXIT_SIGPIPE",
    "EXIT_SIGTERM",
    "StdoutClosed",
    "Terminated",
    "flush_stdout",
    "guarded_stdout",
    "import_pandas_now",
    "raise_pending",
    "signals_raise",
    "silence_stdout",
]
