"""The typer application, and the one place where exceptions become exit codes (`guard`, `main`, and
`MismatchGroup.main` for typer's own usage errors)."""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from mismatch_cli.cli.usage import MismatchCommand, TyperError, is_help_request, usage_line
from mismatch_cli.errors import MismatchError
from mismatch_cli.system.guard import (
    EXIT_SIGINT,
    EXIT_SIGPIPE,
    EXIT_SIGTERM,
    StdoutClosed,
    Terminated,
    flush_stdout,
    guarded_stdout,
    raise_pending,
    signals_raise,
    silence_stdout,
)
from mismatch_cli.system.runtime import one_command_process
from mismatch_cli.version import __version__

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES_HELP = (
    "Exit codes: 0 ran, nothing breached; 1 a threshold was breached; 2 usage or configuration "
    "error; 3 input or data error; 4 internal error (MISMATCH_DEBUG=1 shows the traceback); 130 / 143 stopped by "
    "SIGINT / SIGTERM (no file written); 141 standard output closed (e.g. `| head`)."
)

class MismatchGroup(TyperGroup):
    """The command group; its `main` turns typer's own usage errors into our one line and exit 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except TyperError as exc:
            if is_help_request(exc):  # `mismatch` alone: the help, as typer shows it
                exc.show()  # type: ignore[attr-defined]
            else:
                stderr().print(f"error: {usage_line(exc)}", markup=False)
            code = exc.exit_code  # type: ignore[attr-defined]
        except typer.Abort:
            stderr().print("error: aborted", markup=False)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


class MismatchTyper(typer.Typer):
    """The application: every command renders its help with readable placeholders (`MismatchCommand`)."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().command(*args, cls=cls or MismatchCommand, **kwargs)


app = MismatchTyper(
    cls=MismatchGroup,
    name="mismatch",
    help="How far do the inference engine's token log-probs drift from the trainer's, and what would "
    "verl's rollout corrections do about it? " + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def stderr() -> Console:
    """A console on standard error for notes, warnings and errors."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def guard(command: F) -> F:
    """Run a command body, turning our exceptions into one stderr line and their exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = os.environ.get("MISMATCH_DEBUG") == "1"
        with guarded_stdout(), signals_raise():
            return _guarded(command, args, kwargs, debug)

    return wrapper  # type: ignore[return-value]


def _guarded(command: Callable[..., Any], args: Any, kwargs: Any, debug: bool) -> Any:
    try:
        try:
            result = command(*args, **kwargs)
        except typer.Exit:
            raise_pending()
            flush_stdout()  # a closed pipe or a full disk shows here, not in the interpreter's final flush
            raise
        raise_pending()
        flush_stdout()
        return result
    except typer.Exit:
        raise
    except StdoutClosed:
        silence_stdout()  # the reader went away (`| head`): no breach, no message
        raise typer.Exit(EXIT_SIGPIPE) from None
    except MismatchError as exc:
        if debug:
            traceback.print_exc()
        stderr().print(f"error: {exc}", markup=False)
        raise typer.Exit(exc.exit_code) from None
    except Terminated:
        stderr().print("terminated (SIGTERM): stopped, no file written", markup=False)
        raise typer.Exit(EXIT_SIGTERM) from None
    except KeyboardInterrupt:
        stderr().print("interrupted (SIGINT): stopped, no file written", markup=False)
        raise typer.Exit(EXIT_SIGINT) from None
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 4
        if debug:
            traceback.print_exc()
        stderr().print(
            f"internal error: {type(exc).__name__}: {exc}; fix: re-run with MISMATCH_DEBUG=1 for the "
            "traceback and report it",
            markup=False,
        )
        raise typer.Exit(4) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mismatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Measure trainer vs inference log-prob mismatch in rollout dumps."""


def entry() -> None:
    """The console script and `python -m mismatch_cli`: `main`, then an exit that skips the interpreter's teardown
    (about 0.4 s with torch loaded) once the output is flushed; a run that started Ray exits normally, since Ray's
    exit handler stops the local cluster it started."""
    one_command_process()  # what the engine loads is never collected; freed memory is kept for the next chunk
    try:
        main()
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    if "ray" in sys.modules or not isinstance(code, (int, type(None))):
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: main already said what it had to
            pass
    os._exit(code or 0)


def main() -> None:
    """The CLI with the guards of `guard`, which also cover --help, --version and argument parsing."""
    with guarded_stdout(), signals_raise():
        try:
            try:
                app()
            finally:
                flush_stdout()
        except StdoutClosed:
            silence_stdout()
            sys.exit(EXIT_SIGPIPE)
        except MismatchError as exc:
            stderr().print(f"error: {exc}", markup=False)
            sys.exit(exc.exit_code)
        except Terminated:
            sys.exit(EXIT_SIGTERM)
        except KeyboardInterrupt:
            sys.exit(EXIT_SIGINT)
