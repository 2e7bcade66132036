"""The command line's choices and option bundles: every command that analyzes dumps takes the same flags."""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from mismatch_cli.correction import FAMILIES
from mismatch_cli.gate.thresholds import RULE_HELP

F = TypeVar("F", bound=Callable[..., Any])

QUIET_HELP = "Quiet: no progress, no warnings, no notes; only the requested output and errors."


# -q also silences the library's notices on stderr (the CPU sweep's one-time compile line, the GPU sweep's fallback).
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP, callback=lambda quiet: logging.getLogger(
    "mismatch_cli").setLevel(logging.ERROR if quiet else logging.NOTSET) or quiet)]


class OutputFormat(str, enum.Enum):
    """How a command prints its result."""

    table = "table"
    json = "json"
    markdown = "markdown"


class ReportFormat(str, enum.Enum):
    """How `analyze` prints its report: the summary or every table, JSON, Markdown, or one table as CSV."""

    table = "table"
    json = "json"
    markdown = "markdown"
    csv = "csv"


class IsLevel(str, enum.Enum):
    """verl's `rollout_is`."""

    token = "token"
    sequence = "sequence"
    none = "none"


class K1Bounds(str, enum.Enum):
    """How k1 RS bounds are read: as verl does (inverted for asymmetric bands) or as ratio bounds."""

    verl = "verl"
    ratio = "ratio"


# Which trainer version's correction rules to reproduce: one choice per family the correction model knows.
Semantics = enum.Enum("Semantics", {name.replace("-", "_").replace(".", ""): name for name in FAMILIES}, type=str)


class MaskDtype(str, enum.Enum):
    """The dtype the trainer's mask had: a bool / integer mask makes verl's means exact."""

    float = "float"
    bool = "bool"


class Engine(str, enum.Enum):
    """Where the accumulators run."""

    local = "local"
    ray = "ray"


class Dtype(str, enum.Enum):
    """Compute precision of per-token math (reductions are always float64)."""

    float32 = "float32"
    float64 = "float64"


class InputFormat(str, enum.Enum):
    """Dump format: detected from the content (auto) or forced."""

    auto = "auto"
    parquet = "parquet"
    safetensors = "safetensors"
    slime = "slime"
    nemo_rl = "nemo-rl"
    prime_rl = "prime-rl"
    skyrl = "skyrl"


class MissingPolicy(str, enum.Enum):
    """What a rule naming a metric the input (or the baseline) lacks does."""

    error = "error"
    warn = "warn"
    skip = "skip"


InputsArg = Annotated[
    list[str],
    typer.Argument(metavar="DUMP",
                   help="Dump files (parquet, safetensors, slime .pt, NeMo-RL / prime-rl .jsonl), folders or globs."),
]
InputFormatOpt = Annotated[
    InputFormat,
    typer.Option("--input-format",
                 help="auto (from the content), parquet, safetensors, slime, nemo-rl, prime-rl or skyrl."),
]
ColumnOpt = Annotated[
    list[str], typer.Option("--column", metavar="ROLE=NAME",
                            help="Map a role to a column: ROLE=NAME (roles: old_log_probs, "
                            "rollout_log_probs, response_mask). Repeatable.")
]
NoMaskOpt = Annotated[bool, typer.Option("--no-mask", help="Treat every token as valid when the dump has no mask.")]
DeviceOpt = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N.")]
ByOpt = Annotated[
    list[str],
    typer.Option("--by", metavar="KEY",
                 help="Also report each step (`step`) or each value of a column (e.g. env_name) as its "
                 "own batch. Repeatable."),
]
FailOnOpt = Annotated[list[str], typer.Option("--fail-on", metavar="RULE", help=RULE_HELP)]
MissingOpt = Annotated[
    MissingPolicy | None,
    typer.Option("--missing", help="A rule naming a metric the input or baseline lacks: error (default), warn, skip."),
]


