"""`mismatch metrics`: every key with meaning, reduction, direction, band and source, in three formats."""

from __future__ import annotations

import json

from conftest import assert_clean_failure

from mismatch_cli.metrics import METRICS


def test_json_lists_every_entry(run_mismatch) -> None:
    run = run_mismatch("metrics", "--format", "json")
    assert run.code == 0, run.stderr
    body = json.loads(run.stdout)
    assert body["schema_version"] == 1
    assert [m["key"] for m in body["metrics"]] == [m.key for m in METRICS]
    rows = {m["key"]: m for m in body["metrics"]}
    kl = rows["rollout_corr/kl"]
    assert (kl["direction"], kl["reduction"], kl["band"]["range"]) == ("lower |x|", "token-mean over valid tokens",
                                                                       "|value| <= 0.1")
    assert "rollout_corr.md" in kl["band"]["source"]
    ess = rows["rollout_corr/rollout_is_eff_sample_size"]
    assert (ess["direction"], ess["band"]["low"], ess["band"]["high"]) == ("higher", 0.3, None)
    rs = rows["rollout_corr/rollout_rs_{option}_masked_fraction"]
    assert rs["pattern"] is True and len(rs["placeholders"]["option"]) == 11
    assert rows["per_round/round_{k}_token_count"]["placeholders"] == {"k": None}
    assert all(m["meaning"] and m["reduction"] and m["direction"] for m in body["metrics"])


def test_query_and_formats(run_mismatch) -> None:
    run = run_mismatch("metrics", "rollout_corr/rollout_rs_seq_mean_k1_seq_std", "--format", "json")
    assert run.code == 0, run.stderr
    assert [m["key"] for m in json.loads(run.stdout)["metrics"]] == ["rollout_corr/rollout_rs_{option}_seq_std"]
    run = run_mismatch("metrics", "kl", "--format", "markdown")
    assert run.code == 0 and "| `rollout_corr/kl` |" in run.stdout and "verl docs/algo/rollout_corr.md" in run.stdout
    run = run_mismatch("metrics", "ess", env={"COLUMNS": "120"})
    assert run.code == 0 and "diag/ess_token" in run.stdout and "higher" in run.stdout
    assert "rollout_corr/kl" not in run.stdout


def test_unknown_query_is_a_usage_error(run_mismatch) -> None:
    assert_clean_failure(run_mismatch("metrics", "ess_tokn_x"), 2, "no metric key matches 'ess_tokn_x'",
                         "diag/ess_token")
