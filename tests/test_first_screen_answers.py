"""Issue 25: Markdown carries the first screen's answers; a row-level χ² beside a token-level verdict is
explained; a run's own correction states its cost; abbreviations are spelled out. Values come from
report.json or numpy, not from the renderer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner

from mismatch_cli.answers.findings.model import percent
from mismatch_cli.cli import app
from mismatch_cli.metrics.notes import explain
from mismatch_cli.render.cells import format_value
from mismatch_cli.render.lead import glossary
from mismatch_cli.render.markdown import render_markdown
from mismatch_cli.report import Report

ROOT = Path(__file__).resolve().parents[1]
SINGLE, MULTI = "sample_data/single_turn.parquet", "sample_data/multi_turn.parquet"
ENV = {"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb", "MISMATCH_DEBUG": None, "FORCE_COLOR": None}


def _run(*args: str) -> str:
    result = CliRunner(env=ENV).invoke(app, ["analyze", *args, "--device", "cpu", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    return result.stdout


def _flat(text: str) -> str:
    return " ".join(text.split())


def _saved(tmp_path: Path, path: str) -> Path:
    out = tmp_path / "report.json"
    result = CliRunner(env=ENV).invoke(app, ["analyze", path, "--device", "cpu", "--bootstrap", "0", "-o", str(out),
                                             "--format", "json"])
    assert result.exit_code == 0, result.output
    return out


def test_markdown_carries_the_answers_before_its_tables(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)
    report = json.loads(_run(MULTI, "--format", "json"))
    markdown = _run(MULTI, "--format", "markdown")
    heads = ["## Health: WARNING", "## Why", "## What to do", "## Dump checks (bug signatures)", "## Key metrics"]
    at = [markdown.index(head) for head in heads]
    assert at == sorted(at) and at[-1] < markdown.index("# Tables")
    answers = markdown[:markdown.index("# Tables")]
    for check in report["summary"]["checks"]:
        assert f"{check['label']}: {format_value(check['value'])}" in answers.replace("\\|", "|")
    assert report["recommendation"]["flags"] in answers  # What to do: the recommended flags
    cause = next(f for f in report["findings"] if f["code"] == "concentrated_divergence")
    assert cause["title"] in answers.replace("\\|", "|")
    assert f"| {format_value(report['metrics']['rollout_corr/chi2_seq'])} |" in answers
    # Drift needs 3 or more steps (the samples have 2): a drifting metric, as engine/drift.py records it.
    loaded = Report.load(_saved(tmp_path, MULTI))
    loaded.drift = {"rollout_corr/kl": {"slope": 0.0125, "slope_interval": [0.005, 0.02], "bad_steps": [3, 4],
                                        "first_out_of_band_step": 3, "steps": 5, "change_point_step": None}}
    drifting = render_markdown(loaded)
    assert "## Drift over steps (1 of 1 metrics move)" in drifting[:drifting.index("# Tables")]
    assert "**kl**: 0.0125 per step [0.005, 0.02]; out of band from step 3 (2 of 5 steps)" in drifting


def test_a_row_level_chi2_beside_a_token_level_verdict_is_explained(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    report = json.loads(_run(MULTI, "--format", "json"))
    assert report["metrics"]["rollout_corr/chi2_seq"] > 1  # outside χ²_token's band, yet not a check
    assert "diag/ess_seq_kish" not in [c["metric"] for c in report["summary"]["checks"]]
    lines = _run(MULTI).splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["chi2_seq"])
    assert "few long rows dominate it" in lines[at + 1]
    # The rule is general: any row-level value out of its token sibling's band, only off a sequence-level verdict.
    assert explain("rollout_corr/chi2_seq", 1666.0, {}, sequence_level=False)
    assert explain("diag/ess_seq_kish", 0.01, {}, sequence_level=False)
    assert explain("rollout_corr/chi2_seq", 1666.0, {}, sequence_level=True) is None
    assert explain("rollout_corr/chi2_seq", 0.5, {}, sequence_level=False) is None


def _seq_mean_k1_cost(path: Path, low: float, high: float) -> tuple[float, float]:
    """Tokens and rows verl's seq_mean_k1 RS drops (k1 = mean of rollout - old over a row's valid tokens)."""
    table = pq.read_table(path)
    dropped_tokens = tokens = dropped_rows = 0
    for old, rollout, mask in zip(*(table[c].to_pylist() for c in (
            "old_log_probs", "rollout_log_probs", "response_mask")), strict=True):
        valid = np.asarray(mask) > 0
        tokens += int(valid.sum())
        if valid.any():
            k1 = float(np.mean(np.asarray(rollout, np.float64)[valid] - np.asarray(old, np.float64)[valid]))
            if not math.log(low) <= k1 <= math.log(high):
                dropped_tokens += int(valid.sum())
                dropped_rows += 1
    return dropped_tokens / tokens, dropped_rows / table.num_rows


def test_the_runs_own_correction_states_its_cost(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    tokens, rows = _seq_mean_k1_cost(ROOT / SINGLE, 0.999, 1.001)
    assert rows > 0.1  # verl's preset drops a sizeable share of a healthy dump
    report = json.loads(_run(SINGLE, "--rs", "seq_mean_k1", "--rs-threshold", "0.999_1.001", "--format", "json"))
    assert report["summary"]["before"]["status"] == "healthy"
    screen = _flat(_run(SINGLE, "--rs", "seq_mean_k1", "--rs-threshold", "0.999_1.001"))
    # Beyond the drop band (10 % of tokens or sequences) the cost leads What to do as a finding (issue 34).
    assert f"What to do your correction drops {percent(tokens)} of tokens and {percent(rows)} of sequences" in screen
    assert "no correction is needed" not in screen
    # The two catastrophic tokens that keep token_mult_prob_error out are a token-level correction's job: the
    # lightest ladder setting that touches them replaces the RS.
    lighter = screen.split("; instead, ", 1)[1].split(" is the lightest", 1)[0].split(" (=")[0]
    assert lighter in [row["flags"] for row in report["what_if"] if row["level"] == "token"]
    # A run that already applies that setting is told so, not told to switch to it "instead".
    own = _flat(_run(SINGLE, *lighter.split()))
    assert f"the run's own correction, {lighter}, is the lightest setting that touches them" in own
    assert "; instead, " not in own
    # The same in a replayed trainer's own fields (SkyRL's token TIS with its token mask).
    skyrl = ("--semantics", "skyrl", "--set", "tis_ratio_type=token", "--set", "token_tis_ratio_clip_high=10.0")
    flags = _flat(_run(SINGLE, *skyrl)).split("; instead, ", 1)[1].split(" is the lightest", 1)[0]
    assert flags.startswith("--set tis_ratio_type=token")
    own = _flat(_run(SINGLE, "--semantics", "skyrl", *flags.split()))
    assert f"the run's own correction, {flags}, is the lightest setting that touches them" in own
    preset = _flat(_run(SINGLE, "--preset", "decoupled_geo_rs_token_tis"))
    assert "What to do your correction drops" in preset and "no correction is needed" not in preset


def test_abbreviations_are_spelled_out_once_on_the_first_screen(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    text = _run(MULTI)
    lines = text.splitlines()
    assert len(lines) <= 48 and max(map(len, lines)) <= 80  # the fix also in the trainer's own overrides
    flat = _flat(text)
    for spelled in ("TIS = truncated importance sampling", "ESS = effective sample size", "k1, k3 = KL estimators"):
        assert flat.count(spelled) == 1, spelled
    assert glossary("TIS token 2.0") == "TIS = truncated importance sampling"  # IS inside TIS is not IS
    assert glossary("no abbreviation here") is None


def test_an_icepop_band_states_the_weights_it_zeroes(monkeypatch) -> None:
    # verl's IS with a band (--is-threshold LOW_HIGH) zeroes the weight of every token outside it (IcePop): the
    # cost line counts both sides, not only the tokens above the band as TIS's truncation would.
    monkeypatch.chdir(ROOT)
    table = pq.read_table(ROOT / SINGLE)
    outside = tokens = 0
    for old, rollout, mask in zip(*(table[c].to_pylist() for c in (
            "old_log_probs", "rollout_log_probs", "response_mask")), strict=True):
        valid = np.asarray(mask) > 0
        ratio = np.exp(np.asarray(old, np.float32)[valid] - np.asarray(rollout, np.float32)[valid])
        outside += int(((ratio < 0.5) | (ratio > 1.2)).sum())
        tokens += int(valid.sum())
    assert 0 < outside
    screen = _flat(_run(SINGLE, "--is", "token", "--is-threshold", "0.5_1.2"))
    assert f"your correction costs: zeroes the weight of {percent(outside / tokens)} of tokens" in screen
    assert "truncates" not in screen.split("your correction costs: ", 1)[1].split(";", 1)[0]
