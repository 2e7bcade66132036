"""docs/commands.md documents every command and every flag the CLI registers, each in its command's section,
and the full exit-code table; the README stays a short page that points there."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from mismatch_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMMANDS_PAGE = ROOT / "docs" / "commands.md"
README = ROOT / "README.md"


def _option_names(params) -> list[str]:
    """Every spelling of every option (`-o`, `--output`, `--no-mask`, `--no-is-batch-normalize`), arguments left out."""
    names = []
    for param in params:
        names.extend(o for o in [*param.opts, *getattr(param, "secondary_opts", [])] if o.startswith("-"))
    return names


def _registered() -> dict[str, list[str]]:
    """Command name -> its option names, read from the app itself."""
    group = typer.main.get_command(app)
    return {name: _option_names(command.params) for name, command in group.commands.items()}


def _sections(text: str) -> dict[str, str]:
    """Command name -> the text of its `## `mismatch NAME ...`` section, up to the next `## ` heading."""
    sections = {}
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        match = re.match(r"`mismatch ([a-z][a-z-]*)", chunk)
        if match:
            sections[match[1]] = chunk
    return sections


def _mentions(text: str, name: str) -> bool:
    # Whole names only: `--is` must appear by itself, not just inside `--is-threshold`.
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_every_command_has_a_section():
    sections = _sections(COMMANDS_PAGE.read_text())
    missing = [name for name in _registered() if name not in sections]
    assert not missing, f"docs/commands.md has no `## \\`mismatch NAME\\`` section for {missing}"


def test_every_flag_is_documented_in_its_commands_section():
    sections = _sections(COMMANDS_PAGE.read_text())
    missing = {
        name: [flag for flag in flags if not _mentions(sections.get(name, ""), flag)]
        for name, flags in _registered().items()
    }
    missing = {name: flags for name, flags in missing.items() if flags}
    assert not missing, f"docs/commands.md does not document these flags in their command's section: {missing}"


def test_top_level_options_are_documented():
    text = COMMANDS_PAGE.read_text()
    names = _option_names(typer.main.get_command(app).params)
    assert "--version" in names
    assert [name for name in [*names, "--help"] if not _mentions(text, name)] == []


def test_registered_names_are_read_from_the_app():
    """Guards the tests above against an empty walk that would always pass."""
    registered = _registered()
    assert {"analyze", "compare", "check", "presets", "metrics", "synth", "convert"} <= set(registered)
    assert {"--is-threshold", "--out-dir", "--no-is-batch-normalize", "-o", "-q"} <= set(registered["analyze"])
    assert {"--fail-on", "--junit-xml", "--github", "--baseline"} <= set(registered["check"])
    assert {"--tokens", "--layout"} <= set(registered["synth"])


def test_a_missing_flag_is_caught():
    page = COMMANDS_PAGE.read_text()
    sections = _sections(page.replace("`--junit-xml FILE`", "`FILE`"))
    assert not _mentions(sections["check"], "--junit-xml")
    assert _mentions(_sections(page)["check"], "--junit-xml")


def test_full_exit_code_table_and_error_format():
    text = COMMANDS_PAGE.read_text()
    table = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    for code in range(5):
        assert re.search(rf"^\| {code} \| \S", table, flags=re.M), f"exit code {code} has no row"
    assert "MISMATCH_DEBUG=1" in table
    assert "error: <what" in text and "; fix: <what to do>" in text
    assert "\n## Quiet output\n" in text


def test_readme_points_to_the_commands_page():
    readme = README.read_text()
    assert "](docs/commands.md#exit-codes)" in readme
    for command in ("analyze", "compare", "check"):
        assert f"`mismatch {command}`" in readme
    # The newcomer's page stays short; the reference lives in docs/.
    assert len(readme.splitlines()) <= 250
    assert 'pip install -e ".[dev,ray]" && python -m pytest -n 2 tests' in readme
    assert "-n 2 tests" in (README.parent / ".ci" / "run").read_text()  # the README runs what CI runs


def test_the_performance_page_stays_short():
    # What a user needs (figures, knobs, how to measure); the measurement history lives in bench/HISTORY.md.
    page = README.parent / "docs" / "performance.md"
    assert len(page.read_text().splitlines()) <= 200
    assert "bench/bench_machine.py" in page.read_text()
