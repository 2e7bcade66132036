"""Input paths on the terminal: relative under the working folder, else shortened in the middle to the width,
the file name whole (only a table column too narrow for it cuts its middle, never a number beside it); JSON keeps
the path as given. A deliberately deep path at 60, 80 and 120 columns."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.render.paths import ELLIPSIS, display_path, fit_path, paths_in_text
from mismatch_cli.render.table import render_tables
from mismatch_cli.report import Report

ROOT = Path(__file__).resolve().parents[1]
DEEP = "/mnt/data/team/experiments/2026-11/run-abc123/dumps/step_00012.parquet"
WIDTHS = (60, 80, 120)


def test_a_path_that_fits_is_shown_as_given(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert display_path(DEEP) == DEEP
    assert display_path(DEEP, len(DEEP)) == DEEP
    assert display_path("../other/run.parquet", 5) == f"{ELLIPSIS}/run.parquet"  # outside: as given, then shortened
    assert display_path("s3://bucket/dumps/step_1.parquet") == "s3://bucket/dumps/step_1.parquet"


def test_a_path_under_the_working_folder_is_relative(monkeypatch, tmp_path) -> None:
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    assert display_path(str(tmp_path / "runs" / "a.parquet")) == "runs/a.parquet"
    assert display_path("./runs/a.parquet") == "runs/a.parquet"
    assert display_path(str(tmp_path / "runs") + "/") == "runs/"
    monkeypatch.chdir(tmp_path / "runs")
    assert display_path(str(tmp_path / "b.parquet")) == str(tmp_path / "b.parquet")  # a sibling: not `../`


def test_the_middle_gives_way_and_the_file_name_stays_whole(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert display_path(DEEP, 36) == f"/mnt/data/{ELLIPSIS}/dumps/step_00012.parquet"
    for width in range(0, len(DEEP)):
        shown = display_path(DEEP, width)
        assert shown.endswith("/step_00012.parquet") and ELLIPSIS in shown
        assert len(shown) <= max(width, len(f"{ELLIPSIS}/step_00012.parquet")), (width, shown)
        assert display_path(shown, width) == shown  # shown once or twice, the same
    uri = "s3://bucket/team/experiments/run-abc123/dumps/step_00012.parquet"
    assert display_path(uri, 40) == f"s3://bucket/{ELLIPSIS}/dumps/step_00012.parquet"


def test_paths_in_text_shortens_only_the_given_paths(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    text = f"the worst is {DEEP}:46:510 (round 0); other.parquet untouched"
    assert paths_in_text(text, [DEEP], 40) == (f"the worst is /mnt/data/{ELLIPSIS}/dumps/step_00012.parquet:46:510 "
                                                "(round 0); other.parquet untouched")


@pytest.fixture(scope="module")
def deep_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The multi-turn sample under a path deeper than any terminal is wide, outside the working folder."""
    folder = tmp_path_factory.mktemp("deep")
    for part in ("mnt", "data", "team", "experiments", "2026-11", "run-abc123-" + "x" * 40, "dumps"):
        folder = folder / part
    folder.mkdir(parents=True)
    path = folder / "step_00012.parquet"
    shutil.copyfile(ROOT / "sample_data" / "multi_turn.parquet", path)
    assert len(str(path)) > 120
    return path


def _run(argv: list[str], width: int) -> tuple[int, str]:
    env = {"COLUMNS": str(width), "NO_COLOR": "1", "TERM": "dumb", "MISMATCH_DEBUG": None, "FORCE_COLOR": None}
    result = CliRunner(env=env).invoke(app, [*argv, "--device", "cpu", "--bootstrap", "0"])
    return result.exit_code, result.stdout


def _assert_fits(output: str, width: int, name: str = "step_00012.parquet") -> list[str]:
    lines = output.splitlines()
    assert lines and max(map(len, lines)) <= width, "\n".join(line for line in lines if len(line) > width)
    assert any(name in line for line in lines)  # the file name is never cut
    return lines


