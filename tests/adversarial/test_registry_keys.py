"""The metric registry covers every key the engine reports, resolves templates, and feeds health and the docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mismatch_cli.answers.health import CHECKS, summarize
from mismatch_cli.cli import app
from mismatch_cli.correction import RS_OPTIONS
from mismatch_cli.metrics import METRICS, Direction, closest, concrete_keys, direction_of, lookup, resolve_name
from mismatch_cli.render.metrics import REGENERATE, render_metrics_markdown
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

ROOT = Path(__file__).resolve().parents[2]
RS = ",".join(RS_OPTIONS)
# Every family, every RS option, IcePop, batch normalization, the veto, mask / both modes, three IS levels.
RUNS = (
    ("--is", "token", "--is-threshold", "0.5_5.0", "--is-batch-normalize", "--rs", RS, "--rs-threshold", "2.0",
     "--by", "step"),
    ("--semantics", "verl-0.8", "--is", "sequence", "--is-threshold", "2.0", "--rs", RS, "--rs-threshold", "2.0"),
    ("--semantics", "verl-0.7.1", "--is", "token", "--is-threshold", "2.0", "--is-batch-normalize", "--rs", RS,
     "--rs-threshold", "2.0"),
    ("--semantics", "verl-0.7.0", "--is", "token", "--is-threshold", "2.0", "--is-batch-normalize", "--rs",
     "geometric", "--rs-threshold", "1.001", "--veto-threshold", "1e-4"),
    ("--semantics", "verl-0.6.1", "--is", "sequence", "--rs", "token", "--rs-threshold", "2.0"),
    ("--semantics", "verl-0.6.0", "--is-level", "token", "--is-mode", "mask", "--is-threshold", "2.0"),
    ("--semantics", "xtuner", "--is-level", "sequence", "--is-mode", "both", "--is-threshold", "2,0.5",
     "--is-mask-threshold", "5,0.2", "--veto-threshold", "20,1e-4"),
    ("--semantics", "xtuner-2025-12", "--is-level", "geometric", "--is-mode", "mask", "--is-threshold", "1.01,0.99"),
    ("--semantics", "trl", "--set", "vllm_importance_sampling_mode=token_truncate"),
    ("--semantics", "skyrl", "--set", "tis_ratio_type=token", "--set", "sequence_mask_metric=geometric", "--set",
     "outlier_token_is_threshold_high=100", "--set", "token_mask_is_threshold_low=0.5", "--set",
     "token_mask_is_threshold_high=2"),
    ("--semantics", "skyrl", "--set", "tis_ratio_type=sequence", "--set", "sequence_mask_metric=product"),
    ("--semantics", "nemo-rl", "--set", "use_importance_sampling_correction=true", "--set",
     "truncated_importance_sampling_type=tis", "--set", "truncated_importance_sampling_ratio=2.0"),
    ("--semantics", "prime-rl"),
    ("--semantics", "areal", "--set", "use_decoupled_loss=true", "--set", "level=sequence", "--set", "upper=1.5"),
    ("--semantics", "slime", "--set", "use_tis=true"),
    ("--semantics", "slime-mis"),
    ("--semantics", "slime-mis", "--set", "tis_mode=clip"),
    ("--semantics", "slime-mis", "--set", "tis_mode=mask"),
    ("--semantics", "openrlhf", "--set", "is_correction_level=token", "--set", "is_correction_mode=clip"),
    ("--semantics", "openrlhf", "--set", "is_correction_level=seq", "--set", "micro_train_batch_size=2"),
    ("--semantics", "ms-swift", "--set", "rollout_importance_sampling_mode=sequence_mask", "--set",
     "per_device_train_batch_size=4"),
    ("--semantics", "miles"),
)


@pytest.fixture(scope="module")
def reported_keys(tmp_path_factory) -> set[str]:
    """Every metric key of every run above, overall and per step, on a small multi-turn dump."""
    dump = tmp_path_factory.mktemp("registry") / "dump.parquet"
    write_synthetic_dump(dump, SynthSpec(tokens=4000, turns=4, seed=3, empty_rows=0.05, mean_length=64, steps=2))
    keys: set[str] = set()
    for args in RUNS:
        result = CliRunner().invoke(app, ["analyze", str(dump), "--format", "json", "--device", "cpu",
                                          "--bootstrap", "0", *args])
        assert result.exit_code == 0, (args, result.output)
        body = json.loads(result.stdout)
        keys |= set(body["metrics"])
        for step in body["steps"]:
            keys |= set(step["metrics"])
    return keys


def test_every_reported_key_is_registered(reported_keys) -> None:
    assert len(reported_keys) > 250  # the runs really cover the families (278 keys with 4 rounds)
    missing = sorted(k for k in reported_keys if lookup(k) is None)
    assert not missing, f"keys the engine reports but the registry (mismatch_cli/metrics) lacks: {missing}"


def test_every_registered_key_is_reported(reported_keys) -> None:
    # The registry holds no stale key: each entry (templates at round 0, every RS option) is produced by some run.
    assert sorted(set(concrete_keys()) - reported_keys) == []


def test_each_key_has_exactly_one_entry() -> None:
    for key in concrete_keys():
        entries = [m for m in METRICS if m.key == key or (m.is_pattern and m.regex().fullmatch(key))]
        assert len(entries) == 1, (key, [m.key for m in entries])


def test_templates_resolve() -> None:
    assert lookup("per_round/round_17_abs_diff_mean").key == "per_round/round_{k}_abs_diff_mean"
    assert lookup("rollout_corr/rollout_rs_seq_mean_k1_mean").direction is Direction.LOWER_ABS  # k1 is signed
    assert lookup("rollout_corr/rollout_rs_seq_max_k3_mean").direction is Direction.LOWER
    assert lookup("rollout_corr/rollout_rs_token_k2_seq_fraction_low") is None  # k1 options only
    assert lookup("rollout_corr/rollout_rs_seq_max_k1_mean") is None  # there is no seq_max_k1
    assert lookup("per_round/round_x_token_count") is None
    assert resolve_name("kl") == "rollout_corr/kl" and resolve_name("kll") is None
    assert closest("kll")[0] == "rollout_corr/kl"
    assert closest("ess_tokn")[0] == "diag/ess_token"


def test_directions_by_hand() -> None:
    expected = {
        "rollout_corr/rollout_is_eff_sample_size": Direction.HIGHER, "diag/ess_token": Direction.HIGHER,
        "diag/ess_seq_kish": Direction.HIGHER, "mismatch/rollout_is_eff_sample_size": Direction.HIGHER,
        "rollout_corr/rollout_is_mean": Direction.CLOSER_TO_1, "rollout_corr/ppl_ratio": Direction.CLOSER_TO_1,
        "rollout_corr/kl": Direction.LOWER_ABS, "mismatch/mismatch_kl": Direction.LOWER_ABS,
        # a signed mean whose ideal is 0; the old suffix rule ("ratio_mean") called it "closer to 1"
        "diag/log_ratio_mean": Direction.LOWER_ABS,
        "rollout_corr/chi2_token": Direction.LOWER, "rollout_corr/rollout_rs_masked_fraction": Direction.LOWER,
        "diag/prob_pearson_corr": Direction.HIGHER, "diag/valid_tokens": Direction.NONE,
        "per_round/round_3_token_count": Direction.NONE, "not/a_metric": Direction.NONE,
    }
    assert {k: direction_of(k) for k in expected} == expected


def test_health_bands_come_from_the_registry() -> None:
    # verl docs/algo/rollout_corr.md: IS mean in [0.5, 2], ESS >= 0.3, std <= 1, |kl| <= 0.1, chi2_token <= 1.
    documented = {"rollout_corr/rollout_is_mean": (0.5, 2.0, False),
                  "rollout_corr/rollout_is_eff_sample_size": (0.3, None, False), "diag/ess_token": (0.3, None, False),
                  "rollout_corr/rollout_is_std": (None, 1.0, False), "rollout_corr/kl": (None, 0.1, True),
                  "rollout_corr/chi2_token": (None, 1.0, False)}
    assert set(CHECKS) == set(documented)
    for key, (low, high, absolute) in documented.items():
        band = lookup(key).band
        assert (band.low, band.high, band.absolute) == (low, high, absolute), key
        assert "rollout_corr.md" in band.source
    summary = summarize({"rollout_corr/kl": -0.2, "mismatch/rollout_is_mean": 3.0, "diag/ess_token": 0.5})
    # The verdict is the health after the IS correction; the raw ratios' ESS belongs to `before`.
    assert [(c["metric"], c["ok"], c["healthy_range"]) for c in summary["checks"]] == [
        ("mismatch/rollout_is_mean", False, "0.5 <= value <= 2.0"),  # an older family's key, the same band
        ("rollout_corr/kl", False, "|value| <= 0.1"),
    ]
    assert [(c["metric"], c["ok"]) for c in summary["before"]["checks"]] == [
        ("diag/ess_token", True), ("rollout_corr/kl", False)]


def test_every_entry_is_complete() -> None:
    for metric in METRICS:
        assert metric.meaning and metric.reduction and metric.unit, metric.key
        assert "\n" not in metric.meaning
        if metric.band is not None:
            assert metric.band.source, metric.key
        if metric.alias_of is not None:
            assert lookup(metric.alias_of) is not None, metric.key


def test_docs_page_is_fresh() -> None:
    page = ROOT / "docs" / "metrics.md"
    expected = render_metrics_markdown(list(METRICS))
    assert page.exists() and page.read_text() == expected, f"docs/metrics.md is stale; regenerate it: {REGENERATE}"