@dataclass
class InputFlags:
    """How dumps are read: column mapping, mask, format."""

    column: ColumnOpt = ()  # type: ignore[assignment]
    no_mask: NoMaskOpt = False
    input_format: InputFormatOpt = InputFormat.auto


@dataclass
class CorrectionFlags:
    """The correction to run: verl's flags, the older families' flags and a TOML [correction] table."""

    preset: Annotated[str | None, typer.Option("--preset", metavar="NAME",
                                               help="A verl preset (see `mismatch presets`).")] = None
    is_level: Annotated[IsLevel | None, typer.Option("--is", help="IS level (verl rollout_is).")] = None
    is_threshold: Annotated[str | None, typer.Option(
        "--is-threshold", metavar="T", help="TIS upper bound (2.0) or IcePop band L_U (0.5_5.0).")] = None
    is_batch_normalize: Annotated[bool | None, typer.Option(
        "--is-batch-normalize/--no-is-batch-normalize", help="Normalize IS weights to mean 1.")] = None
    rs: Annotated[str | None, typer.Option(
        "--rs", metavar="LIST", help="RS options, comma-chained (e.g. seq_mean_k1,token_k2).")] = None
    rs_threshold: Annotated[str | None, typer.Option(
        "--rs-threshold", metavar="LIST", help="RS thresholds: one shared or one per option, comma-separated.")] = None
    k1_bounds: Annotated[K1Bounds | None, typer.Option(
        "--k1-bounds", help="verl (reproduce verl) or ratio (L<=ratio<=U).")] = None
    semantics: Annotated[Semantics | None, typer.Option(
        "--semantics", help="Trainer family whose rules and keys to reproduce.")] = None
    is_level_legacy: Annotated[str | None, typer.Option(
        "--is-level", metavar="LEVEL", help="verl-0.6.0 / xtuner: token, sequence or geometric.")] = None
    is_mode: Annotated[str | None, typer.Option(
        "--is-mode", metavar="MODE", help="verl-0.6.0: truncate|mask; xtuner: truncate|mask|both.")] = None
    is_threshold_lower: Annotated[str | None, typer.Option(
        "--is-threshold-lower", metavar="L", help="verl-0.6.0: IS lower bound L.")] = None
    is_mask_threshold: Annotated[str | None, typer.Option(
        "--is-mask-threshold", metavar="U,L", help="xtuner: mask band as U,L (xtuner's order).")] = None
    rs_threshold_lower: Annotated[str | None, typer.Option(
        "--rs-threshold-lower", metavar="L", help="verl-0.7.0 / 0.6.1: RS lower bound L.")] = None
    veto_threshold: Annotated[str | None, typer.Option(
        "--veto-threshold", metavar="V",
        help="verl-0.7.0 / 0.6.x: V (0.6.0 default 1e-4; none = off); xtuner: U,L.")] = None
    mask_dtype: Annotated[MaskDtype | None, typer.Option(
        "--mask-dtype", help="Older families: the trainer's mask dtype (bool = exact means).")] = None
    settings: Annotated[list[str] | None, typer.Option("--set", metavar="FIELD=VALUE", help="A trainer setting "
                                                       "by its own field name (repeatable).")] = None

    def given(self) -> bool:
        """Whether any correction flag was given on the command line."""
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass
class ComputeFlags:
    """Where and how precisely the engine runs, and the bootstrap intervals."""

    device: DeviceOpt = "auto"
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Per-token compute precision.")] = Dtype.float32
    bootstrap: Annotated[str, typer.Option(
        "--bootstrap", metavar="K", help="Poisson-bootstrap replicates for the report's 95% intervals "
        "(0..10000; 0 = off, a little faster; under 20 give no interval).")] = "200"
    jobs: Annotated[str, typer.Option("--jobs", metavar="N", help="Processes on this machine's CPU (default "
                                      "auto: the usable cores from 256 MiB of input); same numbers any N.")] = "auto"


