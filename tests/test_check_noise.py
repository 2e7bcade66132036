"""`check` is noise-aware: a relative rule past its limit by a change within noise is held back, not failed.

Repeats of one healthy synthetic setting (`mismatch synth --seed N`, same other settings) must pass the
README's rules; real regressions (4x the noise, 100x the catastrophic tokens) must still fail them.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from itertools import permutations
from pathlib import Path

import pytest
from test_check import assert_exit, invoke

import mismatch_cli
from mismatch_cli.gate.thresholds import evaluate, parse_rule
from mismatch_cli.report import Report
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 30_000
HEALTHY = range(6)
CHI2, KL, ABS_DIFF = "rollout_corr/chi2_token", "rollout_corr/kl", "diag/logprob_abs_diff_mean"
OLD_README_RULE = "rollout_corr/chi2_token:+10%"  # the README's relative rule before check knew about noise


def readme_rules() -> list[str]:
    """The --fail-on rules of the README's `mismatch check` example."""
    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("mismatch check "))
    rules = re.findall(r'--fail-on "([^"]+)"', line)
    assert rules and any(parse_rule(rule).relative for rule in rules), line
    return rules


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Report]:
    root = tmp_path_factory.mktemp("noise")
    specs = {f"seed{seed}": SynthSpec(tokens=TOKENS, seed=seed) for seed in HEALTHY}
    specs["noise4"] = SynthSpec(tokens=TOKENS, seed=11, noise=4.0)
    specs["catastrophic"] = SynthSpec(tokens=TOKENS, seed=13, catastrophic_rate=2e-3)  # 100x the default
    made = {}
    here = Path.cwd()
    os.chdir(root)  # relative input paths: the bootstrap's weights hash the path, so they must not vary by run
    try:
        for name, spec in specs.items():
            write_synthetic_dump(root / f"{name}.parquet", spec)
            made[name] = mismatch_cli.analyze([f"{name}.parquet"], device="cpu")
            (root / f"{name}.json").write_text(made[name].to_json())
    finally:
        os.chdir(here)
    made["root"] = root  # type: ignore[assignment]
    return made


def healthy_pairs(reports: dict) -> list[tuple[Report, Report]]:
    return [(reports[f"seed{b}"], reports[f"seed{c}"]) for b, c in permutations(HEALTHY, 2)]


def test_repeats_of_a_healthy_run_pass_the_readme_rules(reports) -> None:
    rules = [parse_rule(rule) for rule in readme_rules()]
    results = [evaluate(rules, candidate, baseline) for baseline, candidate in healthy_pairs(reports)]
    assert [r.exit_code for r in results] == [0] * 30, [r.verdict() for r in results if r.exit_code]


def test_the_old_readme_rule_failed_on_noise_and_is_now_held_back(reports) -> None:
    rule = parse_rule(OLD_README_RULE)
    outcomes = [evaluate([rule], candidate, baseline).outcomes[0] for baseline, candidate in healthy_pairs(reports)]
    values = [reports[f"seed{seed}"].metrics[CHI2] for seed in HEALTHY]
    assert max(values) / min(values) > 1e4  # one catastrophic token in 30k makes chi2 span decades
    past = [o for o in outcomes if o.value > o.bound]  # what the rule failed when the value alone decided
    assert len(past) >= 10
    assert {o.status for o in past} == {"held"} and {o.status for o in outcomes} <= {"pass", "held"}
    assert all("within noise: the 95 % intervals" in o.message and "overlap" in o.message for o in past)
    assert all(o.interval and o.baseline_interval for o in past)


@pytest.mark.parametrize("regression", ["noise4", "catastrophic"])
def test_a_real_regression_still_fails_against_every_healthy_baseline(reports, regression: str) -> None:
    rules = [parse_rule(rule) for rule in readme_rules()]
    for seed in HEALTHY:
        result = evaluate(rules, reports[regression], reports[f"seed{seed}"])
        assert result.exit_code == 1, result.verdict()
        worst = result.breaches[0]
        assert "beyond noise: the 95 % intervals" in worst.message and "do not overlap" in worst.message
        assert "minimal practical difference" in worst.message


def test_abs_form_catches_what_the_signed_rule_misses(reports) -> None:
    base, candidate = reports["seed0"], reports["catastrophic"]
    signed, magnitude = evaluate([parse_rule(f"{KL}:-50%"), parse_rule(f"abs({KL}):+50%")], candidate, base).outcomes
    assert signed.warnings and f"abs({KL}):-50%" in signed.warnings[0]
    assert abs(candidate.metrics[KL]) > 4 * abs(base.metrics[KL])
    assert magnitude.status == "fail" and not magnitude.warnings
    assert magnitude.value == pytest.approx(abs(candidate.metrics[KL]))


# ------------------------------------------------------------------------------------- the rule by hand


def _report(metrics: dict, intervals: dict | None = None) -> Report:
    return Report(tool={}, created_at="", inputs=[], config={}, metrics=metrics, intervals=intervals or {})


