"""The command line: parse, call the core, render, and map errors to exit codes (in `_guard` only)."""

from __future__ import annotations

import enum
import functools
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from mismatch_cli import __version__
from mismatch_cli.errors import MismatchError, UsageError

EXIT_CODES_HELP = (
    "Exit codes: 0 ran, nothing breached; 1 a threshold was breached; 2 usage or configuration "
    "error; 3 input or data error; 4 internal error (MISMATCH_DEBUG=1 shows the traceback)."
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


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _guard(command: F) -> F:
    """Run a command body, turning our exceptions into one stderr line and their exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = os.environ.get("MISMATCH_DEBUG") == "1"
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise
        except MismatchError as exc:
            if debug:
                traceback.print_exc()
            _stderr().print(f"error: {exc}", markup=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            _stderr().print("interrupted", markup=False)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 4
            if debug:
                traceback.print_exc()
            _stderr().print(
                f"internal error: {type(exc).__name__}: {exc}; fix: re-run with MISMATCH_DEBUG=1 for the "
                "traceback and report it",
                markup=False,
            )
            raise typer.Exit(4) from None

    return wrapper  # type: ignore[return-value]


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


class Dtype(str, enum.Enum):
    """Compute precision of per-token math (reductions are always float64)."""

    float32 = "float32"
    float64 = "float64"


class ByKey(str, enum.Enum):
    """Extra breakdowns."""

    step = "step"


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


def _threshold_value(text: str | None) -> str | float | None:
    # verl accepts a number or a string; keep numbers numeric so the report shows what verl would see.
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


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
        columns[role] = name.strip()
    return columns


def _load_config_table(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}", hint="check the --config path") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}", hint="fix the TOML syntax") from None
    table = data.get("correction", data.get("tool", {}).get("mismatch", {}).get("correction", {}))
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [correction] must be a table", hint="see the README's config example")
    return dict(table)


def _check_writable_dir(directory: Path, flag: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{flag} {directory} exists and is not a directory", hint=f"pass a directory to {flag}")


def _write_atomic(path: Path, text: str) -> None:
    """Write a file so that a reader never sees it half-written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", hint="choose a writable output path") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


InputsArg = Annotated[list[str], typer.Argument(help="Dump files (.parquet, .safetensors), folders or globs.")]
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
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Per-token compute precision.")]


def _correction(
    config_file: Path | None,
    preset: str | None,
    is_level: IsLevel | None,
    is_threshold: str | None,
    is_batch_normalize: bool | None,
    rs: str | None,
    rs_threshold: str | None,
    k1_bounds: K1Bounds | None,
) -> Any:
    from mismatch_cli.config import build_config

    table = _load_config_table(config_file)
    preset = preset or table.pop("preset", None)
    semantics = table.pop("semantics", "verl")
    if semantics != "verl":
        raise UsageError(
            f"{config_file}: semantics '{semantics}' is not supported by this version (only 'verl', i.e. verl "
            "0.7.1 and later)",
            hint="remove `semantics` from the [correction] table or set it to \"verl\"",
        )
    overrides: dict[str, Any] = dict(table)
    if is_level is not None:
        overrides["rollout_is"] = None if is_level is IsLevel.none else is_level.value
    if is_threshold is not None:
        overrides["rollout_is_threshold"] = _threshold_value(is_threshold)
    if is_batch_normalize is not None:
        overrides["rollout_is_batch_normalize"] = is_batch_normalize
    if rs is not None:
        overrides["rollout_rs"] = None if rs.strip().lower() == "none" else rs
    if rs_threshold is not None:
        overrides["rollout_rs_threshold"] = _threshold_value(rs_threshold)
    if k1_bounds is not None:
        overrides["k1_bounds"] = k1_bounds.value
    return build_config(overrides, preset=preset)


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
    config: ConfigOpt = None,
    column: ColumnOpt = [],  # noqa: B006 - typer needs a literal default
    no_mask: NoMaskOpt = False,
    by: Annotated[list[ByKey], typer.Option("--by", help="Also report each step as its own batch.")] = [],  # noqa: B006
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="Write DIR/report.json.")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="Report format on stdout / -o.")] = (
        OutputFormat.table
    ),
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write the report to FILE ('-' = stdout).")
    ] = None,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Skip plots (accepted for scripts).")] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = Dtype.float32,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Only errors on stderr.")] = False,
) -> None:
    """Analyze rollout dumps: verl's rollout-correction metrics, health summary, report.json."""
    from mismatch_cli.api import analyze as run_analysis
    from mismatch_cli.io import ReadOptions

    correction = _correction(config, preset, is_level, is_threshold, is_batch_normalize, rs, rs_threshold,
                             k1_bounds)
    if out_dir is not None:
        _check_writable_dir(out_dir, "--out-dir")
    if output is not None and output != "-" and Path(output).is_dir():
        raise UsageError(f"-o {output} is a directory", hint="give a file name, or use --out-dir for a directory")
    read_options = ReadOptions(columns=_parse_columns(column), no_mask=no_mask)
    report = run_analysis(
        inputs,
        correction=correction,
        read_options=read_options,
        device=device,
        dtype=dtype.value,
        by_step=ByKey.step in by,
    )
    rendered = _render(report, output_format)
    if out_dir is not None:
        _write_atomic(out_dir / "report.json", report.to_json())
    if output is not None and output != "-":
        _write_atomic(Path(output), rendered)
    else:
        _print_rendered(report, output_format, rendered)
    err = _stderr()
    if not quiet:
        if output_format is not OutputFormat.table or (output is not None and output != "-"):
            for warning in report.warnings:
                err.print(f"warning: {warning}", markup=False)
        if out_dir is not None:
            err.print(f"wrote {out_dir / 'report.json'}", markup=False)
        if output is not None and output != "-":
            err.print(f"wrote {output}", markup=False)


