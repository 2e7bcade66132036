"""`mismatch compare` and `mismatch check`: two runs side by side, and the CI gate."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from mismatch_cli.cli.app import app, guard, stderr
from mismatch_cli.cli.emit import OutputOpt, Rendered, deliver, note, note_idle, planned_outputs
from mismatch_cli.cli.options import (
    ByOpt,
    ComputeFlags,
    CorrectionFlags,
    FailOnOpt,
    InputFlags,
    MissingOpt,
    OutputFormat,
    QuietOpt,
    bundled,
    parse_by,
    read_options,
)
from mismatch_cli.errors import MismatchError, UsageError

LimitsConfigOpt = Annotated[
    Path | None, typer.Option("--config", metavar="FILE",
                              help="TOML with [check] (fail_on, baseline, missing) and [correction].")
]


class GithubMode(str, enum.Enum):
    """GitHub Actions annotations and step summary: auto = when GITHUB_ACTIONS=true."""

    auto = "auto"
    on = "on"
    off = "off"


def _analyze_options(input_flags: InputFlags, compute: ComputeFlags, by: list[str]) -> dict[str, Any]:
    from mismatch_cli.api import check_bootstrap
    from mismatch_cli.processes import parse_jobs

    return {"read_options": read_options(input_flags), "device": compute.device, "dtype": compute.dtype.value,
            "bootstrap": check_bootstrap(compute.bootstrap), "group_by": parse_by(by), "jobs": parse_jobs(compute.jobs)}


@app.command()
@guard
@bundled(CorrectionFlags, InputFlags, ComputeFlags)
def compare(
    base: Annotated[str, typer.Argument(metavar="BASE",
                                        help="The reference: a dump, a folder of dumps, or a report.json.")],
    candidate: Annotated[str, typer.Argument(metavar="CANDIDATE",
                                             help="Judged against BASE: a dump, a folder of dumps, or a report.json.")],
    more: Annotated[list[str] | None, typer.Argument(
        metavar="MORE",
        help="More runs: with three or more, every run side by side (no reference), best and worst per metric.",
        show_default=False)] = None,
    *,
    correction_flags: CorrectionFlags,
    input_flags: InputFlags,
    compute: ComputeFlags,
    config: LimitsConfigOpt = None,
    fail_on: FailOnOpt = [],  # noqa: B006 - typer needs a literal default
    missing: MissingOpt = None,
    min_difference: Annotated[list[str], typer.Option(
        "--min-difference", metavar="METRIC=AMOUNT", help="A change smaller than AMOUNT (in the metric's unit, or "
        "N% of the base; none = any change counts) is not called worse or better. Repeatable; defaults from "
        "`mismatch metrics`.")] = [],  # noqa: B006
    by: ByOpt = [],  # noqa: B006
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", metavar="DIR",
                                  help="Write compare.json, compare.md, each side's report, "
                     "overlaid plots and compare.html.")
    ] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="What is printed on stdout / -o.")] = (
        OutputFormat.table
    ),
    output: OutputOpt = None,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Skip the plots and compare.html in --out-dir.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Compare two runs side by side (BASE is the reference), or three or more (best and worst per metric);
    exit 1 only when a given limit is breached."""
    from mismatch_cli.cli.flags import correction_from_flags
    from mismatch_cli.gate.api import compare as run_compare
    from mismatch_cli.gate.comparison import parse_min_differences
    from mismatch_cli.render.compare import render_compare_json, render_compare_markdown, render_compare_table
    from mismatch_cli.render.files import compare_files

    note_idle("--no-plots", no_plots, "--out-dir DIR", out_dir is not None, quiet)
    if more and fail_on:
        raise UsageError(f"--fail-on needs exactly two runs (a baseline and a candidate), got {2 + len(more)}",
                         hint="compare two runs with limits, or hold each run to them with `mismatch check RUN`")
    correction = correction_from_flags(config, correction_flags)
    practical = parse_min_differences(min_difference)
    flags_given = _correction_given(correction_flags, config)
    if more:
        _compare_runs([base, candidate, *more], correction if flags_given else None, config, practical,
                      _analyze_options(input_flags, compute, by), out_dir, output_format, output, no_plots, quiet)
        return
    outputs = planned_outputs([base, candidate, config], out_dir, output)
    result = run_compare(base, candidate, fail_on, missing.value if missing else None,
                         correction=correction if flags_given else None, config=config, min_difference=practical,
                         **_analyze_options(input_flags, compute, by))
    comparison = result.comparison
    rendered = Rendered.of(output_format, lambda: render_compare_json(comparison),
                        lambda: render_compare_markdown(comparison),
                        lambda console: render_compare_table(comparison, console))
    for side in (result.base, result.candidate):
        outputs.protect(entry.path for entry in side.report.inputs)
    if out_dir is not None:
        for name, data in compare_files(result.comparison, result.base.report, result.candidate.report,
                                        reports={"base": not result.base.from_report,
                                                 "candidate": not result.candidate.from_report},
                                        plots=not no_plots).items():
            outputs.add(out_dir / name, data, "--out-dir")
    deliver(outputs, output, rendered)
    if out_dir is not None:
        note(quiet, f"wrote {out_dir}/compare.json, compare.md" + ("" if no_plots else ", compare.html and plots"),
             wrap=True)
    note(quiet, comparison.verdict())
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _correction_given(correction_flags: CorrectionFlags, config: Path | None) -> bool:
    """Whether a correction was asked for (flags or a [correction] table): a report input cannot honour one."""
    from mismatch_cli.gate.configfile import load_table

    return correction_flags.given() or bool(config is not None and load_table(config, "correction"))


