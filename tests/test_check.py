"""`mismatch check`: rules, TOML, every exit code, JUnit XML, GitHub annotations and step summary."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.errors import UsageError
from mismatch_cli.gate.thresholds import evaluate, load_check_config, parse_rule
from mismatch_cli.render.github import annotations
from mismatch_cli.report import Report

CLEAN_ENV = {"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None, "GITHUB_ACTIONS": None,
             "GITHUB_STEP_SUMMARY": None}
runner = CliRunner(env=CLEAN_ENV)


def invoke(*args: object, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env={**CLEAN_ENV, **(env or {})})


def assert_exit(result, code: int) -> None:
    """The exit code, reached through SystemExit (click's runner records none for a clean exit 0)."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    allowed = (SystemExit, type(None)) if code == 0 else SystemExit
    assert isinstance(result.exception, allowed), result.exception


def make_dump(path: Path, scale: float, seed: int, rows: int = 120, width: int = 16) -> dict[str, float]:
    """A parquet dump whose log-ratios are scale * N(0.2, 1); returns kl and chi2_token computed with numpy."""
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(0.5, size=(rows, width))
    delta = scale * rng.normal(0.2, 1.0, size=(rows, width))
    old = rollout + delta
    lengths = rng.integers(1, width + 1, size=rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    pq.write_table(pa.table({
        "old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
        "response_mask": pa.array(mask.astype(np.int8).tolist(), type=pa.list_(pa.int8())),
    }), path)
    d = delta[mask]
    # verl's masked_mean divides by count + 1e-8.
    return {"kl": float(-d.sum() / (d.size + 1e-8)), "chi2_token": float(np.exp(2 * d).sum() / (d.size + 1e-8) - 1)}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("check")
    clean, bad = root / "clean.parquet", root / "bad.parquet"
    info = {"clean": clean, "bad": bad, "clean_values": make_dump(clean, 0.01, 1), "bad_values": make_dump(bad, 0.2, 2)}
    result = invoke("analyze", clean, "--out-dir", root / "base", "--no-plots", "--device", "cpu",
                    "--dtype", "float64")
    assert result.exit_code == 0, result.stderr
    info["baseline"] = root / "base" / "report.json"
    return info


def run_json(*args: object, env: dict | None = None) -> tuple[object, dict]:
    result = invoke("check", *args, "--device", "cpu", "--format", "json", env=env)
    return result, json.loads(result.stdout) if result.stdout.strip() else {}


# ------------------------------------------------------------------------------------------------ rules


def test_parse_rules() -> None:
    rule = parse_rule("rollout_corr/kl <= 0.01")
    assert (rule.metric, rule.op, rule.value, rule.relative) == ("rollout_corr/kl", "<=", 0.01, False)
    rule = parse_rule("rollout_corr/chi2_token:+10%")
    assert (rule.metric, rule.op, rule.value, rule.percent, rule.relative) == ("rollout_corr/chi2_token", "+", 10.0,
                                                                                True, True)
    assert parse_rule("diag/ess_token:-5%").op == "-"
    assert parse_rule("diag/ess_token:+-0.02").op == "±"
    assert parse_rule("x>=-1e-3").value == -0.001
    for bad in ("kl", "kl<=", "kl=<0.1", "kl:10%", "kl<=abc", ":+1%", "kl <= 1 2"):
        with pytest.raises(UsageError):
            parse_rule(bad)


def _report(metrics: dict) -> Report:
    return Report(tool={}, created_at="", inputs=[], config={}, metrics=metrics)


def test_relative_bounds_by_hand() -> None:
    base = _report({"a": 2.0, "b": -4.0, "c": 0.5})
    cand = _report({"a": 2.2, "b": -3.5, "c": 0.47})
    outcomes = evaluate([parse_rule("a:+10%"), parse_rule("a:+9%"), parse_rule("b:+10%"), parse_rule("b:+15%"),
                         parse_rule("c:-5%"), parse_rule("c:-7%"), parse_rule("c:±0.02"), parse_rule("a<2.2")],
                        cand, base).outcomes
    # a may reach 2.2 (2 + 10 % of 2) and not 2.18; b (negative) may reach -4 + 0.4 = -3.6 (fails), -3.4 (passes);
    # c may fall to 0.475 (fails) or 0.465 (passes); +-0.02 allows [0.48, 0.52] (fails).
    assert [o.status for o in outcomes] == ["pass", "fail", "fail", "pass", "fail", "pass", "fail", "fail"]
    assert outcomes[1].bound == pytest.approx(2.18)
    assert outcomes[2].bound == pytest.approx(-3.6)
    assert outcomes[4].bound == pytest.approx(0.475)


def test_load_check_config(tmp_path: Path) -> None:
    (tmp_path / "ci").mkdir()
    path = tmp_path / "ci" / "mismatch.toml"
    path.write_text('[check]\nfail_on = ["rollout_corr/kl<=0.01", "diag/ess_token:-5%"]\nbaseline = "base.json"\n'
                    'missing = "warn"\n')
    config = load_check_config(path)
    assert [r.text for r in config.rules] == ["rollout_corr/kl<=0.01", "diag/ess_token:-5%"]
    assert config.baseline == str(tmp_path / "ci" / "base.json")  # relative to the config file
    assert config.missing == "warn"
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.mismatch.check]\nfail_on = ["diag/ess_token>=0.5"]\n')
    assert [r.metric for r in load_check_config(pyproject).rules] == ["diag/ess_token"]


# ------------------------------------------------------------------------------------------ exit 0 and 1


def test_pass_exit_0(dumps) -> None:
    result, body = run_json(dumps["clean"], "--fail-on", "rollout_corr/kl<=0.01", "--fail-on", "kl>=-0.01")
    assert_exit(result, 0)
    assert [r["status"] for r in body["rules"]] == ["pass", "pass"]
    assert body["rules"][1]["metric"] == "rollout_corr/kl"  # the prefix may be left out
    assert body["rules"][0]["value"] == pytest.approx(dumps["clean_values"]["kl"], rel=1e-5, abs=1e-9)
    assert "mismatch check: PASS" in result.stderr


def test_flags_a_report_cannot_honour_are_named_not_ignored(dumps) -> None:
    report = dumps["baseline"]
    quiet = invoke("check", report, "--fail-on", "kl<=1")
    assert_exit(quiet, 0)
    assert "note:" not in quiet.stderr  # no flag given, nothing to say
    told = invoke("check", report, "--semantics", "trl", "--by", "step", "--fail-on", "kl<=1")
    assert_exit(told, 0)
    assert "correction flags do not apply to a report" in told.stderr
    assert "--by does not apply to a report" in told.stderr


def test_a_report_among_other_inputs_is_a_usage_error(dumps) -> None:
    result = invoke("check", dumps["baseline"], dumps["clean"], "--fail-on", "kl<=1")
    assert_exit(result, 2)
    assert "check holds one report to the rules" in result.stderr


def test_breach_exit_1(dumps) -> None:
    limit = 0.5 * (dumps["clean_values"]["chi2_token"] + dumps["bad_values"]["chi2_token"])
    rule = f"rollout_corr/chi2_token<={limit}"
    assert_exit(invoke("check", dumps["clean"], "--fail-on", rule, "--device", "cpu"), 0)
    result, body = run_json(dumps["bad"], "--fail-on", rule)
    assert_exit(result, 1)
    assert body["rules"][0]["status"] == "fail"
    assert body["rules"][0]["value"] == pytest.approx(dumps["bad_values"]["chi2_token"], rel=1e-4)
    assert "mismatch check: FAIL" in result.stderr


def test_relative_rules_against_a_baseline(dumps) -> None:
    base = json.loads(dumps["baseline"].read_text())["metrics"]["rollout_corr/chi2_token"]
    assert base == pytest.approx(dumps["clean_values"]["chi2_token"], rel=1e-9)
    result, body = run_json(dumps["bad"], "--baseline", dumps["baseline"], "--fail-on", "rollout_corr/chi2_token:+10%")
    assert_exit(result, 1)
    assert body["rules"][0]["baseline"] == base
    assert body["rules"][0]["bound"] == pytest.approx(base * 1.1)
    # The baseline's own dump stays within any tolerance of itself.
    result, body = run_json(dumps["clean"], "--baseline", dumps["baseline"], "--fail-on", "rollout_corr/chi2_token:+0%",
                            "--fail-on", "diag/ess_token:-0%", "--dtype", "float64")
    assert_exit(result, 0)


def test_breach_wins_over_a_data_error(dumps, tmp_path: Path) -> None:
    data = json.loads(dumps["baseline"].read_text())
    del data["metrics"]["rollout_corr/chi2_seq"]
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(data))
    args = ("--baseline", baseline, "--fail-on", "rollout_corr/chi2_seq:+10%")
    result, body = run_json(dumps["clean"], *args)
    assert_exit(result, 3)
    assert body["rules"][0]["status"] == "error" and "baseline has no" in body["rules"][0]["message"]
    result, _ = run_json(dumps["bad"], *args, "--fail-on", "rollout_corr/kl<=-1")
    assert_exit(result, 1)


