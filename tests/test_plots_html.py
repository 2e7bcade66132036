"""`analyze --out-dir`: the PNG plots are valid images and report.html is self-contained and complete."""

from __future__ import annotations

import base64
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.plots import render_plots
from mismatch_cli.report import Report

ROOT = Path(__file__).resolve().parents[1]
MULTI = ROOT / "sample_data" / "multi_turn.parquet"
SINGLE = ROOT / "sample_data" / "single_turn.parquet"
runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})


def analyze(out_dir: Path, *args: str) -> tuple[Report, str]:
    result = runner.invoke(app, ["analyze", *args, "--out-dir", str(out_dir), "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert isinstance(result.exception, (SystemExit, type(None)))
    return Report.load(out_dir / "report.json"), result.stderr


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's signature and IHDR chunk (raises if it is not a PNG)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    assert data.endswith(b"IEND\xaeB`\x82")  # the closing chunk (its CRC is constant)
    return struct.unpack(">II", data[16:24])


class Resources(HTMLParser):
    """Every tag and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if tag == "img" and name == "src":
                self.images.append(value or "")
            elif name in ("src", "href", "action", "data", "poster", "srcset", "background"):
                self.links.append((tag, value or ""))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Report, str]:
    out_dir = tmp_path_factory.mktemp("multi")
    report, stderr = analyze(out_dir, str(MULTI), "--preset", "decoupled_geo_rs_token_tis")
    return out_dir, report, stderr


def test_plots_are_valid_pngs(multi: tuple[Path, Report, str]) -> None:
    out_dir, _, stderr = multi
    expected = {"delta_hist.png", "abs_delta_ccdf.png", "is_weights.png", "rounds.png", "position.png"}
    assert {p.name for p in out_dir.glob("*.png")} == expected
    for name in expected:
        width, height = png_size((out_dir / name).read_bytes())
        assert width >= 600 and height >= 300, name
    assert "report.html" in stderr and "5 plots" in stderr
    assert not list(out_dir.glob(".*.tmp"))


def test_html_is_self_contained_and_embeds_every_plot(multi: tuple[Path, Report, str]) -> None:
    out_dir, _, _ = multi
    page = (out_dir / "report.html").read_text()
    parser = Resources()
    parser.feed(page)
    assert parser.tags.count("html") == 1 and "table" in parser.tags
    assert not parser.links, parser.links  # no script src, no stylesheet link, no href at all
    assert "script" not in parser.tags and "link" not in parser.tags and "iframe" not in parser.tags
    assert "http://" not in page and "https://" not in page and "url(" not in page
    embedded = []
    for src in parser.images:
        assert src.startswith("data:image/png;base64,")
        embedded.append(base64.b64decode(src.split(",", 1)[1]))
    pngs = sorted(p.read_bytes() for p in out_dir.glob("*.png"))
    assert sorted(embedded) == pngs


def test_html_holds_the_key_numbers(multi: tuple[Path, Report, str]) -> None:
    out_dir, report, _ = multi
    parser = Resources()
    parser.feed((out_dir / "report.html").read_text())
    text = "\n".join(parser.text)
    for key in ("rollout_corr/kl", "rollout_corr/rollout_is_eff_sample_size", "diag/logprob_abs_diff_mean",
                "diag/abs_log_ratio_p99", "diag/ess_seq_kish", "diag/prob_pearson_corr"):
        assert format_value(report.metrics[key]) in text, key
    assert f"Health {report.summary['status']}" in " ".join(text.split())
    for row in report.what_if:
        assert row["name"] in text
    worst = next(w for w in report.worst_sequences if w["criterion"] == "max_abs_log_ratio" and w["rank"] == 1)
    assert f"multi_turn.parquet:{worst['row']}" in text
    assert "Rounds (round k" in text and "Quantiles of d" in text and "What if" in text
    assert format_value(report.rounds[-1]["abs_diff_mean"]) in text


def test_report_json_carries_what_the_plots_need(multi: tuple[Path, Report, str]) -> None:
    out_dir, report, _ = multi
    data = json.loads((out_dir / "report.json").read_text())
    assert data["what_if"] and data["worst_sequences"] and data["quantiles"]["abs_log_ratio"]
    assert set(data["histograms"]) == {"log_ratio", "sequence_log_ratio_sum", "position"}
    # A report read back from JSON (no dump) plots the same set.
    assert set(render_plots(report)) == {p.name for p in out_dir.glob("*.png")}


def test_steps_and_sequence_weights(tmp_path: Path) -> None:
    report, _ = analyze(tmp_path, str(SINGLE), "--by", "step", "--is", "sequence", "--is-threshold", "0.5_5.0")
    names = {p.name for p in tmp_path.glob("*.png")}
    assert {"steps.png", "is_weights.png", "delta_hist.png", "position.png"} <= names
    assert "rounds.png" not in names  # single-turn: one round per row
    for name in names:
        png_size((tmp_path / name).read_bytes())
    assert len(report.steps) >= 2


def test_no_plots_writes_only_the_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["analyze", str(MULTI), "--out-dir", str(tmp_path), "--no-plots", "--device", "cpu",
                                 "--format", "json"])
    assert result.exit_code == 0 and isinstance(result.exception, (SystemExit, type(None)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "rounds.csv"]  # tables, no plots


def test_font_fallbacks_do_not_reach_stderr() -> None:
    # A stale font cache makes matplotlib log "findfont: ... not found" at WARNING for every mathtext label.
    import logging

    from mismatch_cli.render.plotting import pyplot

    logger = logging.getLogger("matplotlib.font_manager")
    logger.setLevel(logging.NOTSET)
    pyplot()
    assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
