"""report.html leads with the terminal's answers (verdict, Why, What to do, dump checks, drift, key metrics) before
the evidence, names only the active correction and escapes every text; expected words come from report.json."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.metrics.notes import explain
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.html import render_html
from mismatch_cli.render.lead import correction_text
from mismatch_cli.report import Report
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

ROOT = Path(__file__).resolve().parents[1]
MULTI = ROOT / "sample_data" / "multi_turn.parquet"
BLOCKS = {"h1", "h2", "h3", "p", "div", "ul", "li", "table", "tr", "td", "th", "figure", "figcaption", "footer"}
runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})


class Page(HTMLParser):
    """The visible text, the header line that names the correction, and the text before the first table or plot."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self.lead: str | None = None  # the text before the first <table> / <figure>
        self.tags: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in BLOCKS:
            self.chunks.append(" ")
        if tag in ("style", "title"):
            self._hidden += 1
        if tag in ("table", "figure") and self.lead is None:
            self.lead = self.flat()

    def handle_endtag(self, tag: str) -> None:
        if tag in BLOCKS:
            self.chunks.append(" ")
        if tag in ("style", "title"):
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.chunks.append(data)

    def flat(self) -> str:
        return " ".join("".join(self.chunks).split())


def page_of(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


def flat(text: str) -> str:
    return " ".join(text.split())


def analyze(out_dir: Path, *args: str) -> tuple[Report, Page]:
    result = runner.invoke(app, ["analyze", *args, "--out-dir", str(out_dir), "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    return Report.load(out_dir / "report.json"), page_of((out_dir / "report.html").read_text())


def in_order(text: str, *needles: str) -> list[int]:
    """Where each needle first appears in `text`, each after the one before (fails on a missing or out-of-order one)."""
    places, start = [], 0
    for needle in needles:
        where = text.find(flat(needle), start)
        assert where >= 0, f"{needle!r} missing (or before {places and needles[len(places) - 1]!r})"
        places.append(where)
        start = where + 1
    return places


def correction_line(page: Page) -> str:
    text = page.flat()
    start = text.index("Correction:")
    return text[start:text.index("Health", start)]


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Page]:
    return analyze(tmp_path_factory.mktemp("multi"), str(MULTI))


@pytest.fixture(scope="module")
def buggy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Page]:
    """A dump whose rollout side is renormalized over a top-p nucleus of mass 0.9 (rollout = log p - log 0.9 on
    every token), over 6 steps, with enough catastrophic tokens that a cause shows up beside the bug."""
    folder = tmp_path_factory.mktemp("bug")
    clean = folder / "clean.parquet"
    write_synthetic_dump(clean, SynthSpec(tokens=40_000, seed=3, steps=6, catastrophic_rate=3e-4))
    table = pq.read_table(clean)
    processed = [(np.asarray(row, np.float32) - np.log(np.float32(0.9))).astype(np.float32).tolist()
                 for row in table["rollout_log_probs"].to_pylist()]
    table = table.set_column(table.schema.get_field_index("rollout_log_probs"), "rollout_log_probs",
                             pa.array(processed, type=pa.list_(pa.float32())))
    path = folder / "topp.parquet"
    pq.write_table(table, path)
    return analyze(folder / "out", str(path), "--by", "step")


def checks_lines(report: Report) -> list[str]:
    return [f"{c['label']}: {format_value(c['value'])} (healthy: {c['healthy_range']})"
            for c in report.summary["checks"]]


def test_multi_turn_leads_with_verdict_cause_fix_and_dump_checks(multi: tuple[Report, Page]) -> None:
    report, page = multi
    assert page.lead is not None
    checks = report.summary["checks"]
    out = [c for c in checks if not c["ok"] and not c.get("few_tokens")]
    assert report.summary["status"] == "warning" and out
    cause = next(f for f in report.findings if f["code"] == "concentrated_divergence")
    recommendation = report.recommendation
    assert recommendation is not None and recommendation["flags"]
    assert not [f for f in report.findings if f["severity"] == "error"]
    in_order(page.lead, f"WARNING - {len(out)} of {len(checks)} checks out of band", *checks_lines(report),
             "Why", cause["title"], cause["detail"],
             "What to do", f"turn on {recommendation['scenario']}: {recommendation['flags']}",
             "Dump checks", "none found", "Key metrics")
    for check in checks:
        note = explain(check["metric"], check["value"], report.metrics)
        if check.get("few_tokens"):
            assert f"few {check['label']}" in page.lead
            assert f"out through {check['few_tokens']} tokens only" in page.lead
        elif note:
            assert note in page.lead, note
    alternative = recommendation["alternatives"][0]["flags"]
    in_order(page.lead, f"health after: {recommendation['health_after']['status'].upper()}", alternative)


def test_key_metrics_carry_their_intervals(multi: tuple[Report, Page]) -> None:
    report, page = multi
    assert page.lead is not None
    low, high = report.intervals["rollout_corr/chi2_seq"]
    in_order(page.flat(), "Key metrics (95 % bootstrap interval)", "chi2_seq",
             format_value(report.metrics["rollout_corr/chi2_seq"]), f"[{format_value(low)}, {format_value(high)}]",
             "The evidence", "Health checks", "Plots")


def test_the_evidence_follows_the_answers(multi: tuple[Report, Page]) -> None:
    report, page = multi
    text = page.flat()
    in_order(text, "Key metrics", "The evidence", "Health checks", "Plots", "Quantiles of d", "What if", "Inputs")
    assert "Drift over steps" not in text  # no --by step: no drift to report
    assert "rollout_is_threshold" not in correction_line(page)
    assert "Correction: none (metrics only)" in correction_line(page)


def test_a_bug_leads_with_its_fix(buggy: tuple[Report, Page]) -> None:
    report, page = buggy
    assert page.lead is not None
    diagnosis = report.summary["diagnosis"]
    assert report.summary["status"] == "bug" and diagnosis["kind"] == "bug"
    bug = next(f for f in report.findings if f["code"] == diagnosis["code"])
    assert bug["code"] == "processed_logprobs" and bug["fix"] == diagnosis["fix"]
    cause = next(f for f in report.findings if f["code"] == "concentrated_divergence")
    fix = report.recommendation["fix"]["text"]
    assert fix == bug["fix"]
    moving = [key.split("/")[-1] for key, entry in report.drift.items() if entry.get("bad_steps")]
    assert moving
    in_order(page.lead, f"BUG IN THE DUMP OR CONFIG - {diagnosis['title']}", *checks_lines(report),
             "Why", cause["title"], "What to do", f"fix first: {fix}", "no correction is recommended until then",
             "Dump checks", bug["title"], bug["detail"], "Drift over steps", *(f"{name}:" for name in moving),
             "Key metrics")
    assert "turn on" not in page.lead and "cost:" not in page.lead  # no correction until the bug is fixed
    few = next(c for c in report.summary["checks"] if c.get("few_tokens"))
    assert f"few {few['label']}" in page.lead
    ratio = next(c for c in report.summary["checks"] if c["metric"] == "diag/ratio_mean")
    assert explain(ratio["metric"], ratio["value"], report.metrics) in page.lead


def test_the_header_names_only_the_active_correction(tmp_path: Path) -> None:
    report, page = analyze(tmp_path, str(MULTI), "--is", "token", "--is-threshold", "2", "--bootstrap", "0")
    assert report.config["rollout_is"] == "token" and report.config["rollout_is_threshold"] == 2.0
    assert "rollout_is=token, rollout_is_threshold=2.0" in correction_line(page)


@pytest.mark.parametrize(("config", "expected"), [
    ({"semantics": "verl", "preset": None, "rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None,
      "rollout_rs_threshold": None}, "none (metrics only)"),
    ({"semantics": "verl", "preset": None, "rollout_is": None, "rollout_is_threshold": 2.0,
      "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": 1.001},
     "rollout_rs=seq_mean_k1, rollout_rs_threshold=1.001"),
    ({"semantics": "verl", "preset": "decoupled_token_is", "rollout_is": "token", "rollout_is_threshold": 2.0,
      "rollout_rs": None, "rollout_rs_threshold": None}, "preset=decoupled_token_is, rollout_is=token, "
                                                         "rollout_is_threshold=2.0"),
    ({"semantics": "xtuner", "rollout_is_threshold": 2.0, "rollout_is_level": "token"}, "rollout_is_threshold=2.0"),
    ({"semantics": "verl-0.7.0"}, "verl-0.7.0 fields"),
])
def test_correction_text_shows_a_threshold_only_beside_its_correction(config: dict[str, Any], expected: str) -> None:
    assert correction_text(config) == expected


def test_every_text_is_escaped(multi: tuple[Report, Page], tmp_path: Path) -> None:
    report, _ = multi
    hostile = "<script>alert('x')</script> & <b>bold</b>"
    data = report.to_dict()
    data["findings"] = [{**f, "title": hostile, "detail": hostile} for f in data["findings"]]
    data["warnings"] = [hostile]
    data["summary"] = {**data["summary"], "checks": [{**c, "label": hostile} for c in data["summary"]["checks"]]}
    html = render_html(Report.from_dict(data), {})
    page = page_of(html)
    assert "script" not in page.tags and "b" not in page.tags
    assert page.flat().count(flat(hostile)) >= 3
