"""compare and check know what a bug does to a number (issue 34, item 5): a value only a bug allows (every value
of a run whose report says BUG, a χ² below 0 or a token ratio mean below 1 beyond noise) is never better or
best, a BUG run is marked in every table, and a rule never passes on such a value.

Expected values come from the reports' own numbers (the sign of χ², its interval, the report's status and
diagnosis title), read here independently of the comparison.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console
from test_check import assert_exit, invoke

from mismatch_cli.gate.api import check, compare_many
from mismatch_cli.gate.comparison import BETTER, WORSE, compare_reports
from mismatch_cli.gate.nway import compare_runs
from mismatch_cli.metrics import direction_of
from mismatch_cli.render.compare import render_compare_table
from mismatch_cli.report import Report

REAL = Path(__file__).resolve().parents[1] / "sample_data" / "real"
CLEAN_ARMS = ("bf16", "fp16", "fp32", "fp8")
BUG_ARMS = ("top_p_bug", "temperature_bug")
CHI2, CHI2_SEQ, KL, ESS = ("rollout_corr/chi2_token", "rollout_corr/chi2_seq", "rollout_corr/kl", "diag/ess_token")
RATIO_MEAN, RATIO_MEAN_SE = "diag/ratio_mean", "diag/ratio_mean_se"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each bundled real dump analyzed once, as report.json (compare reads reports without re-reading dumps)."""
    root = tmp_path_factory.mktemp("real")
    paths = {}
    for name in CLEAN_ARMS + BUG_ARMS:
        paths[name] = root / f"{name}.json"
        assert_exit(invoke("analyze", REAL / f"{name}.parquet", "--device", "cpu", "--format", "json",
                           "-o", paths[name]), 0)
    return paths


def _title(path: Path) -> str | None:
    """The report's own BUG title, read from its JSON (None when its status is not bug)."""
    summary = json.loads(path.read_text())["summary"]
    return summary["diagnosis"]["title"] if summary["status"] == "bug" else None


def _report(metrics: dict[str, float], intervals: dict[str, list[float]] | None = None,
            bug: str | None = None) -> Report:
    summary = {"status": "bug", "diagnosis": {"kind": "bug", "code": "test_bug", "title": bug}} if bug else {
        "status": "healthy", "diagnosis": {"kind": "healthy", "code": None, "title": None}}
    return Report(tool={"name": "mismatch", "version": "test"}, created_at="2026-01-01T00:00:00+00:00", inputs=[],
                  config={}, metrics=metrics, intervals=intervals or {}, summary=summary)


def _better_by_direction(metric: str, candidate: float, base: float) -> bool:
    """Whether the candidate's value is better than the base's, by the registry's direction, computed here."""
    phrase = direction_of(metric).phrase
    score = {"lower is better": lambda x: x, "higher is better": lambda x: -x,
             "closer to 1": lambda x: abs(x - 1.0), "lower |x| is better": abs}[phrase]
    return score(candidate) < score(base)


# ------------------------------------------------------------------------------------------ the real dumps
def test_bug_arms_are_bug_runs_and_clean_arms_are_not(real: dict[str, Path]) -> None:
    for name in BUG_ARMS:
        assert _title(real[name]), name
    for name in CLEAN_ARMS:
        assert _title(real[name]) is None, name


def test_top_p_bug_negative_chi2_is_not_better(real: dict[str, Path]) -> None:
    bug = Report.load(real["top_p_bug"])
    assert bug.metrics[CHI2] < 0 and bug.intervals[CHI2][1] < 0  # below 0 beyond its interval: only a bug
    assert bug.metrics[CHI2_SEQ] < 0 and bug.intervals[CHI2_SEQ][1] < 0
    title = _title(real["top_p_bug"])
    result = invoke("compare", REAL / "bf16.parquet", REAL / "top_p_bug.parquet", "--device", "cpu",
                    "--format", "json")
    assert_exit(result, 0)
    body = json.loads(result.stdout)
    rows = {row["metric"]: row for row in body["metrics"]}
    assert rows[CHI2]["mark"] == rows[CHI2_SEQ]["mark"] == "B"
    assert not [row["metric"] for row in body["metrics"] if row["mark"] == BETTER]  # nothing of a BUG run is better
    assert body["bug"] == {"candidate": title}
    assert all(row["bug"]["candidate"].endswith(title) for row in body["metrics"])
    assert "χ² below 0" in rows[CHI2]["bug"]["candidate"]
    assert body["verdict"].startswith(f"verdict: BUG - the candidate has a bug in its dump or config: {title}")
    assert " 0 better" in body["verdict"] and "MIXED" not in body["verdict"] and "BETTER" not in body["verdict"]
    # A bug that makes a run worse is still worse: kl is marked + by its own numbers.
    assert not _better_by_direction(KL, rows[KL]["candidate"], rows[KL]["base"]) and rows[KL]["mark"] == WORSE


