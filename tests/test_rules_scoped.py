"""Rules over the per-step and per-group tables: `max(step:abs(kl))<=1e-3`, `every(group:chi2_token)<=1`, ...

Reports are made by hand, so every expected value below is worked out from the numbers in them.
"""

from __future__ import annotations

import pytest

from mismatch_cli.errors import UsageError
from mismatch_cli.gate.thresholds import evaluate, parse_rule
from mismatch_cli.report import Report

KL = "rollout_corr/kl"
CHI2 = "rollout_corr/chi2_token"


def entry(label: object, kl: float | None, chi2: float | None = 0.5, key: str = "step") -> dict:
    return {key: label, "valid_tokens": 100, "metrics": {KL: kl, CHI2: chi2}, "rounds": [], "notes": []}


def make_report(steps: list[tuple[int, float | None]], groups: dict[str, list[tuple[str, float]]] | None = None,
                overall_kl: float = 0.0) -> Report:
    return Report(
        tool={"name": "mismatch", "version": "test"}, created_at="2026-01-01T00:00:00+00:00", inputs=[], config={},
        metrics={KL: overall_kl, CHI2: 0.5},
        steps=[entry(s, kl) for s, kl in steps],
        groups={column: [entry(g, kl, key="group") for g, kl in values] for column, values in (groups or {}).items()},
    )


RUN = make_report(
    [(10, -0.0004), (11, 0.0009), (12, -0.0031), (13, 0.0002)],
    {"env_name": [("math", 0.002), ("code", -0.05)], "data_source": [("gsm8k", 0.0001)]},
)


def outcome(rule: str, candidate: Report = RUN, baseline: Report | None = None, missing: str = "error"):
    return evaluate([parse_rule(rule)], candidate, baseline, missing).outcomes[0]


# ---------------------------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(("text", "aggregate", "scope", "metric", "magnitude", "op"), [
    ("max(step:abs(kl))<=1e-3", "max", "step", "kl", True, "<="),
    ("min( step : rollout_corr/kl ) >= -0.01", "min", "step", "rollout_corr/kl", False, ">="),
    ("mean(group:chi2_token)<1", "mean", "group", "chi2_token", False, "<"),
    ("every(env_name:abs(kl))<=0.01", "every", "env_name", "kl", True, "<="),
    ("any(step:diag/ess_token)>0.5", "any", "step", "diag/ess_token", False, ">"),
    ("max(step:chi2_token):+10%", "max", "step", "chi2_token", False, "+"),
    ("abs(kl)<=0.01", None, None, "kl", True, "<="),
])
def test_parse_scoped_rules(text, aggregate, scope, metric, magnitude, op) -> None:
    rule = parse_rule(text)
    assert (rule.aggregate, rule.scope, rule.metric, rule.magnitude, rule.op) == (aggregate, scope, metric,
                                                                                  magnitude, op)


@pytest.mark.parametrize(("text", "needles"), [
    ("maximum(step:kl)<=1", ["unknown aggregate 'maximum'", "max, min, mean, every, any"]),
    ("max(kl)<=0.01", ["max() needs a scope", "max(step:kl)"]),
    ("step:max(abs(kl))<=1e-3", ["the scope goes inside", "max(step:abs(kl))"]),
    ("abs(max(step:kl))<=1", ["abs() goes around the metric", "max(step:abs(kl))"]),
    ("every(step:kl):+10%", ["every() holds each entry to a bound", "max/min/mean(step:...):+N%"]),
    ("max(step:sqrt(kl))<=1", ["'sqrt(kl)' is not METRIC or abs(METRIC)"]),
])
def test_bad_rules_are_one_line_errors_naming_the_rule_and_the_fix(text, needles) -> None:
    with pytest.raises(UsageError) as caught:
        parse_rule(text, origin="--fail-on")
    line = str(caught.value)
    assert "\n" not in line and f"'{text}'" in line and "; fix: " in line
    for needle in needles:
        assert needle in line


# ------------------------------------------------------------------------------------ max / min / mean


def test_max_over_steps_names_the_step() -> None:
    result = outcome("max(step:abs(kl))<=1e-3")
    assert result.status == "fail" and result.value == pytest.approx(0.0031) and result.where == ["step 12"]
    assert "step 12" in result.message and result.metric == KL
    assert result.severity == pytest.approx((0.0031 - 1e-3) / 1e-3)
    assert outcome("max(step:abs(kl))<=4e-3").status == "pass"
    assert outcome("max(step:kl)<=1e-3").value == pytest.approx(0.0009)  # signed: step 11


