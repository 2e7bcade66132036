"""`mismatch replay`: one read, every trainer's default correction, values equal to `analyze --semantics NAME`,
numbers independent of chunking, the jackknife against float64 numpy, 80 columns without a broken number."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

import mismatch_cli.replay as replay_module
from mismatch_cli.cli import app
from mismatch_cli.correction import CONCEPTS, REPLAY_FAMILIES
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.replay import cell_text, render_replay_table, replay_grid
from mismatch_cli.render.table import plan_blocks
from mismatch_cli.replay import (
    Cell,
    ConceptRow,
    ReplayReport,
    Trainer,
    disagree,
    jackknife_se,
    replay,
    trainers,
)
from mismatch_cli.report import SCHEMA_VERSION

pytestmark = pytest.mark.usefixtures("separate_chunks")  # batches split to cross chunk boundaries

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "sample_data" / "real" / "top_p_bug.parquet"


def _invoke(*argv: str):
    return CliRunner(env={"MISMATCH_DEBUG": None, "COLUMNS": "80"}).invoke(app, list(argv))


@pytest.fixture(scope="module")
def report() -> ReplayReport:
    return replay([str(DUMP)], device="cpu")


def _toml_value(value) -> str:
    return json.dumps(value)  # strings, numbers and booleans read the same in TOML


@pytest.mark.parametrize("name", list(trainers()))
def test_values_equal_analyze_with_the_trainers_settings(name: str, report: ReplayReport, tmp_path: Path) -> None:
    """Independent path: each column's settings as a `[correction]` table, through `analyze`'s JSON."""
    trainer = trainers()[name]
    config = tmp_path / "c.toml"
    config.write_text("[correction]\n" + f"semantics = {_toml_value(name)}\n"
                      + "".join(f"{k} = {_toml_value(v)}\n" for k, v in trainer.fields.items()))
    out = tmp_path / "report.json"
    result = _invoke("analyze", str(DUMP), "--config", str(config), "--device", "cpu", "--bootstrap", "0",
                     "--format", "json", "-q", "-o", str(out))
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())["metrics"]
    for row in report.rows:
        cell = row.cells[name]
        key = trainer.concepts.get(row.concept)
        if key is None or key not in metrics:
            assert cell.key is None, (row.concept, cell)
            continue
        assert cell.key == key
        expected = metrics[key]
        if expected is None:
            assert cell.value is None
        else:
            assert cell.value == pytest.approx(expected, rel=1e-9, abs=1e-12), (row.concept, key)


def _rows_one_by_one(batches):
    for batch in batches:
        for i in range(batch.num_rows):
            yield batch.slice_rows(i, i + 1)


def test_one_read_and_chunking_invariance(monkeypatch: pytest.MonkeyPatch, report: ReplayReport) -> None:
    reads: list[int] = []
    real = replay_module.iter_batches

    def counted(files, options, workers=0):
        reads.append(1)
        return _rows_one_by_one(real(files, options, workers=workers))

    monkeypatch.setattr(replay_module, "iter_batches", counted)
    split = replay([str(DUMP)], device="cpu")
    assert len(reads) == 1, "the dump must be read once for every trainer together"
    assert [r.concept for r in split.rows] == list(CONCEPTS)
    for whole, one in zip(report.rows, split.rows, strict=True):
        for name, cell in whole.cells.items():
            other = one.cells[name]
            assert (other.key, other.disagrees) == (cell.key, cell.disagrees)
            for a, b in ((cell.value, other.value), (cell.se, other.se)):
                assert (a is None) == (b is None)
                if a is not None:
                    assert b == pytest.approx(a, rel=1e-9, abs=1e-15), (whole.concept, name)


def test_each_chunk_is_made_once_for_every_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    import mismatch_cli.engine.many as runner

    made: list[int] = []
    real = runner.make_chunk

    def counted(batch, device, dtype):
        made.append(batch.num_rows)
        return real(batch, device, dtype)

    monkeypatch.setattr(runner, "make_chunk", counted)
    replay([str(DUMP)], device="cpu")
    rows = pq.read_metadata(DUMP).num_rows
    assert sum(made) == rows  # every row in exactly one group chunk, shared by all trainers


def _numpy_jackknife(groups: int = 10) -> tuple[float, float]:
    """TRL's sampling/sampling_logp_difference/mean (token mean of |old - rollout|) and its jackknife SE."""
    table = pq.read_table(DUMP).to_pydict()
    sums, counts = np.zeros(groups), np.zeros(groups)
    for i, (old, rollout, mask) in enumerate(zip(table["old_log_probs"], table["rollout_log_probs"],
                                                 table["response_mask"], strict=True)):
        keep = np.asarray(mask, dtype=bool)
        diff = np.abs(np.asarray(old, dtype=np.float64) - np.asarray(rollout, dtype=np.float64))[keep]
        sums[i % groups] += diff.sum()
        counts[i % groups] += keep.sum()
    full = sums.sum() / counts.sum()
    held = (sums.sum() - sums) / (counts.sum() - counts)
    se = math.sqrt((groups - 1) / groups * ((held - held.mean()) ** 2).sum())
    return full, se


