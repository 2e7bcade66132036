"""`mismatch presets`, `mismatch metrics` and `mismatch fixes`: what the tool knows, without reading any dump."""

from __future__ import annotations

from typing import Annotated, get_type_hints

import typer

from mismatch_cli.cli.app import app, guard
from mismatch_cli.cli.emit import OutputOpt, Rendered, deliver, note, planned_outputs, to_file
from mismatch_cli.cli.options import CorrectionFlags, OutputFormat, QuietOpt
from mismatch_cli.errors import UsageError, suggest

SemanticsOpt = get_type_hints(CorrectionFlags, include_extras=True)["semantics"]


@app.command()
@guard
def presets(
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
    semantics: SemanticsOpt = None,
    output: OutputOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """List the rollout-correction presets of verl (or of an older family) with their parameters."""
    from mismatch_cli.correction import presets_table
    from mismatch_cli.render.presets import render_presets_json, render_presets_markdown, render_presets_table

    family = semantics.value if semantics is not None else "verl"
    outputs = planned_outputs([], output=output)
    fields, rows = presets_table(family)
    if not rows:
        note(quiet, f"{family} has no presets: set its fields (see `mismatch analyze --help`)")
    deliver(outputs, output, Rendered.of(output_format, lambda: render_presets_json(family, rows),
                                      lambda: render_presets_markdown(fields, rows),
                                      lambda console: render_presets_table(family, fields, rows, console)))
    note(quiet, *([f"wrote {output}"] if to_file(output) else []))


@app.command("metrics")
@guard
def metrics_command(
    query: Annotated[str | None, typer.Argument(metavar="KEY|TEXT",
                                                help="Only this key, or the keys containing this text.")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
    output: OutputOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """List every metric key: meaning, reduction, which way is better, healthy band and its source."""
    from mismatch_cli.metrics import closest, find
    from mismatch_cli.render.metrics import render_metrics_json, render_metrics_markdown, render_metrics_table

    outputs = planned_outputs([], output=output)
    chosen = find(query)
    if not chosen:
        close = closest(query or "")
        raise UsageError(f"no metric key matches '{query}'",
                         hint=suggest(close, "run `mismatch metrics` for all"))
    deliver(outputs, output, Rendered.of(output_format, lambda: render_metrics_json(chosen),
                                      lambda: render_metrics_markdown(chosen),
                                      lambda console: render_metrics_table(chosen, console)))
    note(quiet, *([f"wrote {output}"] if to_file(output) else []))


@app.command("fixes")
@guard
def fixes_command(
    semantics: SemanticsOpt = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table
    ),
    output: OutputOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """List the settings mismatch may tell you to change, in each trainer's own syntax, with their upstream sources."""
    from mismatch_cli.correction import FAMILIES
    from mismatch_cli.correction.fixes import fixes_for
    from mismatch_cli.render.fixes import render_fixes_json, render_fixes_markdown, render_fixes_table

    outputs = planned_outputs([], output=output)
    names = [semantics.value] if semantics is not None else list(FAMILIES)
    chosen = {name: fixes for name in names if (fixes := fixes_for(name)) is not None}
    if not chosen:
        raise UsageError(f"{names[0]} ships no vocabulary of fixes", hint="run `mismatch fixes` for every family")
    deliver(outputs, output, Rendered.of(output_format, lambda: render_fixes_json(chosen),
                                      lambda: render_fixes_markdown(chosen),
                                      lambda console: render_fixes_table(chosen, console)))
    note(quiet, *([f"wrote {output}"] if to_file(output) else []))
