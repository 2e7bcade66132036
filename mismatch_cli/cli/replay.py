"""`mismatch replay`: one dump, every trainer (under its defaults or the settings given), one table of concepts
with noise marks, led by the dump's own verdict."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

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

TABLE = "replay-{}"  # a --config file's table of one trainer's fields: [replay-skyrl], [replay-nemo-rl], ...


def config_settings(path: Path) -> dict[str, dict[str, Any]]:
    """Each trainer's `[replay-NAME]` table of a TOML file (its own field names, typed as its `[correction]`
    table's); the file's `[correction]` and `[check]` tables, if any, are read and left to `analyze` / `check`."""
    from mismatch_cli.correction import REPLAY_FAMILIES, correction_table, family_fields
    from mismatch_cli.errors import UsageError
    from mismatch_cli.gate.configfile import config_tables
    from mismatch_cli.replay import trainers
    from mismatch_cli.system.tomlconfig import load_config

    kinds = {name: dict(REPLAY_FAMILIES[name].kinds) if name in REPLAY_FAMILIES else
             {f: correction_table()[f] for f in family_fields()[name] if f in correction_table()}
             for name in trainers()}
    try:
        tables = load_config(path, {**config_tables(), **{TABLE.format(name): kinds[name] for name in kinds}})
    except UsageError as error:
        if re.search(r"unknown table \[(tool\.mismatch\.)?replay\]", error.message):  # [replay.skyrl] is nested
            error.hint = f"write one table per trainer as [replay-NAME] (a dash, not a dot), e.g. [replay-skyrl]; " \
                         f"{error.hint}"
        raise
    return {name: tables[TABLE.format(name)] for name in kinds if tables[TABLE.format(name)]}


def pair_settings(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`--set FAMILY.FIELD=VALUE` pairs by trainer, each typed and checked as `analyze --semantics FAMILY --set
    FIELD=VALUE` checks it (`settings_from_pairs`: the same errors, naming the field and the family)."""
    from mismatch_cli.correction import settings_from_pairs
    from mismatch_cli.errors import UsageError
    from mismatch_cli.replay import known_trainer

    grouped: dict[str, list[str]] = {}
    for pair in pairs:
        target, sep, value = pair.partition("=")
        family, dot, name = target.strip().partition(".")
        if not sep or not dot or not family or not name.strip():
            raise UsageError(f"--set expects FAMILY.FIELD=VALUE, got {pair!r}",
                             hint="e.g. --set skyrl.tis_ratio_type=token (the trainer, a dot, its own field name)")
        grouped.setdefault(known_trainer(family, f"--set {pair}"), []).append(f"{name.strip()}={value}")
    return {family: settings_from_pairs(items, family) for family, items in grouped.items()}


@app.command()
@guard
@bundled(InputFlags)
def replay(
    inputs: InputsArg,
    input_flags: InputFlags,
    trainers: Annotated[str | None, typer.Option(
        "--trainers", metavar="A,B,...", help="The columns, comma-separated (default: every trainer: verl, xtuner "
        "and each replayed trainer).")] = None,
    settings: Annotated[list[str] | None, typer.Option(
        "--set", metavar="FAMILY.FIELD=VALUE", help="Run a trainer with a setting by its own field name, e.g. "
        "skyrl.tis_ratio_type=token (repeatable; checked as analyze --semantics FAMILY --set FIELD=VALUE).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", metavar="FILE", help="TOML file with a [replay-NAME] table of settings per trainer "
        "(--set wins).")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table, json or markdown.")] = (
        OutputFormat.table),
    html: Annotated[Path | None, typer.Option("--html", metavar="PATH",
                                              help="Also write the result as one self-contained HTML page.")] = None,
    output: OutputOpt = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Per-token compute precision.")] = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """Replay every trainer's correction on the same dump: a row per concept, a column per trainer."""
    from mismatch_cli.render.replay import (
        render_replay_html,
        render_replay_json,
        render_replay_markdown,
        render_replay_table,
    )
    from mismatch_cli.replay import choose_trainers, configure
    from mismatch_cli.replay import replay as run_replay

    names = choose_trainers([n.strip() for n in trainers.split(",") if n.strip()] if trainers is not None else None)
    given = config_settings(config) if config is not None else {}
    for family, fields in pair_settings(settings or []).items():
        given[family] = {**given.get(family, {}), **fields}
    configure(names, given)  # every setting refused before any output is planned or input read
    outputs = planned_outputs([*inputs, *([config] if config is not None else [])], output=output)
    if html is not None:
        outputs.check(html, "--html")
    report = run_replay(inputs, names, read_options=read_options(input_flags), device=device, dtype=dtype.value,
                        settings=given)
    rendered = Rendered.of(output_format, lambda: render_replay_json(report), lambda: render_replay_markdown(report),
                           lambda console: render_replay_table(report, console))
    if html is not None:
        outputs.add(html, render_replay_html(report), "--html")
    outputs.protect(report.inputs)
    deliver(outputs, output, rendered)
    note(quiet, *([f"wrote {html}"] if html is not None else []), *([f"wrote {output}"] if to_file(output) else []))
