"""Review of the features merged with the metric registry and the one-screen summary: bad inputs fail cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, assert_clean_failure, mismatch

from mismatch_cli.errors import DataError, InputError, UsageError

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


def _batch() -> dict:
    import numpy as np

    old = np.log(np.linspace(0.1, 0.9, 12, dtype=np.float32)).reshape(3, 4)
    return {"old_log_probs": old, "rollout_log_probs": old + np.float32(0.01), "response_mask": np.ones((3, 4))}


@pytest.mark.parametrize(("change", "error", "words"), [
    ({"old_log_probs": "abc"}, InputError, ("old_log_probs is a str, not an array",)),
    ({"groups": ["a", "b", "c"]}, UsageError, ("groups is a list, not a mapping",)),
    ({"step": -1}, UsageError, ("step must be an integer >= 0", "-1")),
])
def test_write_dump_refuses_bad_arguments_and_writes_nothing(tmp_path: Path, change: dict, error: type,
                                                              words: tuple[str, ...]) -> None:
    from mismatch_cli import write_dump

    arguments = {**_batch(), **change}
    with pytest.raises(error) as caught:
        write_dump(tmp_path / "dumps", **arguments)
    assert all(word in str(caught.value) for word in words), str(caught.value)
    assert not (tmp_path / "dumps").exists()


def test_write_dump_mask_value_is_named_as_a_plain_number(tmp_path: Path) -> None:
    from mismatch_cli import write_dump

    batch = _batch()
    batch["response_mask"][1, 2] = 0.5
    with pytest.raises(DataError, match=r"row 1 position 2 is 0\.5, not 0 or 1"):
        write_dump(tmp_path / "d", **batch)


def test_write_dump_into_an_existing_folder_named_like_a_file(tmp_path: Path) -> None:
    from mismatch_cli import write_dump

    folder = tmp_path / "run.parquet"
    folder.mkdir()
    written = write_dump(folder, step=3, **_batch())
    assert written == folder / "step_000003.parquet" and written.is_file()
    run = mismatch("analyze", folder, "--format", "csv", "--table", "metrics", "-q")
    assert run.code == 0, run.stderr