def test_a_bug_base_never_makes_a_clean_candidate_worse(real: dict[str, Path]) -> None:
    comparison = compare_reports(Report.load(real["top_p_bug"]), Report.load(real["bf16"]))
    rows = {row.metric: row for row in comparison.rows}
    assert rows[CHI2].candidate > 0 > rows[CHI2].base  # the base's impossible value looks better
    assert rows[CHI2].mark == "B" and rows[CHI2_SEQ].mark == "B"
    assert not [row.metric for row in comparison.rows if row.mark == WORSE and row.base_bug]
    assert comparison.verdict().startswith("verdict: BUG - the base has a bug in its dump or config: ")


def test_compare_table_markdown_html_mark_the_bug(real: dict[str, Path], tmp_path: Path) -> None:
    title = _title(real["top_p_bug"])
    result = invoke("compare", real["bf16"], real["top_p_bug"], "--out-dir", tmp_path / "out",
                    env={"COLUMNS": "100"})
    assert_exit(result, 0)
    lines = result.stdout.splitlines()
    assert any(line.startswith("B  chi2_token") for line in lines)
    assert "(BUG)" in result.stdout and "B looks better only because of a bug's value" in result.stdout
    assert "BUG: the candidate has a bug in its dump or config: " in result.stdout
    assert " ".join(result.stdout.split()).count(title) == 1
    markdown = (tmp_path / "out" / "compare.md").read_text()
    assert f"**BUG: the candidate has a bug in its dump or config: {title}**" in markdown
    assert "| B | rollout_corr/chi2_token |" in markdown and "(candidate) (BUG)" in markdown
    page = (tmp_path / "out" / "compare.html").read_text()
    assert '<p class="verdict bug">verdict: BUG' in page and 'class="mark-bug"' in page
    assert f'<p class="bug">BUG: the candidate has a bug in its dump or config: {title}</p>' in page
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["bug"] == {"candidate": title}


def test_three_way_bug_arm_is_never_best(real: dict[str, Path]) -> None:
    title = _title(real["temperature_bug"])
    result = invoke("compare", REAL / "bf16.parquet", REAL / "fp8.parquet", REAL / "temperature_bug.parquet",
                    "--device", "cpu", "--format", "json")
    assert_exit(result, 0)
    body = json.loads(result.stdout)
    assert body["runs"][2] == {"label": "temperature_bug", "source": str(REAL / "temperature_bug.parquet"),
                               "bug": title}
    assert all("bug" not in run for run in body["runs"][:2])
    for row in body["metrics"]:
        assert row["best"] != "temperature_bug", row["metric"]
        assert set(row["bug_values"]) == {"temperature_bug"}
    chi2_seq = {row["metric"]: row for row in body["metrics"]}[CHI2_SEQ]
    values = {name: Report.load(real[name]).metrics[CHI2_SEQ] for name in ("bf16", "fp8", "temperature_bug")}
    assert min(values, key=values.get) == "temperature_bug"  # it would be best on χ²_seq: −0.9995
    assert chi2_seq["best"] == min(("bf16", "fp8"), key=values.get)
    assert body["verdict"].startswith(f"verdict: BUG - temperature_bug has a bug in its dump or config: {title}")
    assert "best most often: temperature_bug" not in body["verdict"]


def test_three_way_tables_mark_the_bug_arm(real: dict[str, Path], tmp_path: Path) -> None:
    runs = [real["bf16"], real["fp8"], real["temperature_bug"]]
    title = _title(real["temperature_bug"])
    for width in (80, 140):
        result = invoke("compare", *runs, env={"COLUMNS": str(width)})
        assert_exit(result, 0)
        assert max(len(line) for line in result.stdout.splitlines()) <= width
        text = " ".join(result.stdout.split())
        assert "B 0." in text and "B before a value: a bug's value" in text
        assert f"BUG: temperature_bug has a bug in its dump or config: {title}" in text
    result = invoke("compare", *runs, "--out-dir", tmp_path / "out", "-q")
    assert_exit(result, 0)
    page = (tmp_path / "out" / "compare.html").read_text()
    assert "<th>temperature_bug (BUG)</th>" in page and '<td class="bug">B ' in page
    assert f"has a bug in its dump or config: {title}</p>" in page
    markdown = (tmp_path / "out" / "compare.md").read_text()
    assert "| temperature_bug (BUG) |" in markdown and "| B 0." in markdown


