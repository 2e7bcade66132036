"""Typer's own usage errors and help, in our words: one `error: …; fix: …` line, readable placeholders.

Typer (through the click it vendors) reports a bad option value, an unknown option or a missing
argument as four lines of its own ("Usage: …", "Try …", "Error: … Value error, …"). `app.py` catches
those exceptions where every other one becomes an exit code and prints `usage_line(exc)` instead.
The exception classes are reached through `typer.BadParameter`, the one typer exports, so that no
module of ours imports click.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.core import TyperCommand

from mismatch_cli.errors import close_names, did_you_mean, suggest

# typer.BadParameter -> UsageError -> ClickException: the bases of every usage error typer raises.
TyperUsageError: type[Exception] = typer.BadParameter.__mro__[1]
TyperError: type[Exception] = typer.BadParameter.__mro__[2]
assert (TyperUsageError.__name__, TyperError.__name__) == ("UsageError", "ClickException")

_NOT_ONE_OF = re.compile(r"'(?P<value>.*)' is not one of (?P<choices>.*?)\.?$")
_NO_COMMAND = re.compile(r"No such command '(?P<name>[^']*)'")


def placeholder(param: Any) -> str:
    """How an argument reads in help and errors: its metavar (or name in capitals), `...` when repeatable."""
    name = param.metavar or param.name.upper()
    return f"{name}..." if param.nargs != 1 else name


def is_help_request(exc: Exception) -> bool:
    """True for the error typer raises to show the help of `mismatch` run without a command."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def _command_line(ctx: Any) -> str:
    """`mismatch` or `mismatch COMMAND`, whatever name the program was started under."""
    if ctx is None or ctx.parent is None:
        return "mismatch"
    return f"mismatch {ctx.info_name}"


def _flag(param: Any) -> str:
    if param is None:
        return "a value"
    if getattr(param, "param_type_name", "") == "argument":
        return placeholder(param)
    return max(param.opts, key=len)


def usage_line(exc: Exception) -> str:
    """`<what>; fix: <what to do>` for one of typer's usage errors, with the name most likely meant."""
    ctx = getattr(exc, "ctx", None)
    command = _command_line(ctx)
    see = f"see `{command} --help`"
    message = str(getattr(exc, "message", exc)).strip().replace("Value error, ", "").rstrip(".")
    name = type(exc).__name__
    if name == "NoSuchOption":
        option = exc.option_name  # type: ignore[attr-defined]
        known = [o for p in (ctx.command.params if ctx else []) for o in (*p.opts, *p.secondary_opts)
                 if o.startswith("-")]
        return f"{command} has no option {option}; fix: {did_you_mean(option, known, see)}"
    if name == "MissingParameter":
        param = exc.param  # type: ignore[attr-defined]
        what = "argument" if getattr(param, "param_type_name", "") == "argument" else "option"
        return f"{command}: missing {what} {_flag(param)}; fix: give it ({see})"
    match = _NOT_ONE_OF.search(message)
    if match is not None:
        value, choices = match["value"], re.findall(r"'([^']*)'", match["choices"])
        flag = _flag(getattr(exc, "param", None))
        # `NeMo-RL` is `nemo-rl`: a case-blind match first, then the close spellings
        close = [c for c in choices if c.lower() == value.lower()] or close_names(value.lower(), choices)
        fix = suggest(close, spelled=f"{flag} {{}}") or f"use one of {', '.join(choices)}"
        return f"{flag}: {value!r} is not one of {', '.join(choices)}; fix: {fix}"
    if name == "BadOptionUsage" and "requires an argument" in message:
        option = exc.option_name  # type: ignore[attr-defined]
        return f"{option} needs a value; fix: give it one, e.g. {option} VALUE ({see})"
    match = _NO_COMMAND.search(message)
    if match is not None and ctx is not None:
        commands = ctx.command.list_commands(ctx)
        fix = did_you_mean(match["name"], commands, f"use one of {', '.join(commands)}", "`mismatch {}`")
        return f"no command {match['name']!r}; fix: {fix}"
    param = getattr(exc, "param", None)
    where = f"{_flag(param)}: " if param is not None else ""
    return f"{where}{message[:1].lower()}{message[1:]}; fix: {see}"


class MismatchCommand(TyperCommand):
    """A command whose help reads `DUMP...`, `ROLE=NAME`, `token|sequence|none` instead of typer's type names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name != "option" or param.metavar is not None or getattr(param, "is_flag", False):
                continue
            desc = param.type_descriptor  # type: ignore[attr-defined]
            if desc.is_choice:
                param.metavar = "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Typer's parser raises "--is requires an argument" without a context: give it this command's, so
        that the fix points to `mismatch analyze --help` rather than `mismatch --help`."""
        try:
            return super().parse_args(ctx, args)
        except TyperError as exc:
            if getattr(exc, "ctx", None) is None:
                exc.ctx = ctx  # type: ignore[attr-defined]
            raise

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line: `[OPTIONS] DUMP...`, optional arguments in brackets."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(placeholder(param) if param.required else f"[{placeholder(param)}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Arguments by their placeholders (no type names), then the options as typer writes them."""
        arguments = [(placeholder(p), p.help or "") for p in self.get_params(ctx)
                     if p.param_type_name == "argument" and not p.hidden]
        options = [record for p in self.get_params(ctx) if p.param_type_name == "option"
                   if (record := p.get_help_record(ctx)) is not None]
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
