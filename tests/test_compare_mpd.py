"""`compare` with a minimal practical difference (MPD) per metric: registry defaults and caller overrides."""

from __future__ import annotations

import pytest

from mismatch_cli.errors import UsageError
from mismatch_cli.gate.comparison import (
    BETTER,
    NOISE,
    SAME,
    WORSE,
    compare_reports,
    min_difference_of,
    parse_min_differences,
)
from mismatch_cli.gate.thresholds import parse_rule
from mismatch_cli.metrics import METRICS
from mismatch_cli.report import Report

KL, CHI2, ESS, PPL = "rollout_corr/kl", "rollout_corr/chi2_token", "diag/ess_token", "rollout_corr/ppl_ratio"
IS_MEAN, VETO = "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_veto_fraction"


def report(metrics: dict[str, float], steps: list[tuple[int, float]] | None = None) -> Report:
    """A hand-made report without intervals: changes are judged by direction and MPD alone."""
    return Report(tool={"name": "mismatch", "version": "test"}, created_at="2026-01-01T00:00:00+00:00", inputs=[],
                  config={}, metrics=metrics,
                  steps=[{"step": s, "valid_tokens": 10, "metrics": {KL: v}, "rounds": [], "notes": []}
                         for s, v in steps or []])


def marks(base: dict, candidate: dict, **kwargs) -> dict[str, str]:
    return {r.metric: r.mark for r in compare_reports(report(base), report(candidate), **kwargs).rows}


def test_headline_metrics_have_defaults() -> None:
    defaults = {m.key: (m.practical_difference, m.practical_relative) for m in METRICS}
    for key in (KL, "rollout_corr/k3_kl", CHI2, "rollout_corr/chi2_seq", "rollout_corr/log_ppl_abs_diff",
                "diag/logprob_abs_diff_mean"):
        assert defaults[key] == (0.10, True), key
    assert defaults[PPL] == (0.001, False)
    assert defaults[IS_MEAN] == defaults["rollout_corr/rollout_is_std"] == (0.01, False)
    assert defaults["rollout_corr/rollout_is_eff_sample_size"] == defaults[ESS] == (0.01, False)
    for key in (VETO, "rollout_corr/rollout_is_catastrophic_token_fraction", "rollout_corr/rollout_rs_masked_fraction",
                "rollout_corr/rollout_rs_seq_masked_fraction"):
        assert defaults[key] == (0.001, False), key
    assert defaults["mismatch/mismatch_kl"] == defaults[KL]  # the older family's key: the same quantity


def test_a_change_inside_the_default_is_same_never_worse() -> None:
    # chi2: 0.50 -> 0.54 is +8 % (< 10 % of |base|); ESS 0.900 -> 0.895 is -0.005 (< 0.01): both "=".
    got = marks({CHI2: 0.50, ESS: 0.900, KL: -0.0010}, {CHI2: 0.54, ESS: 0.895, KL: -0.0012})
    assert got[CHI2] == SAME and got[ESS] == SAME
    assert got[KL] == WORSE  # |kl| grew by 20 % of |base| (> 10 %)
    got = marks({CHI2: 0.50, ESS: 0.900}, {CHI2: 0.56, ESS: 0.880})
    assert got[CHI2] == WORSE and got[ESS] == WORSE  # +12 %, -0.02: beyond the defaults
    assert marks({PPL: 0.9990}, {PPL: 0.9995})[PPL] == SAME  # 0.0005 < 0.001
    assert marks({PPL: 0.9900}, {PPL: 0.9990})[PPL] == BETTER


def test_min_difference_is_in_the_unit_or_relative() -> None:
    assert min_difference_of(CHI2, 0.5) == pytest.approx(0.05)
    assert min_difference_of(CHI2, -2.0) == pytest.approx(0.2)  # of |base|
    assert min_difference_of(ESS, 0.3) == pytest.approx(0.01)
    assert min_difference_of("diag/valid_tokens", 10.0) is None  # a count: every change counts


def test_caller_overrides_per_metric() -> None:
    base, cand = {CHI2: 0.50, ESS: 0.900}, {CHI2: 0.54, ESS: 0.895}
    got = marks(base, cand, min_difference={"chi2_token": "5%", ESS: 0.001})  # 8 % > 5 %; 0.005 > 0.001
    assert got[CHI2] == WORSE and got[ESS] == WORSE
    got = marks(base, {CHI2: 0.60, ESS: 0.85}, min_difference={"chi2_token": 0.2, ESS: "10%"})
    assert got[CHI2] == SAME and got[ESS] == SAME  # 0.1 < 0.2 absolute; 0.05 < 10 % of 0.9
    got = marks(base, cand, min_difference={"chi2_token": None, ESS: "none"})  # no minimum at all
    assert got[CHI2] == WORSE and got[ESS] == WORSE
    rows = compare_reports(report(base), report(cand), min_difference={"chi2_token": "5%"}).rows
    assert {r.metric: r.to_dict()["min_difference"] for r in rows}[CHI2] == pytest.approx(0.025)


def test_overrides_reach_the_older_family_alias() -> None:
    old = "mismatch/mismatch_kl"
    assert marks({old: 0.010}, {old: 0.0108})[old] == SAME  # +8 %
    assert marks({old: 0.010}, {old: 0.0108}, min_difference={"kl": "1%"})[old] == WORSE


def test_noise_and_breaches_come_first() -> None:
    base, cand = report({CHI2: 0.50}), report({CHI2: 0.90})
    base.intervals[CHI2], cand.intervals[CHI2] = [0.1, 1.0], [0.5, 1.2]
    assert compare_reports(base, cand).rows[0].mark == NOISE  # overlapping intervals: within noise
    rule = parse_rule("chi2_token<=0.51")
    small = report({CHI2: 0.52})
    assert compare_reports(report({CHI2: 0.50}), small, rules=[rule]).rows[0].mark == "!"


def test_the_verdict_counts_practically_unchanged_rows() -> None:
    comparison = compare_reports(report({CHI2: 0.50, ESS: 0.9}), report({CHI2: 0.52, ESS: 0.8}))
    assert comparison.verdict().startswith("verdict: WORSE")
    assert "1 below the practical difference" in comparison.verdict()


def test_scoped_rules_do_not_mark_the_overall_row() -> None:
    base = report({KL: 0.001}, steps=[(1, 0.001)])
    cand = report({KL: 0.001}, steps=[(1, 0.02)])
    result = compare_reports(base, cand, rules=[parse_rule("max(step:abs(kl))<=0.01")])
    assert result.check is not None and result.check.exit_code == 1
    assert {r.metric: r.mark for r in result.rows}[KL] == NOISE  # equal overall values; the breach is per step


def test_parse_min_differences_from_flags() -> None:
    assert parse_min_differences(["kl=1e-4", "chi2_token = 5%"]) == {"kl": "1e-4", "chi2_token": "5%"}
    for bad, needle in (("kl", "cannot read"), ("kll=0.1", "unknown metric"), ("kl=-1", ">= 0"),
                        ("kl=abc", "must be a number")):
        with pytest.raises(UsageError) as caught:
            parse_min_differences([bad])
        assert needle in str(caught.value) and "fix:" in str(caught.value)