@pytest.mark.parametrize(("base_interval", "candidate_interval", "status"), [
    ([0.8, 1.2], [1.1, 1.6], "held"),  # overlapping intervals: within noise
    ([0.9, 1.1], [1.2, 1.4], "fail"),  # apart: a real change
    (None, [1.1, 1.6], "fail"),  # no interval on one side: the value decides, as before
])
def test_intervals_decide_a_relative_breach(base_interval, candidate_interval, status) -> None:
    base = _report({CHI2: 1.0}, {CHI2: base_interval} if base_interval else {})
    candidate = _report({CHI2: 1.3}, {CHI2: candidate_interval})
    outcome = evaluate([parse_rule(f"{CHI2}:+10%")], candidate, base).outcomes[0]
    assert outcome.status == status
    assert outcome.bound == pytest.approx(1.1) and outcome.min_difference == pytest.approx(0.1)


def test_a_change_below_the_minimal_practical_difference_is_held() -> None:
    # chi2's minimal practical difference is 10 % of |base|: +5 % is past a +1 % rule but too small to matter.
    outcome = evaluate([parse_rule(f"{CHI2}:+1%")], _report({CHI2: 1.05}), _report({CHI2: 1.0})).outcomes[0]
    assert outcome.status == "held" and "below the minimal practical difference" in outcome.message
    assert "+0.05 is smaller than 0.1" in outcome.message


def test_absolute_limits_ignore_intervals() -> None:
    candidate = _report({CHI2: 1.3}, {CHI2: [0.1, 9.0]})
    outcome = evaluate([parse_rule(f"{CHI2}<=1")], candidate, None).outcomes[0]
    assert outcome.status == "fail" and outcome.interval is None


def test_abs_rules_use_the_interval_of_the_magnitude() -> None:
    base = _report({KL: -0.001}, {KL: [-0.0012, -0.0008]})
    candidate = _report({KL: 0.0005}, {KL: [-0.0011, 0.002]})  # |kl| in [0, 0.002]: overlaps [0.0008, 0.0012]
    outcome = evaluate([parse_rule(f"abs({KL}):-10%")], candidate, base).outcomes[0]
    assert outcome.status == "held" and outcome.interval == [0.0, 0.002]
    assert outcome.baseline_interval == pytest.approx([0.0008, 0.0012])


@pytest.mark.parametrize(("rule", "base", "value", "warned"), [
    (f"{KL}:+50%", -0.001, -0.004, True),  # kl is signed (lower |x|): |kl| grew 4x and the rule passes
    (f"abs({KL}):+50%", -0.001, -0.0011, False),
    (f"{KL}<=0.01", -0.001, -0.004, False),  # absolute limits are unchanged
    ("diag/ess_token:-5%", -0.5, 0.9, True),  # a metric that is negative here
    ("diag/ess_token:-5%", 0.95, 0.9, False),
])
def test_relative_rules_on_signed_metrics_warn(rule: str, base: float, value: float, warned: bool) -> None:
    metric = parse_rule(rule).metric
    outcome = evaluate([parse_rule(rule)], _report({metric: value}), _report({metric: base})).outcomes[0]
    assert bool(outcome.warnings) is warned
    if warned:
        assert f"abs({metric}):" in outcome.warnings[0] and "holds the signed value" in outcome.warnings[0]


def test_scoped_relative_rules_warn_with_the_scoped_abs_form() -> None:
    def steps(kls: list[float]) -> Report:
        report = _report({KL: kls[0]})
        report.steps = [{"step": i, "valid_tokens": 10, "metrics": {KL: kl}, "rounds": [], "notes": []}
                        for i, kl in enumerate(kls)]
        return report

    outcome = evaluate([parse_rule("max(step:kl):+10%")], steps([-0.01, -0.02]), steps([-0.001, -0.002])).outcomes[0]
    assert outcome.status == "pass" and "max(step:abs(kl)):+10%" in outcome.warnings[0]


# ---------------------------------------------------------------------------------------- the command


def test_the_command_says_why_a_rule_was_held_back(reports, tmp_path: Path) -> None:
    root = reports["root"]
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    args = ("check", root / "seed5.json", "--baseline", root / "seed0.json", "--fail-on", OLD_README_RULE,
            "--fail-on", f"{KL}:+50%", "--junit-xml", junit, "--github", "on")
    result = invoke(*args, "--format", "json", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert_exit(result, 0)
    chi2, kl = json.loads(result.stdout)["rules"]
    assert chi2["status"] == "held" and chi2["held_back"] is True and chi2["value"] > chi2["bound"]
    assert chi2["interval"] and chi2["baseline_interval"] and chi2["min_difference"] > 0
    assert "held back, within noise" in chi2["message"]
    assert kl["warnings"] and f"abs({KL}):+50%" in kl["warnings"][0]
    assert "held back as noise" in result.stderr and "1 with a warning" in result.stderr
    assert f"::notice title=mismatch check::{OLD_README_RULE}" in result.stderr
    assert f"::warning title=mismatch check::{KL}:+50%" in result.stderr
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert cases[0].find("failure") is None and cases[0].find("properties/property").get("name") == "held_back"
    assert "abs(" in cases[1].find("system-err").text
    assert "held (noise)" in summary.read_text()
    table = invoke(*args[:-4], "--github", "off", env={"COLUMNS": "100"})
    assert_exit(table, 0)
    assert f"held: {OLD_README_RULE}: " in table.stdout and f"warning: {KL}:+50%: " in table.stdout