def test_missing_warn_and_skip(dumps) -> None:
    for policy, status in (("warn", "warn"), ("skip", "skip")):
        result, body = run_json(dumps["clean"], "--fail-on", "diag/not_a_metric<=1", "--fail-on", "kl<=1",
                                "--missing", policy)
        assert_exit(result, 0)
        assert [r["status"] for r in body["rules"]] == [status, "pass"]


# ---------------------------------------------------------------------------------------------- exit 2


@pytest.mark.parametrize("args, needle", [
    (("--fail-on", "kl<<0.1"), "cannot parse rule"),
    (("--fail-on", "diag/not_a_metric<=1"), "unknown metric"),
    (("--fail-on", "rollout_corr/kl:+10%"), "need a baseline"),
    ((), "no rules"),
    (("--fail-on", "kl<=1", "--missing", "maybe"), "maybe"),
    (("--fail-on", "kl<=1", "--github", "sometimes"), "sometimes"),
])
def test_bad_rules_exit_2(dumps, args, needle) -> None:
    result = invoke("check", dumps["clean"], *args, "--device", "cpu")
    assert_exit(result, 2)
    assert needle in result.stderr


def test_bad_config_exit_2(dumps, tmp_path: Path) -> None:
    cases = {"broken.toml": "[check\n", "unknown.toml": '[check]\nfailon = ["kl<=1"]\n',
             "type.toml": "[check]\nfail_on = 3\n", "rule.toml": '[check]\nfail_on = ["kl=1"]\n'}
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert_exit(invoke("check", dumps["clean"], "--config", path, "--device", "cpu"), 2)
    assert_exit(invoke("check", dumps["clean"], "--config", tmp_path / "absent.toml"), 2)


