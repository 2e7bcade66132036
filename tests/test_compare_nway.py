"""`mismatch compare A B C`: three precision-like arms side by side, best and worst per metric, each arm's
numbers equal to its own `analyze` and to float64 numpy, independent of the order of the arms."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from test_check import assert_exit, invoke

from mismatch_cli.errors import DataError, UsageError
from mismatch_cli.gate.api import compare_many
from mismatch_cli.gate.nway import DIFFER, MISSING, NOISE, SAME, compare_runs, default_labels
from mismatch_cli.metrics import Direction
from mismatch_cli.render.compare_nway import nway_grid, render_runs_table, run_cells
from mismatch_cli.report import SCHEMA_VERSION, Report
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

# Precision-like arms: the trainer / engine disagreement grows from fp32 to fp8.
ARMS = {"fp32": (0.25, 11), "bf16": (1.0, 12), "fp8": (4.0, 13)}
ABS_DIFF, KL, ESS = "diag/logprob_abs_diff_mean", "rollout_corr/kl", "diag/ess_token"


def _report(metrics: dict[str, float], intervals: dict[str, list[float]] | None = None) -> Report:
    return Report(tool={"name": "mismatch", "version": "test"}, created_at="2026-01-01T00:00:00+00:00", inputs=[],
                  config={}, metrics=metrics, intervals=intervals or {})


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("nway")
    paths, reports = {}, {}
    for label, (noise, seed) in ARMS.items():
        paths[label] = root / f"{label}.parquet"
        write_synthetic_dump(paths[label], SynthSpec(tokens=5_000, seed=seed, noise=noise, mean_length=128))
        out = root / f"{label}.json"
        assert_exit(invoke("analyze", paths[label], "--device", "cpu", "--format", "json", "-o", out), 0)
        reports[label] = Report.load(out)
    out_dir = root / "out"
    result = invoke("compare", *paths.values(), "--device", "cpu", "--format", "json", "--out-dir", out_dir)
    assert_exit(result, 0)
    return {"root": root, "paths": paths, "reports": reports, "body": json.loads(result.stdout), "out": out_dir,
            "stderr": result.stderr}


def _rows(body: dict) -> dict[str, dict]:
    return {row["metric"]: row for row in body["metrics"]}


def test_json_structure(arms: dict) -> None:
    body = arms["body"]
    assert set(body) == {"schema_version", "runs", "metrics", "notes", "verdict"}
    assert body["schema_version"] == SCHEMA_VERSION == 1  # the two-run JSON did not change: no new version
    assert body["runs"] == [{"label": label, "source": str(path)} for label, path in arms["paths"].items()]
    for row in body["metrics"]:
        assert set(row) == {"metric", "direction", "mark", "values", "intervals", "best", "worst", "spread",
                            "min_difference"}
        assert list(row["values"]) == list(row["intervals"]) == list(ARMS)
        assert row["mark"] in (DIFFER, NOISE, SAME, MISSING)
    assert body["verdict"].startswith("verdict: RUNS DIFFER") and body["verdict"] in arms["stderr"]


def test_each_arm_equals_its_own_analyze(arms: dict) -> None:
    rows = _rows(arms["body"])
    assert ABS_DIFF in rows and KL in rows and ESS in rows
    for key, row in rows.items():
        for label, report in arms["reports"].items():
            assert row["values"][label] == report.metrics[key], (key, label)  # exactly: the same analysis
            assert row["intervals"][label] == report.intervals[key], (key, label)


def test_values_match_float64_numpy(arms: dict) -> None:
    rows = _rows(arms["body"])
    for label, path in arms["paths"].items():
        table = pq.read_table(path, columns=["old_log_probs", "rollout_log_probs", "response_mask"])
        old = table["old_log_probs"].combine_chunks().flatten().to_numpy().astype(np.float64)
        rollout = table["rollout_log_probs"].combine_chunks().flatten().to_numpy().astype(np.float64)
        valid = table["response_mask"].combine_chunks().flatten().to_numpy() == 1
        delta = old[valid] - rollout[valid]
        assert rows[ABS_DIFF]["values"][label] == pytest.approx(np.abs(delta).mean(), rel=1e-5)
        assert rows[KL]["values"][label] == pytest.approx(-delta.mean(), rel=1e-4, abs=1e-9)
        low, high = rows[ABS_DIFF]["intervals"][label]
        assert low <= np.abs(delta).mean() <= high


def test_best_and_worst_follow_the_registry_direction(arms: dict) -> None:
    rows = _rows(arms["body"])
    for key in (ABS_DIFF, "rollout_corr/k3_kl", "rollout_corr/chi2_token", ESS):
        assert (rows[key]["best"], rows[key]["worst"]) == ("fp32", "fp8"), key
    assert rows[ABS_DIFF]["mark"] == DIFFER  # 0.25x vs 4x the noise: far beyond the bootstrap intervals
    for key, row in rows.items():  # everywhere: best has the least badness, worst the most
        direction = Direction(row["direction"].removesuffix(" is better")) if row["direction"] else None
        badness = {label: direction.badness(value) for label, value in row["values"].items()}
        assert badness[row["best"]] == min(badness.values()) and badness[row["worst"]] == max(badness.values()), key
    assert "best most often: fp32" in arms["body"]["verdict"] and "worst most often: fp8" in arms["body"]["verdict"]


def test_numbers_do_not_depend_on_the_order_of_arms(arms: dict) -> None:
    paths = arms["paths"]
    result = invoke("compare", paths["fp8"], paths["fp32"], paths["bf16"], "--device", "cpu", "--format", "json")
    assert_exit(result, 0)
    body = json.loads(result.stdout)
    assert [run["label"] for run in body["runs"]] == ["fp8", "fp32", "bf16"]
    for key, row in _rows(body).items():
        expected = _rows(arms["body"])[key]
        for field in ("values", "intervals"):
            assert dict(sorted(row[field].items())) == dict(sorted(expected[field].items())), (key, field)
        for field in ("best", "worst", "mark", "spread", "min_difference", "direction"):
            assert row[field] == expected[field], (key, field)
    assert body["verdict"] == arms["body"]["verdict"]


def test_ties_and_metrics_without_direction() -> None:
    # chi2_token ties between b and c: the worst is named by label, whatever the order given.
    reports = {"a": _report({"rollout_corr/chi2_token": 0.1, "rollout_corr/training_ppl": 1.2}),
               "b": _report({"rollout_corr/chi2_token": 0.5, "rollout_corr/training_ppl": 1.1}),
               "c": _report({"rollout_corr/chi2_token": 0.5, "rollout_corr/training_ppl": 1.3})}
    keys = ["rollout_corr/chi2_token", "rollout_corr/training_ppl"]
    for order in (["a", "b", "c"], ["c", "b", "a"], ["b", "a", "c"]):
        rows = {r.metric: r for r in compare_runs([(k, reports[k]) for k in order], metrics=keys).rows}
        chi2, ppl = rows["rollout_corr/chi2_token"], rows["rollout_corr/training_ppl"]
        assert (chi2.best, chi2.worst, chi2.mark) == ("a", "b", DIFFER)
        assert (ppl.best, ppl.worst, ppl.direction) == (None, None, None)  # informational: nobody is best
        assert ppl.spread == pytest.approx(0.2)
    same = compare_runs([(k, _report({"rollout_corr/chi2_token": 0.3})) for k in "xyz"]).rows[0]
    assert (same.best, same.worst, same.mark) == (None, None, NOISE)


def test_marks_noise_practical_difference_and_missing() -> None:
    def run(value: float, low: float, high: float) -> Report:
        return _report({"diag/ess_token": value, "rollout_corr/kl": value - 0.89}, {"diag/ess_token": [low, high]})

    rows = {r.metric: r for r in compare_runs([("a", run(0.90, 0.85, 0.95)), ("b", run(0.92, 0.90, 0.94)),
                                               ("c", run(0.91, 0.89, 0.93))]).rows}
    assert rows["diag/ess_token"].mark == NOISE and rows["diag/ess_token"].best == "b"
    kl = rows["rollout_corr/kl"]  # no intervals: 0.02 apart is more than 10 % of the smaller |kl| (0.01)
    assert (kl.mark, kl.best, kl.worst, kl.min_difference) == (DIFFER, "a", "b", pytest.approx(0.001))
    rows = {r.metric: r for r in compare_runs([(k, _report({"diag/ess_token": v})) for k, v in
                                               (("a", 0.900), ("b", 0.905), ("c", 0.902))]).rows}
    assert rows["diag/ess_token"].mark == SAME  # 0.005 < the registry's 0.01
    lacking = compare_runs([("a", _report({KL: 0.1, ESS: 0.9})), ("b", _report({KL: 0.2, ESS: 0.8})),
                            ("c", _report({KL: 0.3}))]).rows
    assert {r.metric: r.mark for r in lacking} == {KL: DIFFER, ESS: MISSING}
    with pytest.raises(DataError, match="nothing to compare"):
        compare_runs([("a", _report({KL: 0.1})), ("b", _report({KL: 0.2})), ("c", _report({ESS: 0.3}))])


@pytest.mark.parametrize("width", [60, 80, 120])
def test_terminal_table_fits_and_keeps_numbers_whole(arms: dict, width: int) -> None:
    comparison = compare_many(list(arms["reports"].values()), labels=list(ARMS)).comparison
    buffer = io.StringIO()
    render_runs_table(comparison, Console(file=buffer, width=width, color_system=None, highlight=False))
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    stacked = nway_grid(comparison, width).columns[2] == "run"
    assert stacked == (width < 120)  # three arms with intervals need more than 80 columns side by side
    for row in comparison.rows:
        for label in ARMS:
            value, interval = run_cells(row, label)
            assert any(re.search(rf"(?:^|\s){re.escape(value)}(?:\s|$)", line) for line in lines), (row.metric, value)
            for word in interval.split():
                assert any(re.search(rf"(?:^|\s){re.escape(word)}(?:\s|$)", line) for line in lines), word


def test_cli_at_80_columns(arms: dict) -> None:
    result = invoke("compare", *arms["paths"].values(), "--device", "cpu", env={"COLUMNS": "80"})
    assert_exit(result, 0)
    assert max(map(len, result.stdout.splitlines())) <= 80
    assert "3 runs side by side" in result.stdout and "verdict:" in result.stderr


def test_out_dir_plot_page_and_reports(arms: dict) -> None:
    out = arms["out"]
    names = {p.name for p in out.iterdir()}
    assert names == {"compare.json", "compare.md", "compare_metrics.png", "compare.html",
                     "fp32_report.json", "bf16_report.json", "fp8_report.json"}
    png = (out / "compare_metrics.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert json.loads((out / "compare.json").read_text()) == arms["body"]
    page = (out / "compare.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and "https://" not in page
    assert all(f"<th>{label}</th>" in page for label in ARMS) and 'class="best"' in page
    markdown = (out / "compare.md").read_text()
    assert "| mark | metric | fp32 | bf16 | fp8 | best | worst | better |" in markdown
    assert Report.load(out / "fp8_report.json").metrics == arms["reports"]["fp8"].metrics


def test_reports_as_runs(arms: dict, tmp_path: Path) -> None:
    reports = [arms["root"] / f"{label}.json" for label in ARMS]
    result = invoke("compare", *reports, "--format", "json", "--out-dir", tmp_path / "out", "--no-plots")
    assert_exit(result, 0)
    body = json.loads(result.stdout)
    assert [r["label"] for r in body["runs"]] == list(ARMS)
    assert body["metrics"] == arms["body"]["metrics"]  # a report gives the same numbers as its dump
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"compare.json", "compare.md"}


def _one_error_line(result, code: int, text: str) -> None:  # noqa: ANN001
    assert_exit(result, code)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr


def test_error_cases(arms: dict, tmp_path: Path) -> None:
    fp32, bf16, fp8 = (arms["paths"][k] for k in ARMS)
    _one_error_line(invoke("compare", fp32, bf16, fp32), 2, "the same run is given twice")
    spelled = fp32.parent / "." / fp32.name  # the same file under another spelling
    _one_error_line(invoke("compare", fp32, bf16, spelled), 2, "the same run is given twice")
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(fp32.read_bytes())
    _one_error_line(invoke("compare", folder / "a.parquet", bf16, folder), 2, "is inside run")
    _one_error_line(invoke("compare", fp32, bf16, tmp_path / "absent.parquet", "--device", "cpu"), 3, "absent")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file at all")
    _one_error_line(invoke("compare", fp32, bf16, broken, "--device", "cpu"), 3, "broken.parquet")
    _one_error_line(invoke("compare", fp32, bf16, fp8, "--fail-on", "kl<=1"), 2, "--fail-on needs exactly two")
    with pytest.raises(UsageError, match="two or more runs"):
        compare_many([fp32])
    with pytest.raises(UsageError, match="labels"):
        compare_many([fp32, bf16, fp8], labels=["a", "b"])
    with pytest.raises(UsageError, match="same label"):
        compare_runs([("a", arms["reports"]["fp32"]), ("a", arms["reports"]["bf16"]), ("c", arms["reports"]["fp8"])])


def test_default_labels() -> None:
    assert default_labels(["runs/fp32.parquet", "runs/bf16.parquet", "fp8/"]) == ["fp32", "bf16", "fp8"]
    assert default_labels(["a/report.json", "b/report.json", "c/x.parquet"]) == ["a/report", "b/report", "c/x"]
    assert default_labels(["x.parquet", "x.safetensors", "y.parquet"]) == ["x.parquet", "x.safetensors", "y.parquet"]


def test_python_api_table(arms: dict) -> None:
    result = compare_many(list(arms["reports"].values()), labels=list(ARMS))
    assert result.exit_code == 0 and result.verdict() == arms["body"]["verdict"]
    table = result.table()
    assert len(table) == 3 * len(result.comparison.rows)
    row = table[(table.metric == ABS_DIFF) & (table.run == "fp8")].iloc[0]
    assert row.value == arms["reports"]["fp8"].metrics[ABS_DIFF] and bool(row.worst)