def test_every_bug_arm_together_is_never_best(real: dict[str, Path]) -> None:
    names = ("fp32", "bf16", *BUG_ARMS)
    result = compare_many([real[name] for name in names], labels=list(names))
    for row in result.comparison.rows:
        assert row.best not in BUG_ARMS, row.metric
    table = result.table()
    assert set(table[table.bug.notna()].run) == set(BUG_ARMS)
    assert not table[(table.run.isin(BUG_ARMS)) & table.best].size


def test_clean_arms_are_unchanged(real: dict[str, Path]) -> None:
    # fp32's χ² is below 0 only within noise (its interval spans 0): not a bug's value.
    fp32 = Report.load(real["fp32"])
    assert fp32.metrics[CHI2_SEQ] < 0 and fp32.intervals[CHI2_SEQ][0] < 0 < fp32.intervals[CHI2_SEQ][1]
    body = json.loads(invoke("compare", *(real[name] for name in CLEAN_ARMS), "--format", "json").stdout)
    assert all(set(run) == {"label", "source"} for run in body["runs"])
    assert "BUG" not in body["verdict"]
    values = {name: Report.load(real[name]).metrics for name in CLEAN_ARMS}
    for row in body["metrics"]:
        assert "bug_values" not in row and row["mark"] in ("*", "~", "=", "x")
        if row["best"] is not None:  # the best is the best by the direction, from the reports' own numbers
            others = [name for name in CLEAN_ARMS if name != row["best"]]
            assert not any(_better_by_direction(row["metric"], values[o][row["metric"]],
                                                values[row["best"]][row["metric"]]) for o in others)
    for base, candidate in (("bf16", "fp8"), ("fp8", "bf16"), ("fp16", "fp32")):
        body = json.loads(invoke("compare", real[base], real[candidate], "--format", "json").stdout)
        assert "bug" not in body and "BUG" not in body["verdict"]
        for row in body["metrics"]:
            assert "bug" not in row and row["mark"] != "B"
            if row["mark"] in (BETTER, WORSE):
                better = _better_by_direction(row["metric"], row["candidate"], row["base"])
                assert (row["mark"] == BETTER) == better, row["metric"]


def test_fp32_below_zero_without_intervals_is_noise(tmp_path: Path) -> None:
    out = tmp_path / "fp32.json"
    assert_exit(invoke("analyze", REAL / "fp32.parquet", "--device", "cpu", "--bootstrap", "0", "--format", "json",
                       "-o", out), 0)
    report = Report.load(out)
    assert report.metrics[CHI2_SEQ] < 0 and CHI2_SEQ not in report.intervals
    assert abs(report.metrics[RATIO_MEAN] - 1) < 5 * report.metrics[RATIO_MEAN_SE]  # 1 within noise
    comparison = compare_reports(_report({CHI2_SEQ: 0.006, CHI2: 1e-4}), report)
    assert all(row.candidate_bug is None and row.mark != "B" for row in comparison.rows)


# ---------------------------------------------------------------------------------- reports built by hand
def test_negative_chi2_beyond_its_interval_only() -> None:
    base = _report({CHI2: 0.01}, {CHI2: [0.008, 0.012]})
    bug = compare_reports(base, _report({CHI2: -0.05}, {CHI2: [-0.06, -0.04]}))
    assert bug.rows[0].mark == "B" and bug.rows[0].candidate_bug.startswith("χ² below 0 beyond its 95 % interval")
    assert bug.verdict().startswith("verdict: BUG - the candidate has a bug in its dump or config: chi2_token (χ²")
    noisy = compare_reports(base, _report({CHI2: -0.005}, {CHI2: [-0.007, 0.001]}))
    assert noisy.rows[0].mark == BETTER and noisy.rows[0].candidate_bug is None  # spans 0: noise, not a bug
    assert noisy.verdict().startswith("verdict: BETTER")


def test_negative_chi2_without_interval_needs_the_ratio_mean_test() -> None:
    base = _report({CHI2: 0.01, RATIO_MEAN: 1.0, RATIO_MEAN_SE: 0.001})
    low = _report({CHI2: -0.05, RATIO_MEAN: 0.95, RATIO_MEAN_SE: 0.001})  # 50 standard errors below 1
    assert compare_reports(base, low).rows[0].mark == "B"
    near = _report({CHI2: -0.05, RATIO_MEAN: 0.9995, RATIO_MEAN_SE: 0.001})  # inside the band: noise
    assert compare_reports(base, near).rows[0].mark == BETTER


