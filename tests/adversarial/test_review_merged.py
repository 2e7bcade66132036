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


def _report(tmp_path: Path, name: str, *args: str) -> Path:
    """A report.json of a six-step synthetic run (with --by step when asked)."""
    dump = tmp_path / f"{name}.parquet"
    assert mismatch("synth", dump, "--steps", "6", "--tokens", "20000", "-q").code == 0
    target = tmp_path / f"{name}.json"
    assert mismatch("analyze", dump, "--format", "json", "-o", target, "-q", "--bootstrap", "0", *args).code == 0
    return target


def test_rule_that_cannot_be_evaluated_says_why_on_one_line(tmp_path: Path) -> None:
    steps, flat = _report(tmp_path, "steps", "--by", "step"), _report(tmp_path, "flat")
    rule = "max(step:abs(kl))<=1e-3"
    run = mismatch("check", flat, "--fail-on", rule, env={"COLUMNS": "60"})
    assert run.code == 2
    reasons = [line for line in run.stdout.splitlines() if line.startswith("error:")]
    assert len(reasons) == 1 and reasons[0].endswith("on an input that has steps)"), run.stdout  # never wrapped
    # compare printed an `error` status with no reason, and a verdict of NO SIGNIFICANT CHANGE with exit 2
    run = mismatch("compare", steps, flat, "--fail-on", "max(step:abs(kl)):+5%", env={"COLUMNS": "80"})
    assert run.code == 2, run.stderr
    assert any(line.startswith("error: max(step:abs(kl)):+5%: ") and "per-step table" in line
               for line in run.stdout.splitlines()), run.stdout
    verdict = [line for line in run.stderr.splitlines() if line.startswith("verdict:")]
    assert verdict and verdict[0].startswith("verdict: ERROR - 1 limit(s) not evaluated"), run.stderr
