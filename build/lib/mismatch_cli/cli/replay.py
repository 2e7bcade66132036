"""`mismatch replay`: one dump, every trainer under its defaults, one table of concepts with noise marks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch_cli.cli.app import app, guard
from mismatch_cli.cli.emit import OutputOpt, Rendered, deliver, note, planned_outputs, to_file
from mismatch_cli.cli.options import (
    DeviceOpt,
    Dtype,
    InputFlags,
    InputsArg,
    OutputFormat,
    QuietOpt,
    bundled,
    read_options,
)


@app.command()
@guard
@bundled(InputFlags)
def replay(
    inputs: InputsArg,
    input_flags: InputFlags,
    trainers: Annotated[str | None, typer.Option(
        "--trainers", metavar="A,B,...", help="The columns, comma-separated (default: every trainer: verl, xtuner "
        "and each replayed trainer).")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table),
    html: Annotated[Path | None, typer.Option("--html", metavar="PATH",
                                              help="Also write the result as one self-contained HTML page.")] = None,
    output: OutputOpt = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Per-token compute precision.")] = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """Replay every trainer's default correction on the same dump: a row per concept, a column per trainer."""
    from mismatch_cli.render.replay import (
        render_replay_html,
        render_replay_json,
        render_replay_markdown,
        render_replay_table,
    )
    from mismatch_cli.replay import choose_trainers
    from mismatch_cli.replay import replay as run_replay

    names = choose_trainers([n.strip() for n in trainers.split(",") if n.strip()] if trainers is not None else None)
    outputs = planned_outputs(inputs, output=output)
    if html is not None:
        outputs.check(html, "--html")
    report = run_replay(inputs, names, read_options=read_options(input_flags), device=device, dtype=dtype.value)
    rendered = Rendered.of(output_format, lambda: render_replay_json(report), lambda: render_replay_markdown(report),
                           lambda console: render_replay_table(report, console))
    if html is not None:
        outputs.add(html, render_replay_html(report), "--html")
    outputs.protect(report.inputs)
    deliver(outputs, output, rendered)
    note(quiet, *([f"wrote {html}"] if html is not None else []), *([f"wrote {output}"] if to_file(output) else []))
