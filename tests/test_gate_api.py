"""`mismatch_cli.compare` and `mismatch_cli.check`: the command line's semantics from Python, typed results."""

from __future__ import annotations

import json

import pytest
from test_check import invoke, make_dump

import mismatch_cli
from mismatch_cli import CorrectionConfig
from mismatch_cli.errors import UsageError


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gate")
    clean, bad = root / "clean.parquet", root / "bad.parquet"
    return {"root": root, "clean": clean, "bad": bad, "clean_values": make_dump(clean, 0.01, 1),
            "bad_values": make_dump(bad, 0.2, 2)}


def test_compare_from_python_matches_numpy_and_the_command(dumps) -> None:
    result = mismatch_cli.compare(str(dumps["clean"]), str(dumps["bad"]), rules=["chi2_token:+50%"],
                                  device="cpu", dtype="float64", bootstrap=50)
    frame = result.table().set_index("metric")
    chi2 = frame.loc["rollout_corr/chi2_token"]
    assert chi2["base"] == pytest.approx(dumps["clean_values"]["chi2_token"], rel=1e-9)
    assert chi2["candidate"] == pytest.approx(dumps["bad_values"]["chi2_token"], rel=1e-9)
    assert result.exit_code == 1 and result.verdict().startswith("verdict: FAIL")
    assert not result.base.from_report and result.base.report.metrics["rollout_corr/kl"] == pytest.approx(
        dumps["clean_values"]["kl"], rel=1e-9)
    command = invoke("compare", dumps["clean"], dumps["bad"], "--fail-on", "chi2_token:+50%", "--device", "cpu",
                     "--dtype", "float64", "--bootstrap", "50", "--format", "json")
    assert command.exit_code == result.exit_code
    body = json.loads(command.stdout)
    assert {row["metric"]: row["mark"] for row in body["metrics"]} == dict(zip(frame.index, frame["mark"],
                                                                              strict=True))


def test_compare_takes_reports_in_memory(dumps) -> None:
    base = mismatch_cli.analyze([str(dumps["clean"])], device="cpu", bootstrap=0)
    result = mismatch_cli.compare(base, base)
    assert result.base.from_report and result.candidate.from_report
    assert result.exit_code == 0 and "NO SIGNIFICANT CHANGE" in result.verdict()


def test_compare_notes_a_report_made_with_another_correction(dumps) -> None:
    base = mismatch_cli.analyze([str(dumps["clean"])], device="cpu", bootstrap=0)
    result = mismatch_cli.compare(base, base, correction=CorrectionConfig(rollout_is="token"))
    assert any("correction flags do not apply to a report" in note for note in result.comparison.notes)


def test_check_from_python_gates_as_the_command_does(dumps) -> None:
    kl = dumps["bad_values"]["kl"]
    run = mismatch_cli.check([str(dumps["bad"])], rules=[f"abs(kl)<={abs(kl) * 0.5}", "chi2_token<=1e9"],
                             device="cpu", dtype="float64", bootstrap=0)
    assert run.exit_code == 1
    frame = run.table().set_index("rule")
    assert list(frame["status"]) == ["fail", "pass"]
    assert frame.iloc[0]["value"] == pytest.approx(abs(kl), rel=1e-9)
    assert run.candidate.metrics["rollout_corr/kl"] == pytest.approx(kl, rel=1e-9)


def test_check_against_a_baseline_report(dumps, tmp_path) -> None:
    baseline = mismatch_cli.analyze([str(dumps["clean"])], device="cpu", dtype="float64", bootstrap=0)
    path = tmp_path / "report.json"
    path.write_text(baseline.to_json())
    run = mismatch_cli.check([str(dumps["bad"])], rules=["chi2_token:+10%"], baseline=str(path), device="cpu",
                             bootstrap=0)
    assert run.exit_code == 1 and run.baseline_label == str(path)
    assert run.result.outcomes[0].baseline == pytest.approx(dumps["clean_values"]["chi2_token"], rel=1e-9)


def test_check_refuses_no_rules_and_relative_rules_without_baseline(dumps) -> None:
    with pytest.raises(UsageError, match="no rules"):
        mismatch_cli.check([str(dumps["clean"])])
    with pytest.raises(UsageError, match="need a baseline"):
        mismatch_cli.check([str(dumps["clean"])], rules=["kl:+10%"])