def _render(report: Any, output_format: OutputFormat) -> str:
    if output_format is OutputFormat.json:
        return report.to_json()
    if output_format is OutputFormat.markdown:
        from mismatch_cli.render.markdown import render_markdown

        return render_markdown(report)
    from mismatch_cli.render.table import render_tables

    console = Console(record=True, file=open(os.devnull, "w"), width=120, color_system=None)  # noqa: SIM115
    render_tables(report, console)
    return console.export_text()


def _print_rendered(report: Any, output_format: OutputFormat, rendered: str) -> None:
    if output_format is OutputFormat.table:
        from mismatch_cli.render.table import render_tables

        render_tables(report, Console(highlight=False))
    else:
        sys.stdout.write(rendered)


@app.command()
@_guard
def presets(
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
) -> None:
    """List verl's rollout-correction presets with their parameters."""
    import json

    from mismatch_cli.config import PRESETS

    fields = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")
    rows = [{"name": p.name, **{f: getattr(p.config, f) for f in fields}, "summary": p.summary}
            for p in PRESETS.values()]
    if output_format is OutputFormat.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    columns = ["name", *fields, "summary"]
    if output_format is OutputFormat.markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in columns) + " |" for r in rows]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    from rich.table import Table

    table = Table(title=f"verl presets ({len(rows)}); use --preset NAME", title_justify="left")
    for c in columns:
        table.add_column(c.replace("rollout_", ""), overflow="fold")
    for r in rows:
        table.add_row(*["-" if r[c] is None else str(r[c]) for c in columns])
    Console(highlight=False).print(table)


@app.command()
@_guard
def synth(
    output: Annotated[Path, typer.Argument(help="File to write (.parquet or .safetensors).")],
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="Approximate number of response tokens.")] = 100_000,
    turns: Annotated[int, typer.Option("--turns", min=1, help="Rounds per trajectory (multi-turn when > 1).")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    file_format: Annotated[SynthFormat | None, typer.Option("--format", help="Default: from the suffix.")] = None,
    layout: Annotated[SynthLayout, typer.Option("--layout", help="safetensors layout.")] = SynthLayout.padded,
    empty_rows: Annotated[
        float, typer.Option("--empty-rows", min=0.0, max=1.0, help="Fraction of all-zero masks.")
    ] = 0.0,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Spread rows over this many steps.")] = 1,
    noise: Annotated[float, typer.Option("--noise", min=0.0, help="Scale of the trainer/inference mismatch.")] = 1.0,
) -> None:
    """Write a realistic synthetic dump (for trying the tool and for benchmarks)."""
    from mismatch_cli.synth import SynthSpec, write_synthetic_dump

    if file_format is None:
        suffix = output.suffix.lower()
        if suffix not in (".parquet", ".safetensors"):
            raise UsageError(
                f"cannot tell the format of '{output}'", hint="use a .parquet/.safetensors name or --format"
            )
        file_format = SynthFormat(suffix[1:])
    spec = SynthSpec(tokens=tokens, turns=turns, seed=seed, format=file_format.value, layout=layout.value,
                     empty_rows=empty_rows, steps=steps, noise=noise)
    summary = write_synthetic_dump(output, spec)
    _stderr().print(
        f"wrote {summary.path}: {summary.sequences} sequences, {summary.tokens} response tokens", markup=False
    )


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