def bundled(*bundles: type) -> Callable[[F], F]:
    """Add each bundle's fields to a command's options, and hand the command one bundle object per class.

    The command declares a parameter per bundle, annotated with the bundle class (e.g. `inputs_flags:
    InputFlags`); typer sees the bundle's fields instead, so every command spells them the same way.
    """

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.annotation not in bundles]
        slots = {p.name: p.annotation for p in signature.parameters.values() if p.annotation in bundles}
        added = []
        for bundle in bundles:
            hints = get_type_hints(bundle, include_extras=True)
            for f in fields(bundle):
                default = list(f.default) if isinstance(f.default, tuple) else f.default
                added.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                               annotation=hints[f.name]))

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for name, bundle in slots.items():
                kwargs[name] = bundle(**{f.name: kwargs.pop(f.name) for f in fields(bundle)})
            return command(*args, **kwargs)

        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        del wrapper.__wrapped__  # typer must read the new signature, not the command's
        return wrapper  # type: ignore[return-value]

    return decorate


def parse_columns(pairs: list[str]) -> dict[str, str]:
    """`--column ROLE=NAME` values as a role → column mapping."""
    from mismatch_cli.batch import ROLES
    from mismatch_cli.errors import UsageError, did_you_mean

    columns: dict[str, str] = {}
    for pair in pairs:
        role, sep, name = pair.partition("=")
        role = role.strip()
        if not sep or not name.strip():
            raise UsageError(f"--column expects ROLE=NAME, got '{pair}'", hint="e.g. --column response_mask=loss_mask")
        if role not in ROLES:
            raise UsageError(f"--column: unknown role '{role}'",
                             hint=did_you_mean(role, ROLES, f"roles are {', '.join(ROLES)}", "--column {}=" + name))
        if role in columns and columns[role] != name.strip():
            raise UsageError(f"--column {role} given twice ({columns[role]} and {name.strip()})",
                             hint=f"keep one --column {role}=NAME")
        columns[role] = name.strip()
    return columns


def read_options(flags: InputFlags, keep: tuple[str, ...] = ()) -> Any:
    """The readers' options from the input flags."""
    from mismatch_cli.io import ReadOptions

    return ReadOptions(columns=parse_columns(list(flags.column)), no_mask=flags.no_mask,
                       input_format=flags.input_format.value, group_columns=keep)


def parse_by(values: list[str]) -> tuple[str, ...]:
    """`--by` values: `step` or column names, repeatable or comma-separated."""
    from mismatch_cli.errors import UsageError

    names = [part.strip() for value in values for part in value.split(",")]
    if any(not name for name in names):
        raise UsageError("--by expects `step` or a column name, got an empty value",
                         hint="e.g. --by step --by env_name")
    return tuple(dict.fromkeys(names))


ConfigPathOpt = Annotated[
    Path | None, typer.Option("--config", metavar="FILE",
                              help="TOML file with a [correction] table (verl field names).")
]


def refuse_without(flag: str, given: bool, needs: str, present: bool) -> None:
    """Refuse `flag` when it was given but the flag it only matters with (`needs`) was not."""
    from mismatch_cli.errors import UsageError

    if given and not present:
        raise UsageError(f"{flag} does nothing without {needs}", hint=f"add {needs}, or drop {flag}")


def csv_table_flag(output_format: ReportFormat, table: str | None) -> str | None:
    """`--table`, checked against the report's table names; only meaningful with `--format csv`."""
    from mismatch_cli.errors import UsageError, did_you_mean
    from mismatch_cli.report import TABLES

    if table is None:
        return None
    if output_format is not ReportFormat.csv:
        raise UsageError(f"--table {table} needs --format csv", hint=f"add --format csv (or drop --table {table})")
    if table not in TABLES:
        raise UsageError(f"--table: no table '{table}'",
                         hint=did_you_mean(table, TABLES, f"use one of {', '.join(TABLES)}", "--table {}"))
    return table