def test_min_and_mean_over_steps() -> None:
    low = outcome("min(step:kl)>=-0.003")
    assert low.status == "fail" and low.value == pytest.approx(-0.0031) and low.where == ["step 12"]
    mean = outcome("mean(step:abs(kl))<=1e-3")
    assert mean.value == pytest.approx((0.0004 + 0.0009 + 0.0031 + 0.0002) / 4)  # 0.0011: each step counts once
    assert mean.status == "fail" and mean.where == ["step 12"] and "largest: step 12" in mean.message
    assert outcome("mean(step:kl)<=0").value == pytest.approx((-0.0004 + 0.0009 - 0.0031 + 0.0002) / 4)


def test_groups_one_column_or_all() -> None:
    all_groups = outcome("max(group:abs(kl))<=0.01")
    assert all_groups.value == pytest.approx(0.05) and all_groups.where == ["env_name=code"]
    one = outcome("max(data_source:abs(kl))<=0.01")
    assert one.status == "pass" and one.value == pytest.approx(0.0001) and one.where == ["data_source=gsm8k"]


def test_relative_aggregate_against_the_baseline() -> None:
    base = make_report([(1, 0.001), (2, 0.002)])
    grown = make_report([(1, 0.0021), (2, 0.0023)])
    result = outcome("max(step:kl):+10%", grown, base)
    assert result.baseline == pytest.approx(0.002) and result.bound == pytest.approx(0.0022)
    assert result.status == "fail" and result.where == ["step 2"]
    assert outcome("max(step:kl):+20%", grown, base).status == "pass"


# --------------------------------------------------------------------------------------- every / any


def test_every_step_lists_each_offender_worst_first() -> None:
    result = outcome("every(step:abs(kl))<=5e-4")
    assert result.status == "fail"
    assert result.where == ["step 12", "step 11"]  # 0.0031, then 0.0009; steps 10 and 13 hold
    assert result.value == pytest.approx(0.0031)
    assert "2 of 4 steps" in result.message and "step 12 = 0.0031" in result.message
    passing = outcome("every(step:abs(kl))<=0.004")
    assert passing.status == "pass" and passing.where == ["step 12"]  # the closest to the bound


def test_any_step() -> None:
    result = outcome("any(step:abs(kl))<=1e-4")
    assert result.status == "fail" and result.where == ["step 13"] and "closest: step 13" in result.message
    holding = outcome("any(step:abs(kl))<=5e-4")
    assert holding.status == "pass" and holding.where == ["step 13", "step 10"]


# ------------------------------------------------------------------------------------ what is missing


def test_null_steps_are_left_out_and_said_so() -> None:
    run = make_report([(1, 0.001), (2, None), (3, 0.002)])
    result = outcome("max(step:kl)<=0.01", run)
    assert result.value == pytest.approx(0.002) and "1 step with a null rollout_corr/kl left out" in result.message
    empty = outcome("max(step:kl)<=0.01", make_report([(1, None)]))
    assert empty.status == "error" and empty.exit_code == 3


def test_missing_scopes_and_metrics() -> None:
    flat = make_report([])
    result = outcome("max(step:kl)<=0.01", flat)
    assert result.status == "error" and result.exit_code == 2 and "--by step" in result.message
    assert outcome("max(step:kl)<=0.01", flat, missing="skip").status == "skip"
    column = outcome("max(env:kl)<=0.01")
    assert column.exit_code == 2 and "env_name" in column.message and "--by env" in column.message
    typo = outcome("max(step:kll)<=0.01")
    assert typo.exit_code == 2 and "rollout_corr/kl" in typo.message


def test_to_dict_carries_scope_and_where() -> None:
    body = outcome("every(step:abs(kl))<=5e-4").to_dict()
    assert body["aggregate"] == "every" and body["scope"] == "step" and body["where"] == ["step 12", "step 11"]
    plain = outcome("abs(kl)<=0.01").to_dict()
    assert plain["aggregate"] is None and plain["scope"] is None and plain["where"] == []


def test_grouping_an_analysis_needs_for_the_rules() -> None:
    from mismatch_cli.gate.thresholds import grouping_for

    rules = [parse_rule(t) for t in ("abs(kl)<=0.01", "max(step:kl)<=1", "every(env_name:kl)<=1",
                                     "any(group:kl)<=1", "mean(env_name:chi2_token)<=1")]
    assert grouping_for(rules) == (True, ("env_name",))
    assert grouping_for(rules[:1]) == (False, ())


def test_check_holds_a_saved_report_to_rules_over_steps(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "report.json"
    path.write_text(RUN.to_json())
    root = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-m", "mismatch_cli", "check", str(path), "--format", "json",
                          "--fail-on", "every(step:abs(kl))<=5e-4", "--fail-on", "max(env_name:abs(kl))<=0.1"],
                         capture_output=True, text=True, env=env, cwd=root)
    assert run.returncode == 1, run.stderr
    rules = json.loads(run.stdout)["rules"]
    assert [r["status"] for r in rules] == ["fail", "pass"]
    assert rules[0]["where"] == ["step 12", "step 11"] and rules[1]["where"] == ["env_name=code"]
    assert "step 12" in run.stderr  # the verdict line names the worst step
