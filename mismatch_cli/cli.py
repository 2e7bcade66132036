"""The command line: parse, call the core, render, and map errors to exit codes (in `_guard` only)."""

from __future__ import annotations

import enum
import functools
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from mismatch_cli.errors import MismatchError, UsageError
from mismatch_cli.guard import (
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
from mismatch_cli.output import Outputs
from mismatch_cli.thresholds import RULE_HELP
from mismatch_cli.version import __version__

EXIT_CODES_HELP = (
    "Exit codes: 0 ran, nothing breached; 1 a threshold was breached; 2 usage or configuration "
    "error; 3 input or data error; 4 internal error (MISMATCH_DEBUG=1 shows the traceback); 130 / 143 stopped by "
    "SIGINT / SIGTERM (no file written); 141 standard output closed (e.g. `| head`)."
)

app = typer.Typer(
    name="mismatch",
    help="How far do the inference engine's token log-probs drift from the trainer's, and what would "
    "verl's rollout corrections do about it? " + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])

QUIET_HELP = "Quiet: no progress, no warnings, no notes; only the requested output and errors."
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP)]


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _guard(command: F) -> F:
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
        _stderr().print(f"error: {exc}", markup=False)
        raise typer.Exit(exc.exit_code) from None
    except Terminated:
        _stderr().print("terminated (SIGTERM): stopped, no file written", markup=False)
        raise typer.Exit(EXIT_SIGTERM) from None
    except KeyboardInterrupt:
        _stderr().print("interrupted (SIGINT): stopped, no file written", markup=False)
        raise typer.Exit(EXIT_SIGINT) from None
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 4
        if debug:
            traceback.print_exc()
        _stderr().print(
            f"internal error: {type(exc).__name__}: {exc}; fix: re-run with MISMATCH_DEBUG=1 for the "
            "traceback and report it",
            markup=False,
        )
        raise typer.Exit(4) from None


class OutputFormat(str, enum.Enum):
    """How `analyze` prints its report."""

    table = "table"
    json = "json"
    markdown = "markdown"


class IsLevel(str, enum.Enum):
    """verl's `rollout_is`."""

    token = "token"
    sequence = "sequence"
    none = "none"


class K1Bounds(str, enum.Enum):
    """How k1 RS bounds are read: as verl does (inverted for asymmetric bands) or as ratio bounds."""

    verl = "verl"
    ratio = "ratio"


class Semantics(str, enum.Enum):
    """Which trainer version's correction rules to reproduce."""

    verl = "verl"
    verl_08 = "verl-0.8"
    verl_071 = "verl-0.7.1"
    verl_070 = "verl-0.7.0"
    verl_061 = "verl-0.6.1"
    verl_060 = "verl-0.6.0"
    xtuner = "xtuner"
    xtuner_2025_12 = "xtuner-2025-12"


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


InputFormatOpt = Annotated[
    InputFormat,
    typer.Option("--input-format", help="auto (from the content), parquet, safetensors, slime, nemo-rl or prime-rl."),
]


class SynthFormat(str, enum.Enum):
    """File format written by `synth`."""

    parquet = "parquet"
    safetensors = "safetensors"


class SynthLayout(str, enum.Enum):
    """safetensors layout written by `synth`."""

    padded = "padded"
    packed = "packed"


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


def _threshold_value(text: str | None, flag: str) -> str | float | None:
    # verl accepts a number or a string; keep numbers numeric so the report shows what verl would see.
    from mismatch_cli.numbers import threshold_value

    return threshold_value(text, flag, allow_none=False)


def _whole(text: str, flag: str) -> int:
    from mismatch_cli.numbers import parse_integer

    return parse_integer(text, flag, -(2**63), 2**63 - 1, hint=f"give {flag} a whole number, e.g. {flag} 4")


def _parse_columns(pairs: list[str]) -> dict[str, str]:
    from mismatch_cli.batch import ROLES

    columns: dict[str, str] = {}
    for pair in pairs:
        role, sep, name = pair.partition("=")
        role = role.strip()
        if not sep or not name.strip():
            raise UsageError(f"--column expects ROLE=NAME, got '{pair}'", hint="e.g. --column response_mask=loss_mask")
        if role not in ROLES:
            raise UsageError(f"--column: unknown role '{role}'", hint=f"roles are {', '.join(ROLES)}")
        if role in columns and columns[role] != name.strip():
            raise UsageError(f"--column {role} given twice ({columns[role]} and {name.strip()})",
                             hint=f"keep one --column {role}=NAME")
        columns[role] = name.strip()
    return columns


def _load_config_table(path: Path | None) -> dict[str, Any]:
    from mismatch_cli.tomlconfig import load_table

    return {} if path is None else load_table(path, "correction")


