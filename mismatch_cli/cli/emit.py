"""The one output helper every command uses: render once, then `-o FILE` (atomic, with the other files) or stdout."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from mismatch_cli.cli.options import OutputFormat
from mismatch_cli.system.output import Outputs

OutputOpt = Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="Write the output to FILE ('-' = stdout).")]


def to_file(output: str | None) -> bool:
    """Whether `-o` names a file (not absent, not '-')."""
    return output is not None and output != "-"


def planned_outputs(inputs: Iterable[Any], out_dir: Path | None = None, output: str | None = None) -> Outputs:
    """The command's outputs, refused now (before any work) when they cannot be written or would hit an input."""
    outputs = Outputs(list(inputs))
    if out_dir is not None:
        outputs.check_dir(out_dir, "--out-dir")
    if to_file(output):
        outputs.check(output, "-o")  # type: ignore[arg-type]
    return outputs


def console_text(draw: Callable[[Console], None]) -> str:
    """What `draw` prints on a 120-column terminal, as plain text (for `-o FILE`)."""
    with open(os.devnull, "w") as sink:
        console = Console(record=True, file=sink, width=120, color_system=None)
        draw(console)
    return console.export_text()


@dataclass
class Rendered:
    """One result in one format: its text (for `-o`) and, for a table, how to draw it on the live terminal."""

    text: str
    draw: Callable[[Console], None] | None = None

    @classmethod
    def of(cls, output_format: OutputFormat, as_json: Callable[[], str], as_markdown: Callable[[], str],
           draw: Callable[[Console], None]) -> Rendered:
        """Render in `output_format`: JSON or Markdown text, or a table drawn at 120 columns for `-o`."""
        if output_format is OutputFormat.json:
            return cls(as_json())
        if output_format is OutputFormat.markdown:
            return cls(as_markdown())
        return cls(console_text(draw), draw)

    def show(self) -> None:
        """Print on standard output: tables on the live terminal (its width, its colours), text as is."""
        if self.draw is not None:
            self.draw(Console(highlight=False))
        else:
            sys.stdout.write(self.text)


def deliver(outputs: Outputs, output: str | None, rendered: Rendered) -> None:
    """Write every planned file and `-o FILE` all or nothing, then show the result on stdout unless `-o` took it."""
    if to_file(output):
        outputs.add(output, rendered.text, "-o")  # type: ignore[arg-type]
    outputs.commit()
    if not to_file(output):
        rendered.show()


def note(quiet: bool, *lines: str, wrap: bool = False) -> None:
    """Print notes (what was written, warnings) on standard error unless `-q`; `wrap` fits them to the terminal."""
    if quiet:
        return
    from mismatch_cli.cli.app import stderr

    console = stderr()
    for line in lines:
        if wrap:
            line = "\n".join(_wrap(part, console.width) for part in line.splitlines() or [""])
        console.print(line, markup=False)


def _wrap(line: str, width: int) -> str:
    """The line wrapped at `width` between words; as it is when a word (a path) alone would not fit, since a
    path must stay whole to be copied, and wrapping around it only scatters the sentence."""
    if max((len(word) for word in line.split()), default=0) + 2 > width:
        return line
    return "\n".join(textwrap.wrap(line, width=width, break_on_hyphens=False, subsequent_indent="  ")) or line


def note_idle(flag: str, given: bool, needs: str, present: bool, quiet: bool) -> None:
    """A flag that only has no effect without another (a harmless no-op, e.g. `--no-plots` without `--out-dir`):
    accepted with a one-line note on stderr, so scripts that always pass it keep working."""
    if given and not present:
        note(quiet, f"note: {flag} has no effect without {needs}")