def _compare_runs(runs: list[str], correction: Any, config: Path | None, practical: dict[str, str],
                  analyze_options: dict[str, Any], out_dir: Path | None, output_format: OutputFormat,
                  output: str | None, no_plots: bool, quiet: bool) -> None:
    """`mismatch compare A B C ...`: every run side by side, then the verdict on stderr (always exit 0)."""
    from mismatch_cli.gate.api import compare_many
    from mismatch_cli.gate.nway import refuse_repeated_inputs
    from mismatch_cli.render.compare_nway import render_runs_json, render_runs_markdown, render_runs_table
    from mismatch_cli.render.files import runs_files

    refuse_repeated_inputs(runs)  # before any output is planned or any run is read
    outputs = planned_outputs([*runs, config], out_dir, output)
    result = compare_many(runs, correction=correction, config=config, min_difference=practical, **analyze_options)
    comparison = result.comparison
    rendered = Rendered.of(output_format, lambda: render_runs_json(comparison),
                           lambda: render_runs_markdown(comparison),
                           lambda console: render_runs_table(comparison, console))
    for side in result.runs:
        outputs.protect(entry.path for entry in side.report.inputs)
    if out_dir is not None:
        analyzed = {side.label: side.report for side in result.runs if not side.from_report}
        for name, data in runs_files(comparison, analyzed, plots=not no_plots).items():
            outputs.add(out_dir / name, data, "--out-dir")
    deliver(outputs, output, rendered)
    if out_dir is not None:
        note(quiet, f"wrote {out_dir}/compare.json, compare.md" + ("" if no_plots else ", compare.html and a plot"),
             wrap=True)
    note(quiet, comparison.verdict())


@app.command()
@guard
@bundled(CorrectionFlags, InputFlags, ComputeFlags)
def check(
    inputs: Annotated[list[str], typer.Argument(metavar="INPUT",
                                                help="Dumps (files, folders, globs) or one report.json.")],
    correction_flags: CorrectionFlags,
    input_flags: InputFlags,
    compute: ComputeFlags,
    baseline: Annotated[
        str | None, typer.Option("--baseline", metavar="REPORT",
                                 help="Report (report.json) that relative rules compare against.")
    ] = None,
    config: LimitsConfigOpt = None,
    fail_on: FailOnOpt = [],  # noqa: B006 - typer needs a literal default
    missing: MissingOpt = None,
    by: ByOpt = [],  # noqa: B006
    junit_xml: Annotated[Path | None, typer.Option("--junit-xml", metavar="FILE",
                                                   help="Write JUnit XML (one case per rule).")] = None,
    github: Annotated[
        GithubMode, typer.Option("--github", help="Annotations and step summary: auto (GITHUB_ACTIONS=true), on, off.")
    ] = GithubMode.auto,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="What is printed on stdout / -o.")] = (
        OutputFormat.table
    ),
    output: OutputOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out-dir", metavar="DIR",
                                                 help="Write DIR/report.json of the input.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """The CI gate: hold a dump (or report) to limits; exit 1 on a breach, 2 on a bad rule, 3 on bad input."""
    import json

    from mismatch_cli.cli.flags import correction_from_flags
    from mismatch_cli.gate.api import check as run_check
    from mismatch_cli.gate.api import could_not_run
    from mismatch_cli.gate.thresholds import CheckResult
    from mismatch_cli.render.compare import check_title, render_check_markdown, render_check_table
    from mismatch_cli.render.github import annotations, step_summary
    from mismatch_cli.render.junit import render_junit
    from mismatch_cli.system.output import append_text

    label = " ".join(inputs)
    github_on = github is GithubMode.on or (github is GithubMode.auto and os.environ.get("GITHUB_ACTIONS") == "true")
    outputs = planned_outputs([*inputs, baseline, config])
    if junit_xml is not None:
        outputs.check(junit_xml, "--junit-xml")  # before the try: a broken --junit-xml cannot report itself

    def publish(result: CheckResult, baseline_label: str | None) -> None:
        # JUnit and annotations first, so CI sees them whatever the exit code.
        if junit_xml is not None:
            outputs.add(junit_xml, render_junit(result, label), "--junit-xml")
        if github_on:
            err = stderr()
            for line in annotations(result):
                err.print(line, markup=False, highlight=False, soft_wrap=True)
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                problem = append_text(summary, step_summary(result, label, baseline_label) + "\n")
                if problem:
                    err.print(f"warning: GITHUB_STEP_SUMMARY: {problem}", markup=False)

    try:
        correction = correction_from_flags(config, correction_flags)
        if out_dir is not None:
            outputs.check_dir(out_dir, "--out-dir")
        if output is not None and output != "-":
            outputs.check(output, "-o")
        flags_given = _correction_given(correction_flags, config)
        run = run_check(inputs, fail_on, baseline, missing.value if missing else None,
                        correction=correction if flags_given else None, config=config,
                        **_analyze_options(input_flags, compute, by))
    except MismatchError as exc:
        # The gate could not run: still leave a JUnit case / annotation that says why.
        publish(could_not_run(exc), baseline)
        outputs.commit()
        raise
    result = run.result
    outputs.protect(entry.path for report in (run.candidate, run.baseline) if report for entry in report.inputs)
    if out_dir is not None:
        outputs.add(out_dir / "report.json", run.candidate.to_json(), "--out-dir")
    publish(result, run.baseline_label)
    rendered = Rendered.of(output_format, lambda: json.dumps(result.to_dict(), indent=2) + "\n",
                        lambda: render_check_markdown(result, check_title(inputs, run.baseline_label)),
                        lambda console: render_check_table(result, console,
                                                           check_title(inputs, run.baseline_label, console.width)))
    deliver(outputs, output, rendered)
    note(quiet, *(f"note: {line}" for line in run.notes), result.verdict())
    if result.exit_code:
        raise typer.Exit(result.exit_code)
