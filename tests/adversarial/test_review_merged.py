"""Review of the features merged with the metric registry and the one-screen summary: bad inputs fail cleanly."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, assert_clean_failure, mismatch

SINGLE = ROOT / "sample_data" / "single_turn.parquet"


def test_csv_table_the_report_lacks_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "steps.csv"
    run = mismatch("analyze", SINGLE, "--format", "csv", "--table", "steps", "-o", target, "-q")
    line = assert_clean_failure(run, 2, "--table steps", "--by step")
    assert "rounds" in line  # names the tables the report does have
    assert not target.exists()
    run = mismatch("analyze", SINGLE, "--format", "csv", "--table", "groups", "-q")
    assert_clean_failure(run, 2, "--table groups", "--by COLUMN")
    assert run.stdout == ""
