"""At 60, 80 and 120 columns no terminal table splits a number or a metric name across lines.

Every section of `analyze` (single-turn, multi-turn, with an IS/RS preset, per step), `compare` (with
bootstrap intervals and limits), `check` and `presets` is rendered at each width; each number-like cell
and each name the report holds must then be found whole in the output: a fixed cell as it is on one
line, a cell that may wrap (an interval, a rule) word by word. Only free text (meanings, summaries) may
wrap mid-cell; an input path is shortened in the middle instead (test_render_paths.py).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.correction import presets_table
from mismatch_cli.gate.comparison import compare_reports
from mismatch_cli.gate.thresholds import evaluate, parse_rule
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.compare import (
    check_cells,
    render_check_table,
    render_compare_table,
    round_cells,
    terminal_cells,
)
from mismatch_cli.render.sections import build_sections
from mismatch_cli.render.table import plan_blocks, presets_grid, render_presets_table, render_tables, section_grid
from mismatch_cli.report import Report

ROOT = Path(__file__).resolve().parents[1]
# Relative to ROOT, as a user types them: the tables then read the same whatever folder the checkout lives in
# (a deep input path at every width is tested in test_render_paths.py).
SINGLE = "sample_data/single_turn.parquet"
MULTI = "sample_data/multi_turn.parquet"
WIDTHS = (60, 80, 120)


def _analyze(tmp: Path, name: str, *args: str) -> Report:
    out = tmp / f"{name}.json"
    result = CliRunner(env={"MISMATCH_DEBUG": None}).invoke(
        app, ["analyze", *args, "--device", "cpu", "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return Report.load(out)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    tmp = tmp_path_factory.mktemp("widths")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        return {
            "single": _analyze(tmp, "single", SINGLE, "--bootstrap", "50"),
            "multi": _analyze(tmp, "multi", MULTI, "--bootstrap", "50"),
            "preset": _analyze(tmp, "preset", MULTI, "--preset", "decoupled_geo_rs_token_tis", "--bootstrap", "0"),
            "steps": _analyze(tmp, "steps", SINGLE, "--by", "step", "--rs", "token_k1,seq_max_k2",
                              "--rs-threshold", "0.5_2.0,0.01", "--bootstrap", "0"),
        }


def _render(draw, width: int) -> list[str]:  # noqa: ANN001
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    draw(console)
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    return lines


def _whole(needle: str, lines: list[str]) -> bool:
    pattern = re.compile(rf"(?:^|\s){re.escape(needle)}(?:\s|$)")
    return any(pattern.search(line) for line in lines)


def _assert_fixed(cell: str, lines: list[str], where: str) -> None:
    for part in cell.split("\n"):
        if part.strip():
            assert _whole(part.strip(), lines), f"{where}: {part!r} is not whole on one line"


def _assert_words(cell: str, lines: list[str], where: str) -> None:
    for word in cell.split():
        assert _whole(word, lines), f"{where}: {word!r} is split"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["single", "multi", "preset", "steps"])
def test_analyze_sections_keep_numbers_and_names_whole(reports: dict[str, Report], name: str, width: int) -> None:
    report = reports[name]
    lines = _render(lambda console: render_tables(report, console), width)
    sections = build_sections(report)
    titles = {s.title for s in sections}
    assert name != "steps" or "Per step" in titles
    assert name != "multi" or any(t.startswith("Rounds") for t in titles)
    assert name != "preset" or any(t.startswith("Rejection") for t in titles)
    for section in sections:
        grid = section_grid(section)
        for j, header in enumerate(section.columns):
            if grid.kinds[j] != "text":
                _assert_words(header, lines, f"{section.title} header")
        for row in section.rows:
            for j, cell in enumerate(row):
                if grid.kinds[j] == "fixed":
                    _assert_fixed(cell, lines, f"{section.title} / {section.columns[j]}")
    # Every value in the report's top-level metrics that a table shows is there whole.
    shown = {k.split("/", 1)[-1] for k in report.metrics}
    for key in shown & {cell for s in sections for row in s.rows for cell in row[:1]}:
        _assert_fixed(key, lines, "metric key")


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_keeps_numbers_and_names_whole(reports: dict[str, Report], width: int) -> None:
    rules = [parse_rule("rollout_corr/chi2_token:+10%"), parse_rule("abs(rollout_corr/kl)<=0.01")]
    comparison = compare_reports(reports["single"], reports["multi"], rules, "error", SINGLE, MULTI)
    assert any(row.base_interval for row in comparison.rows)  # intervals are drawn, and may wrap
    lines = _render(lambda console: render_compare_table(comparison, console), width)
    for row in comparison.rows:
        cells = terminal_cells(row)
        for j in (1, 4):
            _assert_fixed(cells[j], lines, row.metric)
        for j in (2, 3, 5):
            _assert_words(cells[j], lines, row.metric)
    for cells in round_cells(comparison):
        for cell in cells:
            _assert_fixed(cell, lines, "per round")
    for cells in check_cells(comparison):
        _assert_words(cells[1], lines, "limits")
        for cell in (cells[2], cells[3], cells[4]):
            _assert_fixed(cell, lines, "limits")


@pytest.mark.parametrize("width", WIDTHS)
def test_check_keeps_numbers_and_rules_whole(reports: dict[str, Report], width: int) -> None:
    rules = [parse_rule("abs(rollout_corr/kl)<=0.01"), parse_rule("rollout_corr/chi2_token<=1"),
             parse_rule("diag/ess_token>=0.3")]
    result = evaluate(rules, reports["multi"], None, "error")
    lines = _render(lambda console: render_check_table(result, console, f"mismatch check: {MULTI}"), width)
    for outcome in result.outcomes:
        _assert_words(outcome.rule.text, lines, "rule")
        _assert_fixed(format_value(outcome.value), lines, outcome.rule.text)
        _assert_fixed(outcome.status, lines, outcome.rule.text)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("family", ["verl", "verl-0.6.1"])
def test_presets_keep_names_and_values_whole(family: str, width: int) -> None:
    fields, rows = presets_table(family)
    columns = ["name", *fields, "summary"]
    lines = _render(lambda console: render_presets_table(family, columns, rows, console), width)
    grid = presets_grid(family, columns, rows)
    for row in grid.rows:
        for j, cell in enumerate(row):
            if grid.kinds[j] == "fixed":
                _assert_fixed(cell, lines, f"preset {row[0]}")
    for header in grid.columns:
        _assert_words(header, lines, "header")


def test_blocks_split_only_when_needed_and_repeat_the_label() -> None:
    fields, rows = presets_table("verl")
    grid = presets_grid("verl", ["name", *fields, "summary"], rows)
    assert len(plan_blocks(grid, 200)) == 1
    blocks = plan_blocks(grid, 60)
    assert len(blocks) > 1 and all(indices[0] == 0 for indices, _ in blocks)
    shown = sorted({j for indices, _ in blocks for j in indices})
    assert shown == list(range(len(grid.columns)))  # every column somewhere
    for indices, widths in blocks:
        fixed = [w for j, w in zip(indices, widths, strict=True) if grid.kinds[j] == "fixed"]
        assert sum(fixed) + 2 * (len(indices) - 1) <= 60 or len(indices) == 2


def test_notes_on_stderr_wrap_at_80_columns_without_breaking_a_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    source = Path(__file__).resolve().parents[1] / "sample_data" / "single_turn.parquet"
    result = CliRunner().invoke(app, ["analyze", str(source), "--out-dir", "out-folder-with-a-longish-name"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith(("wrote", "  "))]
    assert any(line.startswith("  ") for line in notes)  # the report.html line with its plots is wrapped
    assert all(len(line) <= 80 for line in notes), notes
    words = " ".join(notes).split()
    assert "out-folder-with-a-longish-name/report.html" in words and "position.png)" in words


def test_a_long_group_label_gives_way_and_never_squeezes_a_number(tmp_path: Path, monkeypatch) -> None:
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    old = [(-rng.exponential(0.5, 50)).astype(np.float32) for _ in range(4)]
    rollout = [np.minimum(o + rng.normal(0, 0.01, 50), 0).astype(np.float32) for o in old]
    pq.write_table(pa.table({"old_log_probs": pa.array(old, pa.list_(pa.float32())),
                             "rollout_log_probs": pa.array(rollout, pa.list_(pa.float32())),
                             "response_mask": pa.array([np.ones(50, np.int8)] * 4, pa.list_(pa.int8())),
                             "env": ["x" * 300, "a", "x" * 300, "a"]}), tmp_path / "d.parquet")
    monkeypatch.setenv("COLUMNS", "80")
    screen = CliRunner().invoke(app, ["analyze", str(tmp_path / "d.parquet"), "--by", "env", "--full", "-q",
                                      "--bootstrap", "0"])
    report = CliRunner().invoke(app, ["analyze", str(tmp_path / "d.parquet"), "--by", "env", "--format", "json",
                                      "-q", "--bootstrap", "0"])
    assert screen.exit_code == 0 and report.exit_code == 0, screen.output
    lines = screen.stdout.splitlines()
    table = lines[lines.index("Per env"):][:6]
    assert all(len(line) <= 80 for line in table), table
    long_row = next(line for line in table if line.startswith("xxx"))
    kl = next(g for g in json.loads(report.stdout)["groups"]["env"] if g["group"] != "a")["metrics"]["rollout_corr/kl"]
    assert format_value(kl) in long_row.split() and "…" in long_row


def test_a_group_label_with_a_line_break_stays_one_row(tmp_path: Path, monkeypatch) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = [np.linspace(-2, -0.1, 20).astype(np.float32)] * 2
    pq.write_table(pa.table({"old_log_probs": pa.array(old, pa.list_(pa.float32())),
                             "rollout_log_probs": pa.array([o - 0.01 for o in old], pa.list_(pa.float32())),
                             "response_mask": pa.array([np.ones(20, np.int8)] * 2, pa.list_(pa.int8())),
                             "env": ["line\nbreak | pipe", "a"]}), tmp_path / "d.parquet")
    monkeypatch.setenv("COLUMNS", "80")
    args = ["analyze", str(tmp_path / "d.parquet"), "--by", "env", "-q", "--bootstrap", "0"]
    screen = CliRunner().invoke(app, [*args, "--full"])
    markdown = CliRunner().invoke(app, [*args, "--format", "markdown"])
    assert screen.exit_code == 0 and markdown.exit_code == 0, screen.output
    assert any(line.startswith("line\\nbreak | pipe ") for line in screen.stdout.splitlines())
    rows = [line for line in markdown.stdout.splitlines() if line.startswith("| line")]
    assert rows == [rows[0]] and rows[0].startswith("| line\\nbreak \\| pipe |")