InputsArg = Annotated[
    list[str],
    typer.Argument(help="Dump files (parquet, safetensors, slime .pt, NeMo-RL / prime-rl .jsonl), folders or globs."),
]
ColumnOpt = Annotated[
    list[str], typer.Option("--column", help="Map a role to a column: ROLE=NAME (roles: old_log_probs, "
                            "rollout_log_probs, response_mask). Repeatable.")
]
NoMaskOpt = Annotated[bool, typer.Option("--no-mask", help="Treat every token as valid when the dump has no mask.")]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="A verl preset (see `mismatch presets`).")]
IsOpt = Annotated[IsLevel | None, typer.Option("--is", help="IS level (verl rollout_is).")]
IsThresholdOpt = Annotated[
    str | None, typer.Option("--is-threshold", help="TIS upper bound (2.0) or IcePop band L_U (0.5_5.0).")
]
IsNormOpt = Annotated[
    bool | None, typer.Option("--is-batch-normalize/--no-is-batch-normalize", help="Normalize IS weights to mean 1.")
]
RsOpt = Annotated[str | None, typer.Option("--rs", help="RS options, comma-chained (e.g. seq_mean_k1,token_k2).")]
RsThresholdOpt = Annotated[
    str | None, typer.Option("--rs-threshold", help="RS thresholds: one shared or one per option, comma-separated.")
]
K1Opt = Annotated[K1Bounds | None, typer.Option("--k1-bounds", help="verl (reproduce verl) or ratio (L<=ratio<=U).")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="TOML file with a [correction] table (verl field names).")
]
SemanticsOpt = Annotated[
    Semantics | None, typer.Option("--semantics", help="Trainer family whose rules and keys to reproduce.")
]
IsLevelOpt = Annotated[
    str | None, typer.Option("--is-level", help="verl-0.6.0 / xtuner: token, sequence or geometric.")
]
IsModeOpt = Annotated[
    str | None, typer.Option("--is-mode", help="verl-0.6.0: truncate|mask; xtuner: truncate|mask|both.")
]
IsLowerOpt = Annotated[str | None, typer.Option("--is-threshold-lower", help="verl-0.6.0: IS lower bound L.")]
IsMaskThresholdOpt = Annotated[
    str | None, typer.Option("--is-mask-threshold", help="xtuner: mask band as U,L (xtuner's order).")
]
RsLowerOpt = Annotated[
    str | None, typer.Option("--rs-threshold-lower", help="verl-0.7.0 / 0.6.1: RS lower bound L.")
]
VetoOpt = Annotated[
    str | None, typer.Option("--veto-threshold", help="verl-0.7.0 / 0.6.x: V (0.6.0 default 1e-4; none = off); "
                             "xtuner: U,L.")
]
MaskDtypeOpt = Annotated[
    MaskDtype | None,
    typer.Option("--mask-dtype", help="Older families: the trainer's mask dtype (bool = exact means)."),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Per-token compute precision.")]


def _family_flags(is_level: str | None, is_mode: str | None, is_threshold_lower: str | None,
                  is_mask_threshold: str | None, rs_threshold_lower: str | None, veto_threshold: str | None,
                  mask_dtype: MaskDtype | None) -> dict[str, Any]:
    """The older families' flags as given, keyed by flag (analyze, compare and check take the same ones)."""
    return {"--is-level": is_level, "--is-mode": is_mode, "--is-threshold-lower": is_threshold_lower,
            "--is-mask-threshold": is_mask_threshold, "--rs-threshold-lower": rs_threshold_lower,
            "--veto-threshold": veto_threshold, "--mask-dtype": mask_dtype.value if mask_dtype else None}


def _correction(
    config_file: Path | None,
    preset: str | None,
    is_level: IsLevel | None,
    is_threshold: str | None,
    is_batch_normalize: bool | None,
    rs: str | None,
    rs_threshold: str | None,
    k1_bounds: K1Bounds | None,
    semantics: Semantics | None = None,
    family_flags: dict[str, Any] | None = None,
) -> Any:
    from mismatch_cli.cli_flags import family_fields_from_flags
    from mismatch_cli.correction import (
        FAMILIES,
        FAMILY_FIELDS,
        VERL_FAMILIES,
        CorrectionConfig,
        build_config,
        field_home,
    )

    table = _load_config_table(config_file)
    family = semantics.value if semantics is not None else str(table.pop("semantics", "verl"))
    table.pop("semantics", None)
    if family not in FAMILIES:
        raise UsageError(f"{config_file}: unknown semantics '{family}'", hint=f"use one of {', '.join(FAMILIES)}")
    flags = {"--preset": preset, "--is-threshold": is_threshold, "--is-batch-normalize": is_batch_normalize,
             "--rs": rs, "--rs-threshold": rs_threshold, "--k1-bounds": k1_bounds.value if k1_bounds else None,
             "--is": (None if is_level is IsLevel.none else is_level.value) if is_level is not None else None,
             **(family_flags or {})}
    if family not in VERL_FAMILIES:
        fields = {**table, **family_fields_from_flags(family, flags)}
        if is_level is IsLevel.none:
            fields["rollout_is"] = None
        return _validated(CorrectionConfig(semantics=family, family_fields=fields), family)
    family_fields_from_flags(family, {k: v for k, v in flags.items() if v is not None and k not in (
        "--preset", "--is-threshold", "--is-batch-normalize", "--rs", "--rs-threshold", "--k1-bounds", "--is")})
    for key in table:
        if key not in FAMILY_FIELDS["verl"] and field_home(key):
            raise UsageError(f"{config_file}: {key} is not a field of verl 0.9's [correction]",
                             hint=f"add semantics = \"{field_home(key).split(',')[0].split(' ')[0]}\" ({key} "
                             f"belongs to {field_home(key)})")
    preset = preset or table.pop("preset", None)
    overrides: dict[str, Any] = dict(table)
    if is_level is not None:
        overrides["rollout_is"] = None if is_level is IsLevel.none else is_level.value
    if is_threshold is not None:
        overrides["rollout_is_threshold"] = _threshold_value(is_threshold, "--is-threshold")
    if is_batch_normalize is not None:
        overrides["rollout_is_batch_normalize"] = is_batch_normalize
    if rs is not None:
        overrides["rollout_rs"] = None if rs.strip().lower() == "none" else rs
    if rs_threshold is not None:
        overrides["rollout_rs_threshold"] = _threshold_value(rs_threshold, "--rs-threshold")
    if k1_bounds is not None:
        overrides["k1_bounds"] = k1_bounds.value
    return _validated(build_config(overrides, preset=preset, semantics=family), family)


def _validated(config: Any, family: str) -> Any:
    """The configuration, once its family's rules accept it: errors come before any input is read."""
    from mismatch_cli.cli_flags import name_flags
    from mismatch_cli.correction import resolve
    from mismatch_cli.errors import MismatchError

    try:
        resolve(config)
    except MismatchError as error:
        raise name_flags(error, family) from None
    return config


@app.command()
@_guard
def analyze(
    inputs: InputsArg,
    preset: PresetOpt = None,
    is_level: IsOpt = None,
    is_threshold: IsThresholdOpt = None,
    is_batch_normalize: IsNormOpt = None,
    rs: RsOpt = None,
    rs_threshold: RsThresholdOpt = None,
    k1_bounds: K1Opt = None,
    semantics: SemanticsOpt = None,
    is_level_legacy: IsLevelOpt = None,
    is_mode: IsModeOpt = None,
    is_threshold_lower: IsLowerOpt = None,
    is_mask_threshold: IsMaskThresholdOpt = None,
    rs_threshold_lower: RsLowerOpt = None,
    veto_threshold: VetoOpt = None,
    mask_dtype: MaskDtypeOpt = None,
    config: ConfigOpt = None,
    column: ColumnOpt = [],  # noqa: B006 - typer needs a literal default
    no_mask: NoMaskOpt = False,
    input_format: InputFormatOpt = InputFormat.auto,
    by: Annotated[
        list[str],
        typer.Option("--by", help="Also report each step (`step`) or each value of a column (e.g. env_name) as its "
                     "own batch. Repeatable."),
    ] = [],  # noqa: B006
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", help="Write DIR/report.json, DIR/*.png and DIR/report.html.")
    ] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="Report format on stdout / -o.")] = (
        OutputFormat.table
    ),
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write the report to FILE ('-' = stdout).")
    ] = None,
    no_plots: Annotated[
        bool, typer.Option("--no-plots", help="With --out-dir: skip the PNG plots and report.html.")
    ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = Dtype.float32,
    quiet: QuietOpt = False,
    engine: Annotated[Engine | None, typer.Option("--engine", help="local, or ray: the same accumulators on a "
                                                  "Ray cluster (pip install 'mismatch-cli[ray]').")] = None,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster to join (default: "
                                                    "RAY_ADDRESS, else a local one).")] = None,
    bootstrap: Annotated[str, typer.Option("--bootstrap", metavar="K", help="Poisson-bootstrap replicates for the "
                                           "report's 95% intervals (0..10000; 0 = off, a little faster).")] = "200",
) -> None:
    """Analyze rollout dumps: verl's rollout-correction metrics, health summary, report.json."""
    from mismatch_cli.api import analyze as run_analysis
    from mismatch_cli.api import check_bootstrap
    from mismatch_cli.io import ReadOptions

    replicates = check_bootstrap(bootstrap)
    family_flags = _family_flags(is_level_legacy, is_mode, is_threshold_lower, is_mask_threshold, rs_threshold_lower,
                                 veto_threshold, mask_dtype)
    correction = _correction(config, preset, is_level, is_threshold, is_batch_normalize, rs, rs_threshold,
                             k1_bounds, semantics, family_flags)
    outputs = _planned_outputs([*inputs, config], out_dir, output)
    read_options = ReadOptions(columns=_parse_columns(column), no_mask=no_mask, input_format=input_format.value)
    from mismatch_cli.io.counts import measure_inputs
    from mismatch_cli.render.progress import reading_progress

    bar = not quiet and sys.stderr.isatty()
    with reading_progress(measure_inputs(inputs, input_format.value) if bar else None) as on_batch:
        report = run_analysis(
            inputs,
            correction=correction,
            read_options=read_options,
            device=device,
            dtype=dtype.value,
            group_by=_parse_by(by),
            on_batch=on_batch,
            engine=(engine or Engine.local).value,
            ray_address=ray_address,
            bootstrap=replicates,
        )
    rendered = _render(report, output_format, quiet)
    figures: dict[str, bytes] = {}
    page = ""
    if out_dir is not None and not no_plots:
        # Rendered before anything is written, so a failure leaves no partial output.
        from mismatch_cli.render.html import render_html
        from mismatch_cli.render.plots import render_plots

        figures = render_plots(report)
        page = render_html(report, figures)
    outputs.protect(entry.path for entry in report.inputs)  # files found in input folders
    if out_dir is not None:
        outputs.add(out_dir / "report.json", report.to_json(), "--out-dir")
        if not no_plots:
            for name, data in {**figures, "report.html": page}.items():
                outputs.add(out_dir / name, data, "--out-dir")
    if output is not None and output != "-":
        outputs.add(output, rendered, "-o")
    outputs.commit()
    if output is None or output == "-":
        _print_rendered(report, output_format, rendered, quiet)
    err = _stderr()
    if not quiet:
        if output_format is not OutputFormat.table or (output is not None and output != "-"):
            for warning in report.warnings:
                err.print(f"warning: {warning}", markup=False)
        if out_dir is not None:
            err.print(f"wrote {out_dir / 'report.json'}", markup=False)
            if not no_plots:
                err.print(f"wrote {out_dir / 'report.html'} and {len(figures)} plots "
                          f"({', '.join(figures) or 'none'})", markup=False)
        if output is not None and output != "-":
            err.print(f"wrote {output}", markup=False)


def _planned_outputs(inputs: list[Any], out_dir: Path | None, output: str | None) -> Outputs:
    """The command's outputs, refused now (before any work) when they cannot be written or would hit an input."""
    outputs = Outputs(inputs)
    if out_dir is not None:
        outputs.check_dir(out_dir, "--out-dir")
    if output is not None and output != "-":
        outputs.check(output, "-o")
    return outputs


def _render(report: Any, output_format: OutputFormat, quiet: bool = False) -> str:
    if output_format is OutputFormat.json:
        return report.to_json()
    if output_format is OutputFormat.markdown:
        from mismatch_cli.render.markdown import render_markdown

        return render_markdown(report)
    from mismatch_cli.render.table import render_tables

    console = Console(record=True, file=open(os.devnull, "w"), width=120, color_system=None)  # noqa: SIM115
    render_tables(report, console, warnings=not quiet)
    return console.export_text()


def _print_rendered(report: Any, output_format: OutputFormat, rendered: str, quiet: bool = False) -> None:
    if output_format is OutputFormat.table:
        from mismatch_cli.render.table import render_tables

        render_tables(report, Console(highlight=False), warnings=not quiet)
    else:
        sys.stdout.write(rendered)


@app.command()
@_guard
def presets(
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
    semantics: SemanticsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """List the rollout-correction presets of verl (or of an older family) with their parameters."""
    import json

    from mismatch_cli.correction import presets_table

    family = semantics.value if semantics is not None else "verl"
    fields, rows = presets_table(family)
    if not rows and not quiet:
        _stderr().print(f"{family} has no presets: set its fields (see `mismatch analyze --help`)", markup=False)
    if output_format is OutputFormat.json:
        from mismatch_cli.report import SCHEMA_VERSION

        document = {"schema_version": SCHEMA_VERSION, "semantics": family, "presets": rows}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    columns = ["name", *fields, "summary"]
    if output_format is OutputFormat.markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in columns) + " |" for r in rows]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    from rich.table import Table

    table = Table(title=f"{family} presets ({len(rows)}); use --preset NAME", title_justify="left")
    for c in columns:
        table.add_column(c.replace("rollout_", ""), overflow="fold")
    for r in rows:
        table.add_row(*["-" if r[c] is None else str(r[c]) for c in columns])
    Console(highlight=False).print(table)


@app.command("metrics")
@_guard
def metrics_command(
    query: Annotated[str | None, typer.Argument(help="Only this key, or the keys containing this text.")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
) -> None:
    """List every metric key: meaning, reduction, which way is better, healthy band and its source."""
    from mismatch_cli.metrics import closest, find
    from mismatch_cli.render.metrics import render_metrics_json, render_metrics_markdown, render_metrics_table

    chosen = find(query)
    if not chosen:
        close = closest(query or "")
        raise UsageError(f"no metric key matches '{query}'",
                         hint=f"did you mean {', '.join(close)}?" if close else "run `mismatch metrics` for all")
    if output_format is OutputFormat.json:
        sys.stdout.write(render_metrics_json(chosen))
    elif output_format is OutputFormat.markdown:
        sys.stdout.write(render_metrics_markdown(chosen))
    else:
        render_metrics_table(chosen, Console(highlight=False))


@app.command()
@_guard
def synth(
    output: Annotated[Path, typer.Argument(help="File to write (.parquet or .safetensors).")],
    tokens: Annotated[str, typer.Option("--tokens", metavar="N", help="Approximate number of response tokens.")] = (
        "100000"
    ),
    turns: Annotated[str, typer.Option("--turns", metavar="N", help="Rounds per trajectory (multi-turn when > 1).")] = (
        "1"
    ),
    seed: Annotated[str, typer.Option("--seed", metavar="N", help="Random seed (>= 0).")] = "0",
    file_format: Annotated[SynthFormat | None, typer.Option("--format", help="Default: from the suffix.")] = None,
    layout: Annotated[SynthLayout, typer.Option("--layout", help="safetensors layout.")] = SynthLayout.padded,
    empty_rows: Annotated[
        str, typer.Option("--empty-rows", metavar="F", help="Fraction of all-zero masks, in [0, 1).")
    ] = "0.0",
    steps: Annotated[str, typer.Option("--steps", metavar="N", help="Spread rows over this many steps.")] = "1",
    noise: Annotated[str, typer.Option("--noise", metavar="X", help="Scale of the trainer/inference mismatch "
                                       "(>= 0).")] = "1.0",
    quiet: QuietOpt = False,
) -> None:
    """Write a realistic synthetic dump (for trying the tool and for benchmarks)."""
    from mismatch_cli.numbers import parse_number
    from mismatch_cli.synth import SynthSpec, write_synthetic_dump

    if file_format is None:
        suffix = output.suffix.lower()
        if suffix not in (".parquet", ".safetensors"):
            raise UsageError(
                f"cannot tell the format of '{output}'", hint="use a .parquet/.safetensors name or --format"
            )
        file_format = SynthFormat(suffix[1:])
    # Ranges are checked by SynthSpec; here only the strict reading of each number.
    spec = SynthSpec(tokens=_whole(tokens, "--tokens"), turns=_whole(turns, "--turns"), seed=_whole(seed, "--seed"),
                     format=file_format.value, layout=layout.value, empty_rows=parse_number(empty_rows, "--empty-rows"),
                     steps=_whole(steps, "--steps"), noise=parse_number(noise, "--noise"))
    summary = write_synthetic_dump(output, spec)
    if not quiet:
        _stderr().print(
            f"wrote {summary.path}: {summary.sequences} sequences, {summary.tokens} response tokens", markup=False
        )


# ------------------------------------------------------------------------------------- compare and check


class MissingPolicy(str, enum.Enum):
    """What a rule naming a metric the input (or the baseline) lacks does."""

    error = "error"
    warn = "warn"
    skip = "skip"


class GithubMode(str, enum.Enum):
    """GitHub Actions annotations and step summary: auto = when GITHUB_ACTIONS=true."""

    auto = "auto"
    on = "on"
    off = "off"


FailOnOpt = Annotated[list[str], typer.Option("--fail-on", help=RULE_HELP)]
MissingOpt = Annotated[
    MissingPolicy | None,
    typer.Option("--missing", help="A rule naming a metric the input or baseline lacks: error (default), warn, skip."),
]
BootstrapOpt = Annotated[
    str, typer.Option("--bootstrap", metavar="K", help="Poisson-bootstrap replicates for the 95% intervals "
                      "(0..10000; 0 = off).")
]
LimitsConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="TOML with [check] (fail_on, baseline, missing) and [correction].")
]


def _rules(config: Path | None, fail_on: list[str], missing: MissingPolicy | None) -> tuple[Any, list[Any], str]:
    from mismatch_cli.thresholds import load_check_config, parse_rule

    table = load_check_config(config)
    rules = table.rules + [parse_rule(text) for text in fail_on]
    policy = missing.value if missing is not None else (table.missing or "error")
    return table, rules, policy


def _analyzer(correction: Any, column: list[str], no_mask: bool, device: str, dtype: Dtype, bootstrap: str,
              input_format: InputFormat = InputFormat.auto) -> Any:
    from mismatch_cli.api import analyze as run_analysis
    from mismatch_cli.api import check_bootstrap
    from mismatch_cli.io import ReadOptions

    replicates = check_bootstrap(bootstrap)
    read_options = ReadOptions(columns=_parse_columns(column), no_mask=no_mask, input_format=input_format.value)
    return functools.partial(run_analysis, correction=correction, read_options=read_options, device=device,
                             dtype=dtype.value, bootstrap=replicates)


def _console_text(draw: Callable[[Console], None]) -> str:
    console = Console(record=True, file=open(os.devnull, "w"), width=120, color_system=None)  # noqa: SIM115
    draw(console)
    return console.export_text()


@app.command()
@_guard
def compare(
    base: Annotated[str, typer.Argument(help="The reference: a dump, a folder of dumps, or a report.json.")],
    candidate: Annotated[str, typer.Argument(help="Judged against BASE: a dump, a folder of dumps, or a report.json.")],
    preset: PresetOpt = None,
    is_level: IsOpt = None,
    is_threshold: IsThresholdOpt = None,
    is_batch_normalize: IsNormOpt = None,
    rs: RsOpt = None,
    rs_threshold: RsThresholdOpt = None,
    k1_bounds: K1Opt = None,
    semantics: SemanticsOpt = None,
    is_level_legacy: IsLevelOpt = None,
    is_mode: IsModeOpt = None,
    is_threshold_lower: IsLowerOpt = None,
    is_mask_threshold: IsMaskThresholdOpt = None,
    rs_threshold_lower: RsLowerOpt = None,
    veto_threshold: VetoOpt = None,
    mask_dtype: MaskDtypeOpt = None,
    config: LimitsConfigOpt = None,
    fail_on: FailOnOpt = [],  # noqa: B006 - typer needs a literal default
    missing: MissingOpt = None,
    column: ColumnOpt = [],  # noqa: B006
    no_mask: NoMaskOpt = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", help="Write compare.json, compare.md, reports and overlaid plots.")
    ] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="What is printed on stdout / -o.")] = (
        OutputFormat.table
    ),
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write the comparison to FILE ('-' = stdout).")
    ] = None,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Skip the overlaid plots in --out-dir.")] = False,
    bootstrap: BootstrapOpt = "200",
    input_format: InputFormatOpt = InputFormat.auto,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """Compare two runs side by side (BASE is the reference); exit 1 only when a given limit is breached."""
    from mismatch_cli.compare import compare_reports, correction_notes, load_side
    from mismatch_cli.render.compare import (
        render_compare_json,
        render_compare_markdown,
        render_compare_plots,
        render_compare_table,
    )

    family_flags = _family_flags(is_level_legacy, is_mode, is_threshold_lower, is_mask_threshold, rs_threshold_lower,
                                 veto_threshold, mask_dtype)
    correction = _correction(config, preset, is_level, is_threshold, is_batch_normalize, rs, rs_threshold,
                             k1_bounds, semantics, family_flags)
    _, rules, policy = _rules(config, fail_on, missing)
    outputs = _planned_outputs([base, candidate, config], out_dir, output)
    analyze_side = _analyzer(correction, column, no_mask, device, dtype, bootstrap, input_format)
    base_report, base_is_report = load_side(base, analyze_side)
    candidate_report, candidate_is_report = load_side(candidate, analyze_side)
    comparison = compare_reports(base_report, candidate_report, rules, policy, base, candidate)
    flags_given = any(v is not None for v in (preset, is_level, is_threshold, is_batch_normalize, rs, rs_threshold,
                                              k1_bounds, semantics, *family_flags.values())) or bool(
        _load_config_table(config))
    if flags_given:
        requested = correction.to_dict()
        for label, report, is_report in ((base, base_report, base_is_report),
                                         (candidate, candidate_report, candidate_is_report)):
            if is_report:
                comparison.notes += correction_notes(label, report, requested)
    if output_format is OutputFormat.json:
        rendered = render_compare_json(comparison)
    elif output_format is OutputFormat.markdown:
        rendered = render_compare_markdown(comparison)
    else:
        rendered = _console_text(lambda console: render_compare_table(comparison, console))
    for report in (base_report, candidate_report):
        outputs.protect(entry.path for entry in report.inputs)
    if out_dir is not None:
        outputs.add(out_dir / "compare.json", render_compare_json(comparison), "--out-dir")
        outputs.add(out_dir / "compare.md", render_compare_markdown(comparison), "--out-dir")
        for name, report, is_report in (("base", base_report, base_is_report),
                                        ("candidate", candidate_report, candidate_is_report)):
            if not is_report:
                outputs.add(out_dir / f"{name}_report.json", report.to_json(), "--out-dir")
        if not no_plots:
            for name, data in render_compare_plots(comparison, base_report, candidate_report).items():
                outputs.add(out_dir / name, data, "--out-dir")
    if output is not None and output != "-":
        outputs.add(output, rendered, "-o")
    outputs.commit()
    if output is None or output == "-":
        if output_format is OutputFormat.table:
            render_compare_table(comparison, Console(highlight=False))
        else:
            sys.stdout.write(rendered)
    if not quiet:
        err = _stderr()
        if out_dir is not None:
            err.print(f"wrote {out_dir}/compare.json, compare.md" + ("" if no_plots else " and plots"), markup=False)
        err.print(comparison.verdict(), markup=False)
    if comparison.check is not None and comparison.check.exit_code:
        raise typer.Exit(comparison.check.exit_code)


@app.command()
@_guard
def check(
    inputs: Annotated[list[str], typer.Argument(help="Dumps (files, folders, globs) or one report.json.")],
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Report (report.json) that relative rules compare against.")
    ] = None,
    config: LimitsConfigOpt = None,
    fail_on: FailOnOpt = [],  # noqa: B006 - typer needs a literal default
    missing: MissingOpt = None,
    junit_xml: Annotated[Path | None, typer.Option("--junit-xml", help="Write JUnit XML (one case per rule).")] = None,
    github: Annotated[
        GithubMode, typer.Option("--github", help="Annotations and step summary: auto (GITHUB_ACTIONS=true), on, off.")
    ] = GithubMode.auto,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="What is printed on stdout.")] = (
        OutputFormat.table
    ),
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="Write DIR/report.json of the input.")] = None,
    preset: PresetOpt = None,
    is_level: IsOpt = None,
    is_threshold: IsThresholdOpt = None,
    is_batch_normalize: IsNormOpt = None,
    rs: RsOpt = None,
    rs_threshold: RsThresholdOpt = None,
    k1_bounds: K1Opt = None,
    semantics: SemanticsOpt = None,
    is_level_legacy: IsLevelOpt = None,
    is_mode: IsModeOpt = None,
    is_threshold_lower: IsLowerOpt = None,
    is_mask_threshold: IsMaskThresholdOpt = None,
    rs_threshold_lower: RsLowerOpt = None,
    veto_threshold: VetoOpt = None,
    mask_dtype: MaskDtypeOpt = None,
    column: ColumnOpt = [],  # noqa: B006
    no_mask: NoMaskOpt = False,
    bootstrap: BootstrapOpt = "200",
    input_format: InputFormatOpt = InputFormat.auto,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """The CI gate: hold a dump (or report) to limits; exit 1 on a breach, 2 on a bad rule, 3 on bad input."""
    from mismatch_cli.compare import is_report_path, load_side
    from mismatch_cli.output import append_text
    from mismatch_cli.render.compare import render_check_markdown, render_check_table
    from mismatch_cli.render.github import annotations, step_summary
    from mismatch_cli.render.junit import render_junit
    from mismatch_cli.report import Report
    from mismatch_cli.thresholds import CheckResult, Outcome, Rule, evaluate, require_baseline

    label = " ".join(inputs)
    github_on = github is GithubMode.on or (github is GithubMode.auto and os.environ.get("GITHUB_ACTIONS") == "true")
    err = _stderr()
    outputs = Outputs([*inputs, baseline, config])
    if junit_xml is not None:
        outputs.check(junit_xml, "--junit-xml")  # before the try: a broken --junit-xml cannot report itself

    def publish(result: CheckResult, baseline_label: str | None) -> None:
        # Every file first, so CI sees them whatever the exit code.
        if junit_xml is not None:
            outputs.add(junit_xml, render_junit(result, label), "--junit-xml")
        outputs.commit()
        if github_on:
            for line in annotations(result):
                err.print(line, markup=False, highlight=False, soft_wrap=True)
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                problem = append_text(summary, step_summary(result, label, baseline_label) + "\n")
                if problem:
                    err.print(f"warning: GITHUB_STEP_SUMMARY: {problem}", markup=False)

    try:
        family_flags = _family_flags(is_level_legacy, is_mode, is_threshold_lower, is_mask_threshold,
                                     rs_threshold_lower, veto_threshold, mask_dtype)
        correction = _correction(config, preset, is_level, is_threshold, is_batch_normalize, rs, rs_threshold,
                                 k1_bounds, semantics, family_flags)
        table, rules, policy = _rules(config, fail_on, missing)
        baseline = baseline or table.baseline
        if not rules:
            raise UsageError("no rules to check", hint="pass --fail-on RULE or a --config with a [check] table")
        require_baseline(rules, baseline)
        if out_dir is not None:
            outputs.check_dir(out_dir, "--out-dir")
        analyze_side = _analyzer(correction, column, no_mask, device, dtype, bootstrap, input_format)
        if len(inputs) == 1 and is_report_path(inputs[0]):
            candidate, _ = load_side(inputs[0], analyze_side)
        else:
            candidate = analyze_side(inputs)
        baseline_report: Report | None = load_side(baseline, analyze_side)[0] if baseline else None
    except MismatchError as exc:
        # The gate could not run: still leave a JUnit case / annotation that says why.
        failed = CheckResult([Outcome(Rule("mismatch check", "-", "<=", 0.0), "error", message=str(exc),
                                      exit_code=exc.exit_code)])
        publish(failed, baseline)
        raise
    result = evaluate(rules, candidate, baseline_report, policy)
    outputs.protect(entry.path for report in (candidate, baseline_report) if report for entry in report.inputs)
    if out_dir is not None:
        outputs.add(out_dir / "report.json", candidate.to_json(), "--out-dir")
    publish(result, baseline)
    title = f"mismatch check: {label}" + (f" (baseline {baseline})" if baseline else "")
    if output_format is OutputFormat.json:
        import json

        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    elif output_format is OutputFormat.markdown:
        sys.stdout.write(render_check_markdown(result, title))
    else:
        render_check_table(result, Console(highlight=False), title)
    if not quiet:
        err.print(result.verdict(), markup=False)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _parse_by(values: list[str]) -> tuple[str, ...]:
    """`--by` values: `step` or column names, repeatable or comma-separated."""
    names = [part.strip() for value in values for part in value.split(",")]
    if any(not name for name in names):
        raise UsageError("--by expects `step` or a column name, got an empty value",
                         hint="e.g. --by step --by env_name")
    return tuple(dict.fromkeys(names))


@app.command()
@_guard
def convert(
    inputs: InputsArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="The parquet file to write (atomically).")],
    input_format: InputFormatOpt = InputFormat.auto,
    column: ColumnOpt = [],  # noqa: B006 - typer needs a literal default
    no_mask: NoMaskOpt = False,
    keep: Annotated[
        list[str],
        typer.Option("--keep", help="Also copy this per-row column (e.g. data_source). Repeatable; prime-rl's "
                     "env_name is always kept."),
    ] = [],  # noqa: B006
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Storage precision of the log-probs.")] = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """Convert dumps (slime, NeMo-RL, prime-rl, safetensors, parquet) into mismatch's wide parquet layout."""
    from mismatch_cli.convert import convert as run_convert
    from mismatch_cli.io import ReadOptions

    if str(output) == "-":
        raise UsageError("convert writes a parquet file, not stdout", hint="give -o FILE.parquet")
    read_options = ReadOptions(columns=_parse_columns(column), no_mask=no_mask, input_format=input_format.value,
                               group_columns=tuple(dict.fromkeys(k.strip() for k in keep if k.strip())))
    summary = run_convert(inputs, output, read_options, dtype=dtype.value)
    if not quiet:
        err = _stderr()
        for warning in summary.warnings:
            err.print(f"warning: {warning}", markup=False)
        err.print(
            f"wrote {summary.path}: {summary.sequences} sequences, {summary.valid_tokens} valid tokens from "
            f"{len(summary.inputs)} file(s); columns {', '.join(summary.columns)}",
            markup=False,
        )


def main() -> None:
    """Console-script entry point: the guards of `_guard` also cover --help, --version and argument parsing."""
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
            _stderr().print(f"error: {exc}", markup=False)
            sys.exit(exc.exit_code)
        except Terminated:
            sys.exit(EXIT_SIGTERM)
        except KeyboardInterrupt:
            sys.exit(EXIT_SIGINT)


if __name__ == "__main__":
    main()
