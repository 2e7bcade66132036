"""`mismatch synth` and `mismatch convert`: make a synthetic dump, or rewrite dumps in the wide parquet layout."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from mismatch_cli.cli.app import app, guard
from mismatch_cli.cli.emit import note
from mismatch_cli.cli.options import Dtype, InputFlags, InputsArg, QuietOpt, bundled, read_options
from mismatch_cli.errors import UsageError


class SynthFormat(str, enum.Enum):
    """File format written by `synth`."""

    parquet = "parquet"
    safetensors = "safetensors"


class SynthLayout(str, enum.Enum):
    """safetensors layout written by `synth`."""

    padded = "padded"
    packed = "packed"


def _whole(text: str, flag: str) -> int:
    from mismatch_cli.system.numbers import parse_integer

    return parse_integer(text, flag, -(2**63), 2**63 - 1, hint=f"give {flag} a whole number, e.g. {flag} 4")


def _refuse_idle_flags(file_format: SynthFormat, layout: SynthLayout | None, steps: str | None) -> None:
    """A flag the chosen format ignores is refused rather than silently dropped (`--layout` on parquet)."""
    if file_format is SynthFormat.parquet and layout is not None:
        raise UsageError(f"--layout {layout.value} does nothing for a parquet dump: only safetensors has layouts",
                         hint="drop --layout, or write a .safetensors file (or --format safetensors)")
    if file_format is SynthFormat.safetensors and steps is not None:
        raise UsageError(f"--steps {steps} does nothing for a safetensors dump: it holds one step",
                         hint="drop --steps, or write a .parquet file (a step column), or one safetensors file "
                         "per step")


@app.command()
@guard
def synth(
    output: Annotated[Path, typer.Argument(metavar="OUT", help="File to write (.parquet or .safetensors).")],
    tokens: Annotated[str, typer.Option("--tokens", metavar="N", help="Approximate number of response tokens.")] = (
        "100000"
    ),
    turns: Annotated[str, typer.Option("--turns", metavar="N", help="Rounds per trajectory (multi-turn when > 1).")] = (
        "1"
    ),
    seed: Annotated[str, typer.Option("--seed", metavar="N", help="Random seed (>= 0).")] = "0",
    file_format: Annotated[SynthFormat | None, typer.Option("--format", help="Default: from the suffix.")] = None,
    layout: Annotated[SynthLayout | None, typer.Option("--layout", help="safetensors layout (default padded).")] = (
        None
    ),
    empty_rows: Annotated[
        str, typer.Option("--empty-rows", metavar="F", help="Fraction of all-zero masks, in [0, 1).")
    ] = "0.0",
    steps: Annotated[str | None, typer.Option("--steps", metavar="N", help="Spread rows over this many steps "
                                              "(parquet only; default 1).")] = None,
    noise: Annotated[str, typer.Option("--noise", metavar="X", help="Scale of the trainer/inference mismatch "
                                       "(>= 0).")] = "1.0",
    quiet: QuietOpt = False,
) -> None:
    """Write a realistic synthetic dump (for trying the tool and for benchmarks)."""
    from mismatch_cli.synth import SynthSpec, write_synthetic_dump
    from mismatch_cli.system.numbers import parse_number

    if file_format is None:
        suffix = output.suffix.lower()
        if suffix not in (".parquet", ".safetensors"):
            raise UsageError(
                f"cannot tell the format of '{output}'", hint="use a .parquet/.safetensors name or --format"
            )
        file_format = SynthFormat(suffix[1:])
    _refuse_idle_flags(file_format, layout, steps)
    # Ranges are checked by SynthSpec; here only the strict reading of each number.
    spec = SynthSpec(tokens=_whole(tokens, "--tokens"), turns=_whole(turns, "--turns"), seed=_whole(seed, "--seed"),
                     format=file_format.value, layout=(layout or SynthLayout.padded).value,
                     empty_rows=parse_number(empty_rows, "--empty-rows"),
                     steps=_whole("1" if steps is None else steps, "--steps"), noise=parse_number(noise, "--noise"))
    summary = write_synthetic_dump(output, spec)
    note(quiet, f"wrote {summary.path}: {summary.sequences} sequences, {summary.tokens} response tokens",
         wrap=True)


@app.command()
@guard
@bundled(InputFlags)
def convert(
    inputs: InputsArg,
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE",
                                         help="The parquet file to write (atomically).")],
    input_flags: InputFlags,
    keep: Annotated[
        list[str],
        typer.Option("--keep", metavar="COLUMN",
                     help="Also copy this per-row column (e.g. data_source). Repeatable; prime-rl's "
                     "env_name is always kept."),
    ] = [],  # noqa: B006
    dtype: Annotated[Dtype, typer.Option("--dtype", help="Storage precision of the log-probs.")] = Dtype.float32,
    quiet: QuietOpt = False,
) -> None:
    """Convert dumps (slime, NeMo-RL, prime-rl, safetensors, parquet) into mismatch's wide parquet layout."""
    from mismatch_cli.convert import convert as run_convert

    if str(output) == "-":
        raise UsageError("convert writes a parquet file, not stdout", hint="give -o FILE.parquet")
    options = read_options(input_flags, keep=tuple(dict.fromkeys(k.strip() for k in keep if k.strip())))
    summary = run_convert(inputs, output, options, dtype=dtype.value)
    note(quiet, *(f"warning: {warning}" for warning in summary.warnings),
         f"wrote {summary.path}: {summary.sequences} sequences, {summary.valid_tokens} valid tokens from "
         f"{len(summary.inputs)} file(s); columns {', '.join(summary.columns)}")
