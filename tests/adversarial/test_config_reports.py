"""A report.json read back by compare / check is validated (exit 3 naming file and JSON path); plots survive
degenerate histograms."""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest
from conftest import ROOT, assert_clean_failure, mismatch, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from mismatch_cli.errors import InputError
from mismatch_cli.gate.comparison import compare_reports
from mismatch_cli.render.compare import render_compare_plots
from mismatch_cli.render.plots import render_plots, signed_bins
from mismatch_cli.report import Report, validate_report

DUMP = ROOT / "sample_data" / "single_turn.parquet"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("good")
    run = mismatch("analyze", DUMP, "--bootstrap", "50", "--no-plots", "--out-dir", out, "-q")
    assert run.code == 0, run.stderr
    return json.loads((out / "report.json").read_text())


def _edit(report: dict, path: tuple, value) -> dict:
    edited = copy.deepcopy(report)
    target = edited
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return edited


KL = "rollout_corr/kl"
MALFORMED = [
    ("list", lambda r: [r], "$ must be an object"),
    ("string-metric", lambda r: _edit(r, ("metrics", KL), "0.1"), f'$.metrics["{KL}"]'),
    ("bool-metric", lambda r: _edit(r, ("metrics", KL), True), f'$.metrics["{KL}"]'),
    ("one-number-interval", lambda r: _edit(r, ("intervals", KL), [0.1]), f'$.intervals["{KL}"]'),
    ("null-interval", lambda r: _edit(r, ("intervals", KL), None), f'$.intervals["{KL}"]'),
    ("null-in-interval", lambda r: _edit(r, ("intervals", KL), [None, 1.0]), f'$.intervals["{KL}"][0]'),
    ("reversed-interval", lambda r: _edit(r, ("intervals", KL), [1.0, 0.0]), f'$.intervals["{KL}"]'),
    ("null-intervals", lambda r: _edit(r, ("intervals",), None), "$.intervals"),
    ("metrics-list", lambda r: _edit(r, ("metrics",), []), "$.metrics"),
    ("no-metrics", lambda r: {k: v for k, v in r.items() if k != "metrics"}, "$.metrics"),
    ("round-string", lambda r: _edit(r, ("rounds", 0, "abs_diff_mean"), "x"), "$.rounds[0].abs_diff_mean"),
    ("input-bytes", lambda r: _edit(r, ("inputs", 0, "bytes"), "12"), "$.inputs[0].bytes"),
    ("hist-short-counts", lambda r: _edit(r, ("histograms", "log_ratio", "positive"), [1]),
     "$.histograms.log_ratio.positive"),
    ("hist-decreasing", lambda r: _edit(r, ("histograms", "log_ratio", "edges"), [2.0, 1.0]),
     "$.histograms.log_ratio.edges"),
    ("unknown-field", lambda r: {**r, "metricz": {}}, "$.metricz"),
]


@pytest.mark.parametrize(("edit", "json_path"), [(e, p) for _, e, p in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_report_names_file_and_path(tmp_path, good, edit, json_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(good)))
    with pytest.raises(InputError) as info:
        Report.load(bad)
    assert str(bad) in str(info.value) and json_path in str(info.value) and info.value.hint


@pytest.mark.parametrize("name", ["list", "string-metric", "one-number-interval", "null-interval", "round-string"])
def test_compare_and_check_refuse_a_malformed_report(tmp_path, good, name):
    edit, json_path = next((e, p) for n, e, p in MALFORMED if n == name)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(good)))
    base = tmp_path / "base.json"
    base.write_text(json.dumps(good))
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    assert_clean_failure(mismatch("compare", base, bad, "--out-dir", out), 3, str(bad), json_path)
    assert_clean_failure(mismatch("check", bad, "--fail-on", "kl<=1", "--out-dir", out), 3, str(bad), json_path)
    assert snapshot(tmp_path) == before and not out.exists()


def test_nan_literal_is_not_json(tmp_path, good):
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(good).replace('"rollout_corr/kl": ', '"rollout_corr/kl": NaN, "x": ', 1))
    assert_clean_failure(mismatch("check", bad, "--fail-on", "kl<=1"), 3, str(bad), "NaN")


def test_validate_accepts_what_analyze_writes(good):
    validate_report(good)  # the writer's own output is always readable back
    with pytest.raises(InputError):
        validate_report({**good, "schema_version": True})


# -------------------------------------------------------------------------------- degenerate histograms

DEGENERATE = {
    "zero-width": {"bins_per_octave": 8, "edges": [0.5, 0.5], "negative": [0], "positive": [100], "zero": 0},
    "zero-edges": {"bins_per_octave": 8, "edges": [0.0, 0.0], "negative": [4], "positive": [100], "zero": 0},
    "only-zeros": {"bins_per_octave": 8, "edges": [], "negative": [], "positive": [], "zero": 100},
    "no-counts": {"bins_per_octave": 8, "edges": [0.5, 1.0], "negative": [0], "positive": [0], "zero": 0},
    "signed-zero-edges": {"edges": [0.0, 0.0], "counts": [5]},
}


@pytest.mark.parametrize("name", list(DEGENERATE))
def test_compare_plots_survive_a_degenerate_histogram(tmp_path, good, name):
    report = Report.from_dict(_edit(good, ("histograms",), {"log_ratio": DEGENERATE[name]}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        render_compare_plots(compare_reports(report, report), report, report)
        render_plots(report)


def test_compare_cli_with_degenerate_histograms_writes_its_plots(tmp_path, good):
    base, candidate = tmp_path / "base.json", tmp_path / "candidate.json"
    base.write_text(json.dumps(_edit(good, ("histograms",), {"log_ratio": DEGENERATE["zero-edges"]})))
    candidate.write_text(json.dumps(_edit(good, ("histograms",), {"log_ratio": DEGENERATE["signed-zero-edges"]})))
    run = mismatch("compare", base, candidate, "--out-dir", tmp_path / "out")
    assert run.code == 0, run.stderr
    assert (tmp_path / "out" / "compare_log_ratio_hist.png").exists()


@st.composite
def histograms(draw) -> dict:
    bins = draw(st.integers(0, 5))
    edges = sorted(draw(st.lists(st.sampled_from([0.0, 1e-300, 1e-9, 1e-6, 1e-3, 0.5, 1.0, 1e300]),
                                 min_size=bins + 1, max_size=bins + 1))) if bins else []
    counts = st.lists(st.sampled_from([0, 1, 10**9]), min_size=bins, max_size=bins)
    return {"edges": edges, "negative": draw(counts), "positive": draw(counts), "zero": draw(st.sampled_from([0, 3]))}


@settings(max_examples=400, deadline=None)
@given(histograms())
def test_signed_bins_of_any_valid_histogram_can_be_drawn(histogram):
    validate_report({"schema_version": 1, "tool": {}, "created_at": "", "inputs": [], "config": {}, "metrics": {},
                     "histograms": {"log_ratio": histogram}})
    total = histogram["zero"] + sum(histogram["negative"]) + sum(histogram["positive"])
    bins = signed_bins(histogram)
    if total == 0:
        assert bins is None
        return
    edges, counts = bins
    assert len(edges) == len(counts) + 1 and counts.sum() == total
    assert np.all(np.diff(edges) >= 0) and np.all(np.isfinite(edges))
    assert (edges > 0).any()  # the symlog axis needs a positive linear threshold