def test_jackknife_se_matches_float64_numpy() -> None:
    full, se = _numpy_jackknife()
    result = replay([str(DUMP)], ["trl"], device="cpu", dtype="float64")
    cell = next(r for r in result.rows if r.concept == "abs_diff").cells["trl"]
    assert cell.value == pytest.approx(full, rel=1e-12)
    assert cell.se == pytest.approx(se, rel=1e-9)


def test_jackknife_and_disagreement_rules() -> None:
    assert jackknife_se(1.0, [1.0]) is None and jackknife_se(1.0, [1.0, None]) is None
    assert jackknife_se(0.5, [1.0, 3.0]) == pytest.approx(math.sqrt(0.5 * 2.0))
    key = "sampling/importance_sampling_ratio/mean"
    assert disagree(Cell(key, 1.0, 0.01), Cell(key, 1.2, 0.01))
    assert not disagree(Cell(key, 1.0, 0.1), Cell(key, 1.2, 0.1))  # within 3 combined SE
    kl = "rollout_corr/kl"
    assert not disagree(Cell(kl, 0.100, 0.0), Cell(kl, 0.105, 0.0))  # below the 10 % practical difference
    assert not disagree(Cell(kl, 0.1, None), Cell(kl, 5.0, 0.0))  # no noise estimate: nothing marked


def test_top_p_bug_marks_trl_sequence_mask_against_verl_token_tis() -> None:
    report = replay([str(DUMP)], ["verl", "xtuner", "trl"], device="cpu")
    row = next(r for r in report.rows if r.concept == "weight_mean")
    assert row.cells["verl"].disagrees and row.cells["trl"].disagrees
    assert row.why is not None and "trl" in row.why and "verl" in row.why
    kl = next(r for r in report.rows if r.concept == "kl")
    assert kl.why is None and not any(c.disagrees for c in kl.cells.values())


def _wide_report() -> ReplayReport:
    """Eight columns of the longest names and widest numbers the formatter makes, one disagreeing."""
    names = ["verl", "xtuner", "trl", "skyrl", "slime", "slime-mis", "nemo-rl", "prime-rl"]
    values = [-1.152e-05, 12345678.0, -0.006849, 1234.5, float("inf"), None, 0.9996, -2.45e7]
    columns = [Trainer(n, n, {}, {c: f"{n}/{c}" for c in CONCEPTS}, {"sequence": n}) for n in names]
    rows = [ConceptRow(c, label, {n: Cell(f"{n}/{c}", values[(i + j) % len(values)], 0.0, disagrees=j == 2)
                                  for j, n in enumerate(names)}, why=f"{label}, sequence: a {'x' * 30} b")
            for i, (c, label) in enumerate(CONCEPTS.items())]
    return ReplayReport(["sample_data/real/top_p_bug.parquet"], columns, rows, groups=10, notes=["a note"])


