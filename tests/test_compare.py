"""`mismatch compare`: marks, verdicts, limits, reports vs dumps, per-round rows, plots and exit codes."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest
from test_check import assert_exit, invoke, make_dump

from mismatch_cli.gate.comparison import HIGHER, LOWER, LOWER_ABS, compare_reports, direction_of
from mismatch_cli.render.compare import render_compare_plots
from mismatch_cli.report import Report


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("compare")
    paths = {"clean": root / "clean.parquet", "bad": root / "bad.parquet", "clean2": root / "clean2.parquet"}
    values = {"clean": make_dump(paths["clean"], 0.01, 1, rows=200), "bad": make_dump(paths["bad"], 0.2, 2, rows=200),
              "clean2": make_dump(paths["clean2"], 0.01, 3, rows=200)}
    reports = {}
    for name, path in paths.items():
        out = root / f"{name}_out"
        assert_exit(invoke("analyze", path, "--out-dir", out, "--no-plots", "--device", "cpu"), 0)
        reports[name] = out / "report.json"
    return {"root": root, "paths": paths, "values": values, "reports": reports}


def compare_json(*args: object) -> tuple[object, dict]:
    result = invoke("compare", *args, "--device", "cpu", "--format", "json")
    return result, json.loads(result.stdout) if result.stdout.strip() else {}


def rows_by_metric(body: dict) -> dict[str, dict]:
    return {row["metric"]: row for row in body["metrics"]}


def test_directions() -> None:
    assert direction_of("rollout_corr/chi2_token") == LOWER
    assert direction_of("diag/ess_token") == HIGHER
    assert direction_of("rollout_corr/rollout_is_eff_sample_size") == HIGHER
    assert direction_of("rollout_corr/ppl_ratio") == "closer to 1"
    assert direction_of("rollout_corr/rollout_is_mean") == "closer to 1"
    assert direction_of("rollout_corr/kl") == LOWER_ABS
    assert direction_of("mismatch/rollout_is_veto_fraction") == LOWER  # a real key: the registry knows no other
    assert direction_of("rollout_corr/rollout_rs_masked_fraction") == LOWER


def test_worse_candidate_is_marked_plus(runs) -> None:
    result, body = compare_json(runs["paths"]["clean"], runs["paths"]["bad"])
    assert_exit(result, 0)  # no limits: a comparison never fails
    rows = rows_by_metric(body)
    chi2 = rows["rollout_corr/chi2_token"]
    assert chi2["base"] == pytest.approx(runs["values"]["clean"]["chi2_token"], rel=1e-4)
    assert chi2["candidate"] == pytest.approx(runs["values"]["bad"]["chi2_token"], rel=1e-4)
    assert chi2["change"] == pytest.approx(chi2["candidate"] - chi2["base"])
    assert chi2["relative_change"] == pytest.approx((chi2["candidate"] - chi2["base"]) / chi2["base"])
    assert chi2["direction"] == "lower is better"
    for key in ("rollout_corr/chi2_token", "rollout_corr/k3_kl", "diag/logprob_abs_diff_mean", "diag/ess_token"):
        assert rows[key]["mark"] == "+", key
        low, high = rows[key]["base_interval"]
        assert low <= rows[key]["base"] <= high
    # The bad dump's own report says BUG (its ratio mean is not 1): the verdict names that first (issue 34).
    assert body["verdict"].startswith("verdict: BUG - the candidate has a bug in its dump or config: ")
    assert "; WORSE - candidate is worse beyond noise on " in body["verdict"] and body["verdict"] in result.stderr
    # The other way round, the same changes are improvements (a clean candidate beating a BUG base still is).
    _, body = compare_json(runs["paths"]["bad"], runs["paths"]["clean"])
    assert rows_by_metric(body)["rollout_corr/chi2_token"]["mark"] == "-"
    assert body["verdict"].startswith("verdict: BUG - the base has a bug in its dump or config: ")
    assert "; BETTER - candidate is better beyond noise on " in body["verdict"]


def test_same_run_is_within_noise(runs) -> None:
    result, body = compare_json(runs["paths"]["clean"], runs["reports"]["clean"])
    assert_exit(result, 0)
    assert {row["mark"] for row in body["metrics"]} == {"~"}
    assert body["verdict"].startswith("verdict: NO SIGNIFICANT CHANGE")
    # Two independent draws of the same process: the intervals overlap on the headline metrics.
    _, body = compare_json(runs["paths"]["clean"], runs["paths"]["clean2"])
    rows = rows_by_metric(body)
    assert rows["rollout_corr/kl"]["mark"] == "~" and rows["rollout_corr/chi2_token"]["mark"] == "~"


def test_reports_give_the_same_table_as_their_dumps(runs) -> None:
    clean, bad = str(runs["paths"]["clean"]), str(runs["paths"]["bad"])
    from_dumps = invoke("compare", clean, bad, "--device", "cpu", "--format", "markdown")
    from_reports = invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "--format", "markdown")
    assert_exit(from_dumps, 0)
    assert_exit(from_reports, 0)
    # Everything but the title (which names the arguments) is identical, intervals included.
    assert from_dumps.stdout.splitlines()[1:] == from_reports.stdout.splitlines()[1:]
    _, a = compare_json(clean, bad)
    _, b = compare_json(runs["reports"]["clean"], runs["reports"]["bad"])
    assert a["metrics"] == b["metrics"] and a["verdict"] == b["verdict"]


def test_one_side_only_is_marked_x(runs, tmp_path: Path) -> None:
    out = tmp_path / "is"
    assert_exit(invoke("analyze", runs["paths"]["bad"], "--is", "token", "--out-dir", out, "--no-plots",
                       "--device", "cpu"), 0)
    result, body = compare_json(runs["reports"]["clean"], out / "report.json")
    assert_exit(result, 0)
    rows = rows_by_metric(body)
    assert rows["rollout_corr/rollout_is_mean"]["mark"] == "x"
    assert rows["rollout_corr/rollout_is_mean"]["base"] is None
    assert any("different corrections" in note for note in body["notes"])


def test_another_trainers_semantics_is_named_first(runs, tmp_path: Path) -> None:
    out = tmp_path / "trl"
    assert_exit(invoke("analyze", runs["paths"]["bad"], "--semantics", "trl", "--out-dir", out, "--no-plots",
                       "--device", "cpu"), 0)
    result, body = compare_json(runs["reports"]["clean"], out / "report.json")
    assert_exit(result, 0)
    note = next(note for note in body["notes"] if "different corrections" in note)
    assert "(semantics: 'verl' vs 'trl'," in note


def test_correction_flags_apply_to_dump_sides_only(runs) -> None:
    result, body = compare_json(runs["paths"]["clean"], runs["reports"]["bad"], "--is", "token")
    assert_exit(result, 0)
    is_mean = rows_by_metric(body)["rollout_corr/rollout_is_mean"]
    assert is_mean["base"] is not None and is_mean["mark"] == "x"
    assert any("correction flags do not apply to a report" in note for note in body["notes"])


def test_limits_mark_and_exit(runs) -> None:
    result, body = compare_json(runs["reports"]["clean"], runs["reports"]["bad"], "--fail-on",
                                "rollout_corr/chi2_token:+10%", "--fail-on", "rollout_corr/kl<=1")
    assert_exit(result, 1)
    assert rows_by_metric(body)["rollout_corr/chi2_token"]["mark"] == "!"
    assert body["verdict"].startswith("verdict: FAIL")
    assert [r["status"] for r in body["check"]["rules"]] == ["fail", "pass"]
    result, _ = compare_json(runs["reports"]["clean"], runs["reports"]["clean2"], "--fail-on", "kl<=1")
    assert_exit(result, 0)


def test_limits_from_config(runs, tmp_path: Path) -> None:
    config = tmp_path / "mismatch.toml"
    config.write_text('[check]\nfail_on = ["diag/ess_token:-1%"]\n')
    result = invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "--config", config)
    assert_exit(result, 1)
    assert "Limits" in result.stdout


def test_without_intervals_changes_are_judged_by_direction(runs) -> None:
    result, body = compare_json(runs["paths"]["clean"], runs["paths"]["clean2"], "--bootstrap", "0")
    assert_exit(result, 0)
    assert all(row["base_interval"] is None for row in body["metrics"])
    assert {row["mark"] for row in body["metrics"]} <= {"+", "-", "~", "="}
    for row in body["metrics"]:  # "=": a change smaller than the metric's minimal practical difference
        if row["mark"] == "=":
            assert abs(row["candidate"] - row["base"]) < row["min_difference"]
        elif row["mark"] in "+-" and row["min_difference"] is not None:
            assert abs(row["candidate"] - row["base"]) >= row["min_difference"]
    assert any("no bootstrap intervals" in note for note in body["notes"])


def test_exit_codes_for_bad_input_and_rules(runs, tmp_path: Path) -> None:
    assert_exit(invoke("compare", runs["paths"]["clean"], tmp_path / "absent.parquet"), 3)
    assert_exit(invoke("compare", runs["reports"]["clean"], tmp_path / "absent.json"), 3)
    empty = json.loads(runs["reports"]["clean"].read_text())
    empty["metrics"] = {"diag/sequences": 1.0}
    (tmp_path / "empty.json").write_text(json.dumps(empty))
    result = invoke("compare", runs["reports"]["clean"], tmp_path / "empty.json")
    assert_exit(result, 3)
    assert "nothing to compare" in result.stderr
    assert_exit(invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "--fail-on", "kl<>1"), 2)
    assert_exit(invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "--bootstrap", "-1"), 2)


def test_table_shows_marks_and_intervals(runs) -> None:
    result = invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], env={"COLUMNS": "120"})
    assert_exit(result, 0)
    lines = result.stdout.splitlines()
    chi2 = next(line for line in lines if " chi2_token " in line)
    assert chi2.startswith("+")
    assert "lower" in chi2
    assert "marks: + worse" in result.stdout
    assert "verdict:" not in result.stdout and "; WORSE - candidate is worse" in result.stderr  # after the BUG
    # -q: the requested output (the table) and errors only; no verdict or notes on stderr.
    quiet = invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "-q")
    assert "marks: + worse" in quiet.stdout and quiet.stderr == ""


def test_out_dir_files(runs, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = invoke("compare", runs["paths"]["clean"], runs["reports"]["bad"], "--out-dir", out, "--device", "cpu")
    assert_exit(result, 0)
    names = {p.name for p in out.iterdir()}
    assert {"compare.json", "compare.md", "base_report.json", "compare_metrics.png"} <= names
    assert "candidate_report.json" not in names  # the candidate was a report already
    assert json.loads((out / "compare.json").read_text())["verdict"].startswith("verdict:")
    assert Report.load(out / "base_report.json").intervals
    page = (out / "compare.html").read_text()
    body = json.loads((out / "compare.json").read_text())
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page and "https://" not in page
    assert page.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])
    assert html.escape(body["verdict"]) in page
    assert all(html.escape(row["metric"]) in page for row in body["metrics"])


def test_no_plots_skips_the_page(runs, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert_exit(invoke("compare", runs["reports"]["clean"], runs["reports"]["bad"], "--out-dir", out, "--no-plots"), 0)
    assert {p.name for p in out.iterdir()} == {"compare.json", "compare.md"}


def test_per_round_comparison_and_plots(tmp_path: Path) -> None:
    for name, noise, seed in (("a", 1.0, 1), ("b", 1.5, 2)):
        result = invoke("synth", tmp_path / f"{name}.parquet", "--turns", "3", "--tokens", "20000", "--noise", noise,
                        "--seed", seed)
        assert_exit(result, 0)
    out = tmp_path / "out"
    result, body = compare_json(tmp_path / "a.parquet", tmp_path / "b.parquet", "--out-dir", out)
    assert_exit(result, 0)
    assert [r["round"] for r in body["rounds"]][:3] == [0, 1, 2]
    base_rounds = Report.load(out / "base_report.json").rounds
    assert body["rounds"][0]["base"]["abs_diff_mean"] == base_rounds[0]["abs_diff_mean"]
    assert {"compare_metrics.png", "compare_rounds.png"} <= {p.name for p in out.iterdir()}
    markdown = invoke("compare", out / "base_report.json", out / "candidate_report.json", "--format", "markdown")
    assert "### Per round" in markdown.stdout


def test_overlaid_histogram_plot(tmp_path: Path) -> None:
    def report(scale: float) -> Report:
        counts = (np.array([5, 40, 100, 30, 2]) * scale).astype(int).tolist()
        return Report(tool={}, created_at="", inputs=[], config={}, metrics={"rollout_corr/kl": 0.01 * scale},
                      histograms={"log_ratio": {"edges": [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0], "negative": counts,
                                                "positive": counts, "zero": 3}})
    base, candidate = report(1.0), report(2.0)
    written = render_compare_plots(compare_reports(base, candidate), base, candidate)
    assert "compare_log_ratio_hist.png" in written
    assert all(data.startswith(b"\x89PNG") and len(data) > 1000 for data in written.values())