def test_config_rules_and_flags_add_up(dumps, tmp_path: Path) -> None:
    config = tmp_path / "mismatch.toml"
    config.write_text(f'[check]\nfail_on = ["rollout_corr/kl<=0.01"]\nbaseline = "{dumps["baseline"]}"\n'
                      '[correction]\nrollout_is = "token"\nrollout_is_threshold = 2.0\n')
    result, body = run_json(dumps["clean"], "--config", config, "--fail-on", "rollout_corr/rollout_is_mean:±5%",
                            "--missing", "warn")
    assert_exit(result, 0)
    # The baseline was analyzed without IS, so the relative IS rule warns; [correction] made the input have IS.
    assert [r["status"] for r in body["rules"]] == ["pass", "warn"]


# ---------------------------------------------------------------------------------------------- exit 3


def test_missing_input_exit_3_still_writes_junit(dumps, tmp_path: Path) -> None:
    junit = tmp_path / "out" / "junit.xml"
    result = invoke("check", tmp_path / "absent.parquet", "--fail-on", "kl<=1", "--junit-xml", junit)
    assert_exit(result, 3)
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1" and root.find(".//error") is not None


@pytest.mark.parametrize("content", ["{not json", '{"schema_version": 99}', '{"schema_version": 1}'])
def test_bad_baseline_exit_3(dumps, tmp_path: Path, content: str) -> None:
    baseline = tmp_path / "base.json"
    baseline.write_text(content)
    result = invoke("check", dumps["clean"], "--baseline", baseline, "--fail-on", "kl:+1%", "--device", "cpu")
    assert_exit(result, 3)
    assert_exit(invoke("check", dumps["clean"], "--baseline", tmp_path / "nope.json", "--fail-on", "kl:+1%"), 3)