@pytest.mark.parametrize("width", [60, 80, 120])
def test_eight_trainers_fit_the_width_without_a_broken_number(width: int) -> None:
    wide = _wide_report()
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    render_replay_table(wide, console)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    lines = text.splitlines()
    for row in wide.rows:
        for cell in row.cells.values():
            shown = cell_text(cell)
            assert any(shown in line for line in lines), f"{shown!r} broken or missing at {width} columns"
    if width == 80:
        assert len(plan_blocks(replay_grid(wide), width)) == 2  # split into two stacked tables, never truncated
    assert "*" + format_value(wide.rows[0].cells["trl"].value) in text


def test_json_shape_and_html(tmp_path: Path) -> None:
    page = tmp_path / "replay.html"
    result = _invoke("replay", str(DUMP), "--trainers", "verl,trl", "--device", "cpu", "--format", "json",
                     "--html", str(page), "-q")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema_version"] == SCHEMA_VERSION and data["kind"] == "replay"
    assert [t["name"] for t in data["trainers"]] == ["verl", "trl"]
    assert data["noise"] == {"method": "delete-a-group jackknife", "groups": 10, "sigmas": 3.0}
    assert [c["concept"] for c in data["concepts"]] == list(CONCEPTS)
    for concept in data["concepts"]:
        assert set(concept) == {"concept", "label", "why", "cells"}
        for cell in concept["cells"].values():
            assert set(cell) == {"key", "value", "se", "disagrees", "nonfinite"}  # nonfinite: issue 34 item 6
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'class="disagrees"' in html and "verl" in html


def test_default_columns_are_verl_xtuner_and_every_replayed_trainer() -> None:
    assert list(trainers())[:2] == ["verl", "xtuner"]
    assert list(trainers())[2:] == list(REPLAY_FAMILIES)


def test_exit_codes() -> None:
    unknown = _invoke("replay", str(DUMP), "--trainers", "verl,trll")
    assert unknown.exit_code == 2 and "did you mean trl" in unknown.output
    for empty in (",", ""):
        none = _invoke("replay", str(DUMP), f"--trainers={empty}")
        assert none.exit_code == 2 and "names no trainer" in none.output
    missing = _invoke("replay", str(ROOT / "no-such-dump.parquet"))
    assert missing.exit_code == 3


def test_a_trainer_whose_defaults_log_nothing_is_left_out_of_the_table_but_kept_in_json() -> None:
    report = replay([str(DUMP)], ["verl", "skyrl", "trl"], device="cpu")
    assert report.silent == ["skyrl"]  # SkyRL's correction is off by default: it logs no key at all
    assert [t.name for t in report.shown] == ["verl", "trl"]
    assert all(row.cells["skyrl"].key is None for row in report.rows)
    assert any(note.startswith("skyrl: log none of these") for note in report.notes)
    assert report.to_dict()["silent"] == ["skyrl"] and "skyrl" in [t["name"] for t in report.to_dict()["trainers"]]
    lines = _invoke("replay", str(DUMP), "--trainers", "verl,skyrl,trl").stdout.splitlines()
    header = next(line for line in lines if line.startswith("concept"))
    assert "skyrl" not in header.split() and "trl" in header.split()


def test_a_value_the_dump_cannot_give_reads_n_a_in_every_format(tmp_path: Path) -> None:
    page = tmp_path / "replay.html"
    result = _invoke("replay", str(DUMP), "--trainers", "verl,prime-rl", "--html", str(page))
    assert result.exit_code == 0, result.output
    masked = next(line for line in result.stdout.splitlines() if line.startswith("share masked"))
    assert masked.split()[-1] == "n/a"  # prime-rl's is_masked/mean needs an advantages column the dump lacks
    html = page.read_text()
    assert ">n/a</td>" in html and ">null<" not in html
