"""Check rules on magnitudes (`abs(kl)<=X`) and rule names checked against the metric registry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mismatch_cli.errors import UsageError
from mismatch_cli.gate.thresholds import evaluate, load_check_config, parse_rule
from mismatch_cli.report import Report

K1 = -0.02  # rollout − old on every token: a k1 KL of −0.02, larger in size than 0.01


def _report(metrics: dict) -> Report:
    return Report(tool={}, created_at="", inputs=[], config={}, metrics=metrics)


def test_parse_abs_rules() -> None:
    for text in ("abs(rollout_corr/kl)<=0.01", "abs( kl ) <= 0.01", " abs(kl)<=1e-2"):
        rule = parse_rule(text)
        assert (rule.magnitude, rule.op, rule.value, rule.relative) == (True, "<=", 0.01, False), text
        assert rule.metric in ("rollout_corr/kl", "kl")
    relative = parse_rule("abs(kl):+10%")
    assert (relative.magnitude, relative.op, relative.percent) == (True, "+", True)
    assert parse_rule("kl<=0.01").magnitude is False
    assert parse_rule("abs(kl)<=0.01").describe() == "|kl| <= 0.01"
    for bad in ("abs(kl<=0.01", "abs()<=1", "abs(kl)", "abs(kl)) <= 1", "abs(abs(kl))<=1"):
        with pytest.raises(UsageError):
            parse_rule(bad)


def test_abs_catches_a_negative_k1_that_a_signed_rule_lets_pass() -> None:
    report = _report({"rollout_corr/kl": K1})
    signed, magnitude = evaluate([parse_rule("kl<=0.01"), parse_rule("abs(kl)<=0.01")], report, None).outcomes
    assert (signed.status, magnitude.status) == ("pass", "fail")
    assert magnitude.value == pytest.approx(0.02) and magnitude.metric == "rollout_corr/kl"
    assert magnitude.message.startswith("|rollout_corr/kl| = 0.02 breaches <= 0.01")
    # Relative to a baseline, abs() compares sizes: |−0.02| against |0.015| + 10 %.
    base = _report({"rollout_corr/kl": 0.015})
    (outcome,) = evaluate([parse_rule("abs(kl):+10%")], report, base).outcomes
    assert outcome.status == "fail" and outcome.bound == pytest.approx(0.0165)
    (outcome,) = evaluate([parse_rule("abs(kl):+50%")], report, base).outcomes
    assert outcome.status == "pass"


def _negative_k1_dump(path: Path) -> None:
    rng = np.random.default_rng(11)
    rollout = -rng.exponential(0.5, size=(40, 10))
    old = rollout - K1  # rollout − old = K1 on every valid token
    pq.write_table(pa.table({
        "old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
        "response_mask": pa.array(np.ones((40, 10), dtype=np.int8).tolist(), type=pa.list_(pa.int8())),
    }), path)


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "neg_k1.parquet"
    _negative_k1_dump(path)
    return path


def test_cli_abs_rule_in_flags_and_config(run_mismatch, dump: Path, tmp_path: Path) -> None:
    run = run_mismatch("check", dump, "--fail-on", "kl<=0.01", "--device", "cpu", "--bootstrap", "0")
    assert run.code == 0, run.stderr  # the signed rule cannot fail on a negative k1
    run = run_mismatch("check", dump, "--fail-on", "abs(kl)<=0.01", "--format", "json", "--device", "cpu",
                       "--bootstrap", "0")
    assert run.code == 1, run.stderr
    (rule,) = json.loads(run.stdout)["rules"]
    assert (rule["rule"], rule["metric"], rule["status"]) == ("abs(kl)<=0.01", "rollout_corr/kl", "fail")
    assert rule["value"] == pytest.approx(-K1, rel=1e-4)
    config = tmp_path / "mismatch.toml"
    config.write_text('[check]\nfail_on = ["abs(rollout_corr/kl)<=0.01"]\n')
    assert [r.magnitude for r in load_check_config(config).rules] == [True]
    run = run_mismatch("check", dump, "--config", config, "--device", "cpu", "--bootstrap", "0")
    assert run.code == 1 and "|rollout_corr/kl| = 0.02" in run.stderr, run.stderr


def test_unknown_metric_suggests_the_closest_registered_key() -> None:
    report = _report({"rollout_corr/kl": 0.0, "diag/ess_token": 1.0})
    (outcome,) = evaluate([parse_rule("kll<=0.01")], report, None).outcomes
    assert outcome.status == "error" and outcome.exit_code == 2
    assert "unknown metric" in outcome.message and "did you mean rollout_corr/kl" in outcome.message
    # A registered key the report lacks (RS keys of a run without RS) is named as such, with when it is reported.
    (outcome,) = evaluate([parse_rule("rollout_corr/rollout_rs_token_k3_masked_fraction<=0.1")], report, None).outcomes
    assert outcome.status == "error" and "unknown metric" not in outcome.message
    assert "rejection sampling per option" in outcome.message and "--rs" in outcome.message


def test_pattern_keys_are_accepted() -> None:
    report = _report({"per_round/round_3_abs_diff_mean": 0.2, "per_round/round_3_token_count": 10.0})
    outcomes = evaluate([parse_rule("per_round/round_3_abs_diff_mean<=0.1"),
                         parse_rule("per_round/round_7_abs_diff_mean<=0.1")], report, None, "warn").outcomes
    assert outcomes[0].status == "fail"
    assert outcomes[1].status == "warn" and "per round" in outcomes[1].message
    assert "unknown metric" not in outcomes[1].message


def test_cli_unknown_metric_message(run_mismatch, dump: Path) -> None:
    run = run_mismatch("check", dump, "--fail-on", "ess_tokn>=0.5", "--device", "cpu", "--bootstrap", "0")
    assert run.code == 2
    assert "unknown metric ess_tokn" in run.stderr and "did you mean diag/ess_token" in run.stderr
    assert "Traceback" not in run.stderr
