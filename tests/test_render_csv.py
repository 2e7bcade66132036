"""CSV of the per-step, per-group and per-round tables: stable columns, full-precision numbers, empty for null."""

from __future__ import annotations

import csv
import io

import pytest

from mismatch_cli.render.csv import default_csv_table, ordered_columns, render_csv, render_csv_tables
from mismatch_cli.report import Report

KL, CHI2, ESS = "rollout_corr/kl", "rollout_corr/chi2_token", "diag/ess_token"


def entry(key: str, label: object, metrics: dict) -> dict:
    return {key: label, "valid_tokens": 1000, "metrics": metrics, "rounds": [], "notes": []}


def make_report() -> Report:
    # Metric order differs between entries and from the registry's (kl, ..., chi2_token, ..., diag/ess_token).
    steps = [entry("step", 3, {ESS: 0.9876543210987654, KL: -1.2345678901234567e-05, CHI2: None}),
             entry("step", 10, {KL: 0.1 + 0.2, CHI2: 123456789.12345679, ESS: 1.0})]
    groups = {"env_name": [entry("group", "math", {CHI2: 0.5, KL: 1e-300}), entry("group", "code, v2", {KL: 2.5})]}
    rounds = [{"round": 0, "rows": 64.0, "tokens": 36551.0, "abs_diff_mean": 0.00354385293117323, "kl": None},
              {"round": 1, "rows": 60.0, "tokens": 24269.0, "abs_diff_mean": 0.004278, "kl": -0.001}]
    return Report(tool={"name": "mismatch", "version": "test"}, created_at="2026-01-01T00:00:00+00:00", inputs=[],
                  config={}, metrics={KL: 0.0}, steps=steps, groups=groups, rounds=rounds)


def parse(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_steps_csv_has_stable_columns_and_exact_numbers() -> None:
    rows = parse(render_csv(make_report(), "steps"))
    assert rows[0] == ["step", "valid_tokens", KL, CHI2, ESS]  # labels, then the registry's order
    assert rows[1] == ["3", "1000", repr(-1.2345678901234567e-05), "", "0.9876543210987654"]
    assert float(rows[1][2]) == -1.2345678901234567e-05  # reads back to the same float
    assert float(rows[2][2]) == 0.1 + 0.2 and rows[2][2] == "0.30000000000000004"  # not rounded
    assert float(rows[2][3]) == 123456789.12345679


def test_groups_csv_quotes_labels_and_keeps_tiny_numbers() -> None:
    rows = parse(render_csv(make_report(), "groups"))
    assert rows[0] == ["column", "group", "valid_tokens", KL, CHI2]
    assert rows[1] == ["env_name", "math", "1000", "1e-300", "0.5"]
    assert rows[2] == ["env_name", "code, v2", "1000", "2.5", ""]  # a comma in a label survives
    assert '"code, v2"' in render_csv(make_report(), "groups")


def test_rounds_csv() -> None:
    text = render_csv(make_report(), "rounds")
    rows = parse(text)
    assert rows[0][0] == "round" and set(rows[0]) == {"round", "rows", "tokens", "abs_diff_mean", "kl"}
    record = dict(zip(rows[0], rows[1], strict=True))
    assert record["abs_diff_mean"] == "0.00354385293117323" and record["kl"] == "" and record["tokens"] == "36551"
    assert text.endswith("\n") and "\r" not in text


def test_which_tables_exist() -> None:
    report = make_report()
    assert sorted(render_csv_tables(report)) == ["groups.csv", "rounds.csv", "steps.csv"]
    assert default_csv_table(report) == "steps"
    report.steps = []
    assert default_csv_table(report) == "groups" and "steps.csv" not in render_csv_tables(report)
    report.groups = {}
    assert default_csv_table(report) == "rounds"
    with pytest.raises(KeyError):
        render_csv(report, "nope")


def test_template_keys_sort_by_their_number() -> None:
    columns = ["per_round/round_10_abs_diff_mean", "per_round/round_2_abs_diff_mean", "zzz", "step"]
    assert ordered_columns(columns) == ["step", "per_round/round_2_abs_diff_mean",
                                        "per_round/round_10_abs_diff_mean", "zzz"]


def test_labels_with_any_text_read_back_and_infinities_are_empty(tmp_path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from mismatch_cli.cli import app
    from mismatch_cli.render.csv import cell

    labels = ["a\rb", "\x1b[31mred", 'q"uote, comma', "line\nbreak"]
    old = [np.linspace(-2, -0.1, 10).astype(np.float32)] * len(labels)
    pq.write_table(pa.table({"old_log_probs": pa.array(old, pa.list_(pa.float32())),
                             "rollout_log_probs": pa.array([o - 0.01 for o in old], pa.list_(pa.float32())),
                             "response_mask": pa.array([np.ones(10, np.int8)] * len(labels), pa.list_(pa.int8())),
                             "env": labels}), tmp_path / "d.parquet")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "d.parquet"), "--by", "env", "--format", "csv",
                                      "--table", "groups", "-q", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout, newline="")))
    assert sorted(row[1] for row in rows[1:]) == sorted(labels)
    assert cell(float("inf")) == cell(float("-inf")) == cell(float("nan")) == ""
