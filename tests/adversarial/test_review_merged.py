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
    # --by step on an input without steps: the hint must not say "add --by step" again
    run = mismatch("analyze", ROOT / "sample_data" / "multi_turn.parquet", "--by", "step", "--format", "csv", "--table",
                   "steps", "-q")
    line = assert_clean_failure(run, 2, "--table steps", "no step column")
    assert "add --by step" not in line


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


@pytest.fixture(scope="module")
def two_reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two report.json files of the same six-step synthetic run, with and without --by step."""
    folder = tmp_path_factory.mktemp("reports")
    return _report(folder, "steps", "--by", "step"), _report(folder, "flat")


def test_library_check_takes_one_rule_and_one_path_as_given(two_reports: tuple[Path, Path]) -> None:
    import mismatch_cli

    steps, _ = two_reports
    # a single string was iterated letter by letter: "cannot parse rule 'a'", "no such file: /"
    run = mismatch_cli.check(steps, "max(step:abs(kl))<=1")
    assert run.exit_code == 0 and [o.rule.text for o in run.result.outcomes] == ["max(step:abs(kl))<=1"]
    assert mismatch_cli.check(str(steps), ["abs(kl)<=1"]).exit_code == 0
    assert mismatch_cli.compare(steps, steps).exit_code == 0  # a pathlib.Path raised AttributeError


@pytest.mark.parametrize(("call", "words"), [
    (lambda m, p: m.check(p, ["kl<=1"], missing="ignore"), "missing must be one of error, warn, skip"),
    (lambda m, p: m.check(p, None), "rules must be a list of rule strings"),
    (lambda m, p: m.check(p, [1]), "rules must be a list of rule strings"),
    (lambda m, p: m.check(None, ["kl<=1"]), "inputs must be a Report or a list of paths"),
    (lambda m, p: m.compare(None, p), "base is a NoneType, not a path or a Report"),
    (lambda m, p: m.compare(p, p, fail_on=["kl:+5%"]), "unknown keyword(s) fail_on"),
    (lambda m, p: m.compare(p, p, min_difference=[3]), "min_difference must map metrics to amounts"),
])
def test_library_gate_refuses_bad_arguments_with_a_usage_error(two_reports: tuple[Path, Path], call, words) -> None:
    import mismatch_cli

    with pytest.raises(UsageError) as caught:
        call(mismatch_cli, two_reports[0])
    assert words in str(caught.value), str(caught.value)


def test_min_difference_strings_and_a_metric_given_twice(two_reports: tuple[Path, Path]) -> None:
    import mismatch_cli

    steps, flat = two_reports
    result = mismatch_cli.compare(steps, flat, min_difference=["kl=1"])
    assert next(r for r in result.comparison.rows if r.metric == "rollout_corr/kl").min_difference == 1.0
    run = mismatch("compare", steps, flat, "--min-difference", "kl=1", "--min-difference", "kl=2")
    assert_clean_failure(run, 2, "--min-difference", "kl is given twice")
    run = mismatch("compare", steps, flat, "--min-difference", "kl=1", "--min-difference", "rollout_corr/kl=2")
    assert_clean_failure(run, 2, "rollout_corr/kl is given twice", "'kl'")


def test_missing_report_json_is_named_as_given(tmp_path: Path) -> None:
    run = mismatch("check", tmp_path / "nope.json", "--fail-on", "abs(kl)<=1")
    line = assert_clean_failure(run, 3, "nope.json")
    assert "nope.json/report.json" not in line


@pytest.mark.parametrize("uri", ["foo://x", "file:///tmp/x.parquet", "http://host/x.parquet"])
def test_unknown_scheme_is_named_not_called_a_missing_file(uri: str) -> None:
    run = mismatch("analyze", uri, "-q", timeout=30)
    assert_clean_failure(run, 2, uri, "unknown scheme", "s3://BUCKET/KEY")


def test_gcs_network_failure_is_one_short_line_with_a_gcs_hint() -> None:
    from mismatch_cli.io.remote import store_error

    # what google-cloud-cpp says without network: its whole retry history, ~1000 characters
    text = ("google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of Could not create a "
            "OAuth2 access token. The underlying error message was: PerformWork() - CURL error [6]=Could not "
            "resolve hostname error_info={reason=, domain=, metadata={gcloud-cpp.retry.on-entry=false, "
            + "x" * 800 + "}})")
    error = store_error(OSError(text), "gs://b/k.parquet")
    assert error is not None
    assert "(PerformWork() - CURL error [6]=Could not resolve hostname)" in str(error)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in error.hint and "AWS_" not in error.hint
    assert len(str(error)) < 400


def test_drift_names_one_bad_step_as_that_step_only(tmp_path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(11)
    steps, rows, width = 6, 20, 16
    rollout = -rng.exponential(0.5, size=(steps * rows, width))
    old = rollout + rng.normal(0, 0.01, size=rollout.shape)
    bad = 2 * rows  # the first row of step 2: one token with a ratio of e^9, so chi2_token breaks there only
    rollout[bad, 0], old[bad, 0] = -10.0, -1.0
    table = pa.table({"old_log_probs": pa.array(old.tolist()), "rollout_log_probs": pa.array(rollout.tolist()),
                      "response_mask": pa.array(np.ones_like(old, dtype=np.int8).tolist()),
                      "step": pa.array(np.repeat(np.arange(steps), rows))})
    pq.write_table(table, tmp_path / "run.parquet")
    run = mismatch("analyze", tmp_path / "run.parquet", "--by", "step", "--bootstrap", "0", env={"COLUMNS": "200"})
    assert run.code == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if line.strip().startswith("chi2_token:"))
    assert "out of band at step 2 only (1 of 6 steps)" in line, run.stdout
    assert "1 steps" not in run.stdout and "from step 2" not in line


def test_a_rule_over_a_column_the_dump_lacks_names_the_rule(tmp_path: Path) -> None:
    dump = tmp_path / "run.parquet"
    assert mismatch("synth", dump, "--tokens", "5000", "-q").code == 0
    rule = "every(env_name:abs(kl))<=0.01"
    run = mismatch("check", dump, "--fail-on", rule, "--bootstrap", "0")
    line = assert_clean_failure(run, 3, "'env_name'", f"the rule {rule}", "available columns")
    assert "--by env_name" not in line  # no --by was given: the rule asked for the column
    run = mismatch("check", dump, "--by", "env_name", "--fail-on", "abs(kl)<=1", "--bootstrap", "0")
    assert_clean_failure(run, 3, "'env_name'", "--by env_name")


def test_compare_says_by_does_not_apply_to_a_report(two_reports: tuple[Path, Path]) -> None:
    steps, flat = two_reports
    run = mismatch("compare", flat, steps, "--by", "step")
    assert run.code == 0, run.stderr
    flat_text = " ".join(run.stdout.split())
    assert flat_text.count("--by does not apply") == 1, run.stdout  # the base only: the candidate has its steps
    assert (f"note: {flat} is a report made without --by step; --by does not apply to a report (re-analyze its "
            "dumps with --by)") in flat_text, run.stdout
    run = mismatch("compare", steps, steps, "--by", "step")
    assert "--by does not apply" not in " ".join(run.stdout.split())


def test_key_metrics_promise_no_interval_without_a_bootstrap() -> None:
    run = mismatch("analyze", SINGLE, "--bootstrap", "0")
    assert run.code == 0, run.stderr
    assert "Key metrics\n" in run.stdout and "bootstrap interval" not in run.stdout, run.stdout
    run = mismatch("analyze", SINGLE, "--bootstrap", "20")
    assert "Key metrics (95 % bootstrap interval)" in run.stdout, run.stdout


def test_relative_scoped_rule_names_the_baseline_table_it_lacks(two_reports: tuple[Path, Path]) -> None:
    steps, flat = two_reports
    run = mismatch("check", steps, "--baseline", flat, "--fail-on", "max(step:abs(kl)):+5%")
    assert run.code == 2, (run.code, run.stderr)  # like a candidate without the table (was 3, "no kl in its table")
    reason = [line for line in run.stdout.splitlines() if line.startswith("error:")]
    assert reason == ["error: max(step:abs(kl)):+5%: the baseline has no per-step table (analyze with --by step, on "
                      "an input that has steps)"], run.stdout