def test_null_metric_exit_3(dumps, tmp_path: Path) -> None:
    data = json.loads(dumps["baseline"].read_text())
    data["metrics"]["rollout_corr/kl"] = None
    report = tmp_path / "r.json"
    report.write_text(json.dumps(data))
    result = invoke("check", report, "--fail-on", "rollout_corr/kl<=1")
    assert_exit(result, 3)
    assert "null" in result.stderr


# ----------------------------------------------------------------------------------------- CI outputs


def test_junit_xml_one_case_per_rule(dumps, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    rules = ["rollout_corr/kl<=1", "rollout_corr/chi2_token<=1e-9", "diag/ess_token>=0.1", "diag/bogus<=1"]
    args = [a for rule in rules for a in ("--fail-on", rule)]
    result = invoke("check", dumps["bad"], *args, "--junit-xml", junit, "--device", "cpu")
    assert_exit(result, 1)  # the breach wins over the unknown metric
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == rules
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "1")
    assert cases[1].find("failure") is not None and "chi2_token" in cases[1].find("failure").get("message")
    assert cases[3].find("error") is not None
    assert cases[0].find("failure") is None and cases[0].find("error") is None


def test_github_annotations_are_capped_worst_first(dumps, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    limits = [float(10 * k) for k in range(15)]  # valid_tokens far above all of them: k = 0 is the worst
    args = [a for limit in limits for a in ("--fail-on", f"diag/valid_tokens<={limit}")]
    result = invoke("check", dumps["clean"], *args, "--device", "cpu", "-q",
                    env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert_exit(result, 1)
    lines = [line for line in result.stderr.splitlines() if line.startswith("::")]
    errors = [line for line in lines if line.startswith(("::error", "::warning"))]
    assert len(errors) == 10
    assert "diag/valid_tokens<=0.0" in errors[0] and "diag/valid_tokens<=10.0" in errors[1]
    assert any(line.startswith("::notice") and "5 more" in line for line in lines)
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, not overwritten
    assert text.count("diag/valid_tokens<=") == 15 and "| status | rule |" in text
    # -q keeps the requested output (the table, the annotations --github asked for) and drops the verdict note.
    assert "mismatch check: FAIL" not in result.stderr
    assert "diag/valid_tokens<=0.0" in result.stdout


def test_github_off_and_auto(dumps) -> None:
    on = {"GITHUB_ACTIONS": "true"}
    result = invoke("check", dumps["bad"], "--fail-on", "kl<=-1", "--github", "off", "--device", "cpu", env=on)
    assert_exit(result, 1)
    assert "::error" not in result.stderr
    result = invoke("check", dumps["bad"], "--fail-on", "kl<=-1", "--device", "cpu")
    assert "::error" not in result.stderr
    result = invoke("check", dumps["bad"], "--fail-on", "kl<=-1", "--github", "on", "--device", "cpu")
    assert result.stderr.count("::error") == 1


def test_annotation_escaping() -> None:
    result = evaluate([parse_rule("a<=1")], _report({"a": 2.0}), None)
    result.outcomes[0].message = "50% worse\nsee: here, there"
    (line,) = annotations(result)
    assert line == "::error title=mismatch check::a<=1: 50%25 worse%0Asee: here, there"


def test_markdown_and_table_formats(dumps) -> None:
    result = invoke("check", dumps["clean"], "--fail-on", "kl<=1", "--format", "markdown", "--device", "cpu")
    assert_exit(result, 0)
    assert "| rule |" in result.stdout and "**mismatch check: PASS" in result.stdout
    result = invoke("check", dumps["clean"], "--fail-on", "kl<=1", "--device", "cpu")
    assert "kl<=1" in result.stdout and "pass" in result.stdout


def test_report_input_is_not_reanalyzed(dumps, tmp_path: Path) -> None:
    data = json.loads(dumps["baseline"].read_text())
    data["inputs"] = [{**data["inputs"][0], "path": str(tmp_path / "gone.parquet")}]
    report = tmp_path / "r.json"
    report.write_text(json.dumps(data))
    result, body = run_json(report, "--fail-on", "rollout_corr/kl<=1", "--out-dir", tmp_path / "out")
    assert_exit(result, 0)
    assert math.isclose(body["rules"][0]["value"], data["metrics"]["rollout_corr/kl"])
    assert json.loads((tmp_path / "out" / "report.json").read_text())["metrics"] == data["metrics"]
