"""`mismatch analyze`: read dumps, run the correction, print the report and write its files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mismatch_cli.cli.app import app, guard
from mismatch_cli.cli.emit import OutputOpt, Rendered, deliver, note, note_idle, planned_outputs, to_file
from mismatch_cli.cli.options import (
    ByOpt,
    ComputeFlags,
    ConfigPathOpt,
    CorrectionFlags,
    Engine,
    InputFlags,
    InputsArg,
    OutputFormat,
    QuietOpt,
    ReportFormat,
    bundled,
    csv_table_flag,
    parse_by,
    read_options,
    refuse_without,
)

if TYPE_CHECKING:
    from mismatch_cli.report import Report


@app.command()
@guard
@bundled(CorrectionFlags, InputFlags, ComputeFlags)
def analyze(
    inputs: InputsArg,
    correction_flags: CorrectionFlags,
    input_flags: InputFlags,
    compute: ComputeFlags,
    config: ConfigPathOpt = None,
    by: ByOpt = [],  # noqa: B006 - typer needs a literal default
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", metavar="DIR",
                                  help="Write DIR/report.json, DIR/*.png and DIR/report.html.")
    ] = None,
    output_format: Annotated[ReportFormat, typer.Option("--format", help="Report format on stdout / -o: table, json, "
                                                        "markdown, or csv (one table, see --table).")] = (
        ReportFormat.table
    ),
    table_name: Annotated[str | None, typer.Option("--table", metavar="NAME",
                                                   help="With --format csv: steps, groups, rounds, "
                                                   "rounds_from_end, what_if, worst_sequences or metrics (default: "
                                                   "steps, else groups, else rounds).")] = None,
    output: OutputOpt = None,
    full: Annotated[bool, typer.Option("--full", help="Print every table instead of the one-screen summary "
                                       "(with --format table).")] = False,
    no_plots: Annotated[
        bool, typer.Option("--no-plots", help="With --out-dir: skip the PNG plots and report.html.")
    ] = False,
    quiet: QuietOpt = False,
    engine: Annotated[Engine, typer.Option("--engine", help="local, or ray: the same accumulators on a "
                                           "Ray cluster (pip install 'mismatch-cli[ray]').")] = Engine.local,
    ray_address: Annotated[str | None, typer.Option("--ray-address", metavar="ADDR",
                                                    help="Ray cluster to join (default: "
                                                    "RAY_ADDRESS, else a local one).")] = None,
    sha256: Annotated[bool, typer.Option("--sha256", help="Hash every input in full for report.json (default: "
                                         "inputs up to 256 MiB together; larger ones get a fingerprint of "
                                         "their size, first and last MiB).")] = False,
) -> None:
    """Analyze rollout dumps: verl's rollout-correction metrics, health summary, report.json."""
    from mismatch_cli.api import analyze as run_analysis
    from mismatch_cli.api import check_bootstrap
    from mismatch_cli.cli.flags import correction_from_flags
    from mismatch_cli.io.counts import measure_inputs
    from mismatch_cli.processes import parse_jobs
    from mismatch_cli.render.files import report_files
    from mismatch_cli.render.markdown import render_markdown
    from mismatch_cli.render.progress import reading_progress
    from mismatch_cli.render.summary import render_summary
    from mismatch_cli.render.table import render_tables

    note_idle("--no-plots", no_plots, "--out-dir DIR", out_dir is not None, quiet)
    refuse_without("--ray-address", ray_address is not None, "--engine ray", engine is Engine.ray)
    note_idle("--full", full, "--format table", output_format is ReportFormat.table, quiet)
    replicates = check_bootstrap(compute.bootstrap)
    jobs = parse_jobs(compute.jobs)
    table_name = csv_table_flag(output_format, table_name)
    correction = correction_from_flags(config, correction_flags)
    outputs = planned_outputs([*inputs, config], out_dir, output)
    options = read_options(input_flags)
    bar = not quiet and sys.stderr.isatty()
    with reading_progress(measure_inputs(inputs, input_flags.input_format.value) if bar else None) as on_batch:
        report = run_analysis(inputs, correction=correction, read_options=options, device=compute.device,
                              dtype=compute.dtype.value, group_by=parse_by(by), on_batch=on_batch,
                              engine=engine.value, ray_address=ray_address, bootstrap=replicates, jobs=jobs,
                              hash_inputs=True if sha256 else None)
    if output_format is ReportFormat.csv:
        from mismatch_cli.render.csv import default_csv_table, render_csv

        rendered = Rendered(render_csv(report, _nonempty_table(report, table_name)
                                                 or default_csv_table(report)))
    else:
        rendered = Rendered.of(OutputFormat(output_format.value), report.to_json, lambda: render_markdown(report),
                            (lambda console: render_tables(report, console, warnings=not quiet)) if full
                            else (lambda console: render_summary(report, console, warnings=not quiet)))
    outputs.protect(entry.path for entry in report.inputs)  # files found in input folders
    written = []
    if out_dir is not None:
        # Rendered before anything is written, so a failure leaves no partial output.
        files = report_files(report, plots=not no_plots)
        for name, data in files.items():
            outputs.add(out_dir / name, data, "--out-dir")
        written.append(f"wrote {out_dir / 'report.json'}")
        tables = [name for name in files if name.endswith(".csv")]
        if tables:
            written.append(f"wrote {', '.join(tables)} in {out_dir}")
        if not no_plots:
            plots = [name for name in files if name.endswith(".png")]
            written.append(f"wrote {out_dir / 'report.html'} and {len(plots)} plots ({', '.join(plots) or 'none'})")
    deliver(outputs, output, rendered)
    if output_format is not ReportFormat.table or to_file(output):
        note(quiet, *(f"warning: {warning}" for warning in report.warnings))
    note(quiet, *written, *([f"wrote {output}"] if to_file(output) else []), wrap=True)


def _nonempty_table(report: Report, name: str | None) -> str | None:
    """`--table NAME`, refused when the report holds no row of it (an empty CSV would pass for a result)."""
    from mismatch_cli.errors import UsageError
    from mismatch_cli.report import TABLES

    if name is None or len(report.table(name)):
        return name
    how = {"steps": "add --by step (the dump needs a step column or step metadata)",
           "groups": "add --by COLUMN (a per-row column such as env_name)"}.get(name, "pick another --table")
    if name == "steps" and report.config.get("by_step"):  # asked for, but the input has no steps to split by
        how = "the input has no step column or step metadata, so --by step made no table; pick another --table"
    present = [t for t in TABLES if t != name and len(report.table(t))]
    raise UsageError(f"--table {name}: this report has no {name} table (no row)",
                     hint=f"{how}; tables with rows: {', '.join(present) or 'none'}")