def test_ratio_mean_below_one_is_never_best() -> None:
    def arm(mean: float, error: float) -> Report:
        return _report({RATIO_MEAN: mean, RATIO_MEAN_SE: error, KL: 0.01})

    runs = [("low", arm(0.985, 1e-4)), ("a", arm(1.02, 1e-3)), ("b", arm(1.03, 1e-3))]
    row = {r.metric: r for r in compare_runs(runs, metrics=[RATIO_MEAN, KL]).rows}[RATIO_MEAN]
    assert abs(0.985 - 1) < abs(1.02 - 1)  # by its number alone `low` would be best (closer to 1)
    assert row.best == "a" and set(row.bug_values) == {"low"} and row.bug_values["low"].startswith("token ratio")


def test_bug_run_by_hand_in_two_and_n_way() -> None:
    clean = _report({KL: 0.02, ESS: 0.90}, {KL: [0.019, 0.021], ESS: [0.89, 0.91]})
    bug = _report({KL: 0.001, ESS: 0.80}, {KL: [0.0009, 0.0011], ESS: [0.79, 0.81]}, bug="a made-up bug")
    comparison = compare_reports(clean, bug)
    marks = {row.metric: row.mark for row in comparison.rows}
    assert marks == {KL: "B", ESS: WORSE}  # kl looks better only because of the bug; ess is worse all the same
    assert comparison.to_dict()["bug"] == {"candidate": "a made-up bug"}
    assert comparison.verdict().startswith("verdict: BUG - the candidate has a bug in its dump or config: a made-up "
                                           "bug; WORSE - candidate is worse beyond noise on diag/ess_token")
    buffer = io.StringIO()
    render_compare_table(comparison, Console(file=buffer, width=80, color_system=None))
    assert "(BUG)" in buffer.getvalue() and "a made-up bug" in buffer.getvalue()
    other = _report({KL: 0.03, ESS: 0.85}, {KL: [0.029, 0.031], ESS: [0.84, 0.86]})
    runs = compare_runs([("clean", clean), ("bug", bug), ("other", other)])
    rows = {row.metric: row for row in runs.rows}
    assert rows[KL].best == "clean" and rows[KL].worst == "other"  # not `bug`, whose kl is lowest
    assert rows[ESS].best == "clean" and rows[ESS].worst == "bug"  # a bug's value may be the worst
    alone = compare_runs([("clean", other), ("bug", bug)])  # the only run better than `clean` is the bug
    assert {row.metric: row.mark for row in alone.rows}[KL] == "B"
    assert runs.runs[1].to_dict() == {"label": "bug", "source": "bug", "bug": "a made-up bug"}


# ------------------------------------------------------------------------------------------------- check
def test_check_fails_a_rule_that_passes_only_on_a_bug_value(real: dict[str, Path]) -> None:
    report = Report.load(real["top_p_bug"])
    assert report.metrics[CHI2] <= 0.01 and report.intervals[CHI2][1] < 0
    assert abs(report.metrics[KL]) <= 0.1
    run = check(report, ["chi2_token<=0.01", "abs(kl)<=0.1"])
    chi2, kl = run.result.outcomes
    assert chi2.status == "fail" and "only on a bug's value" in chi2.message
    assert _title(real["top_p_bug"]) in chi2.message
    assert kl.status == "pass" and any("the run's report says BUG" in w for w in kl.warnings)
    assert run.exit_code == 1 and run.verdict().startswith("mismatch check: FAIL")
    clean = check(Report.load(real["bf16"]), ["chi2_token<=0.01", "abs(kl)<=0.1"])
    assert [o.status for o in clean.result.outcomes] == ["pass", "pass"]
    assert not any(o.warnings for o in clean.result.outcomes)
    relative = check(Report.load(real["bf16"]), ["abs(kl):+10%"], baseline=real["top_p_bug"])
    assert any("the baseline's rollout_corr/kl is a bug's value" in w for w in relative.result.outcomes[0].warnings)


def test_check_cli_marks_the_bug(tmp_path: Path) -> None:
    result = invoke("check", REAL / "top_p_bug.parquet", "--device", "cpu", "--fail-on", "chi2_token<=0.01",
                    env={"COLUMNS": "100"})
    assert_exit(result, 1)
    row = next(line for line in result.stdout.splitlines() if "chi2_token<=0.01" in line)
    assert row.startswith("B ") and row.rstrip().endswith("fail")
    assert "that passes only on a bug's value" in " ".join(result.stdout.split())
    body = json.loads(invoke("check", REAL / "top_p_bug.parquet", "--device", "cpu", "--fail-on",
                             "chi2_token<=0.01", "--format", "json").stdout)
    rule = body["rules"][0]
    assert rule["status"] == "fail" and rule["value"] < 0 and math.isfinite(rule["value"])
    assert "only on a bug's value" in rule["message"] and "renormalized" in rule["message"]