@pytest.mark.parametrize("width", WIDTHS)
def test_a_deep_path_fits_every_screen(deep_dump: Path, width: int, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # the dump is not under the working folder: shortened, not relative
    code, summary = _run(["analyze", str(deep_dump)], width)
    assert code == 0
    first = _assert_fits(summary, width)[0]
    assert first.startswith("mismatch: /") and ELLIPSIS in first and "/dumps/step_00012.parquet:" in first
    assert "step_00012.parquet:46:510" in summary  # the worst token's file:row:position, still whole
    code, full = _run(["analyze", str(deep_dump), "--full"], width)
    assert code == 0
    lines = _assert_fits(full, width)
    inputs = lines[lines.index("Inputs"):]
    assert not any("(continued)" in line for line in inputs)  # the Inputs table is not split into blocks
    assert any(line.startswith("/") and "step_00012.parquet" in line for line in inputs)
    code, compared = _run(["compare", str(deep_dump), str(deep_dump)], width)
    assert code == 0 and compared.startswith("mismatch compare: base /")
    _assert_fits(compared, width)
    code, checked = _run(["check", str(deep_dump), "--fail-on", "rollout_corr/kl<=1"], width)
    assert code == 0 and checked.startswith("mismatch check: /")
    _assert_fits(checked, width)


def test_a_deep_path_under_the_working_folder_is_relative(deep_dump: Path, monkeypatch) -> None:
    monkeypatch.chdir(deep_dump.parent.parent)
    code, summary = _run(["analyze", str(deep_dump)], 80)
    assert code == 0 and summary.startswith("mismatch: dumps/step_00012.parquet: ")
    code, text = _run(["analyze", str(deep_dump), "--format", "json"], 80)
    assert code == 0 and json.loads(text)["inputs"][0]["path"] == str(deep_dump)  # JSON: whole, as given
    code, markdown = _run(["analyze", str(deep_dump), "--format", "markdown"], 80)
    assert code == 0 and "| dumps/step_00012.parquet |" in markdown


LONG_NAME = "rollout_dump_global_step_000123_rank_00_of_08_with_a_long_descriptive_name.parquet"


@pytest.fixture(scope="module")
def long_named_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The single-turn sample with NaN and positive log-probs injected (so the Data quality table shows), under a
    deep folder and a file name longer than a 60-column table leaves for it; analysed, then read back as JSON."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("long")
    for part in ("mnt", "data", "team", "experiments", "run-abc123-" + "x" * 40, "dumps"):
        folder = folder / part
    folder.mkdir(parents=True)
    path = folder / LONG_NAME
    assert len(str(path)) > 120
    table = pq.read_table(ROOT / "sample_data" / "single_turn.parquet")
    rollout = [np.asarray(row, np.float32) for row in table["rollout_log_probs"].to_pylist()]
    rollout[1][0], rollout[6][2], rollout[9][1] = np.nan, np.inf, 0.5
    column = pa.array([row.tolist() for row in rollout], pa.list_(pa.float32()))
    pq.write_table(table.set_column(table.schema.get_field_index("rollout_log_probs"), "rollout_log_probs", column),
                   path)
    out = folder / "report.json"
    result = CliRunner(env={"MISMATCH_DEBUG": None}).invoke(
        app, ["analyze", str(path), "--device", "cpu", "--bootstrap", "0", "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return Report.load(out)


def _number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def _table(lines: list[str], title: str) -> list[str]:
    """The lines of table `title` and of its `(continued)` blocks, each up to the blank line after it."""
    out, inside = [], False
    for line in lines:
        if line in (title, f"{title} (continued)"):
            inside = True
        elif not line.strip():
            inside = False
        elif inside:
            out.append(line)
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_no_table_cuts_a_number_beside_a_long_path(long_named_report: Report, width: int) -> None:
    report = long_named_report
    buffer = io.StringIO()
    render_tables(report, Console(file=buffer, width=width, color_system=None, highlight=False))
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    item = report.inputs[0]
    # Inputs: the path cell is one word; after it, format, sequences and valid tokens as the JSON records them.
    inputs = [line.split() for line in _table(lines, "Inputs") if line.split()[0].endswith(".parquet")]
    assert inputs and all(len(cells) == 4 for cells in inputs), inputs
    assert [cells[1] for cells in inputs] == [item.format] * len(inputs)
    assert [(int(_number(c[2])), int(_number(c[3]))) for c in inputs] == [(item.sequences, item.tokens)]
    # Data quality: the four counts of the file, whole.
    counts = report.data_quality["files"][item.path]
    assert counts["nonfinite_tokens"] >= 1 and counts["positive_logprob_tokens"] >= 1
    quality = [line.split() for line in _table(lines, "Data quality") if line.split()[0].endswith(".parquet")]
    assert [[int(_number(c)) for c in cells[1:]] for cells in quality] == [[
        counts[n] for n in ("nonfinite_tokens", "sentinel_tokens", "positive_logprob_tokens", "one_side_zero_tokens")]]
    # Worst sequences: every number of every shown rank, gathered over the blocks, equals the JSON's value.
    for entry in (e for e in report.worst_sequences if e["rank"] <= 5):
        label = {"abs_mean_log_ratio": "|mean d|", "max_abs_log_ratio": "max |d|",
                 "max_log_ratio": "max d"}[entry["criterion"]]
        name = f"{label} #{entry['rank']} "
        found = [line[len(name):].split() for line in _table(lines, "Worst sequences") if line.startswith(name)]
        assert found and all(cells[0].endswith(f":{entry['row']}") for cells in found), found
        numbers = [_number(c) for cells in found for c in cells[1:]]
        for value in (entry["tokens"], entry["log_ratio_mean"], entry["max_abs_log_ratio"]):
            assert any(math.isclose(n, value, rel_tol=1e-3, abs_tol=1e-12) for n in numbers), (label, value, numbers)


def test_a_table_cuts_a_long_file_name_in_its_middle(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert fit_path(DEEP, 80) == display_path(DEEP, 80)  # the name fits: the display rule alone
    for width in range(16, 40):
        shown = fit_path(f"/mnt/{LONG_NAME}:136", width)
        assert len(shown) == width and shown.endswith(".parquet:136") and ELLIPSIS in shown, (width, shown)
        assert fit_path(f"{LONG_NAME}:7", width).startswith("r")
