"""Causes told apart (issue 37): truncation, a reweighting penalty and a temperature; a mask that covers the
prompt; a policy lag against a precision gap, with and without the policy versions a dump may carry.

Each dump turns one knob of a sampled softmax (tests/findings/knobs.py); the expected numbers are float64 numpy
over the written columns, and every knob is swept over more than one value (no threshold fitted to one dump).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from knobs import knob_dump

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.io import ReadOptions

BUGS = {"processed_logprobs", "logit_processor", "temperature_mismatch", "constant_fill", "shifted_streams",
        "identical_sides", "mask_covers_prompt"}


def run(path: Path, semantics: str = "verl", **read: object) -> dict:
    """The report as JSON (no bootstrap: no verdict reads it)."""
    options = ReadOptions(**read) if read else None
    return analyze([str(path)], CorrectionConfig(semantics=semantics), bootstrap=0, read_options=options).to_dict()


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def codes(report: dict) -> set[str]:
    return {f["code"] for f in report["findings"]}


@pytest.mark.parametrize(("knobs", "code"), [
    ({"top_k": 8}, "processed_logprobs"), ({"top_k": 40}, "processed_logprobs"),
    ({"min_p": 0.1}, "processed_logprobs"), ({"min_p": 0.3}, "processed_logprobs"),
    ({"penalty": 1.1}, "logit_processor"), ({"penalty": 1.2}, "logit_processor"),
    ({"temperature": 0.8}, "temperature_mismatch"), ({"temperature": 1.25}, "temperature_mismatch"),
])
def test_each_logit_processor_is_named_alone(tmp_path: Path, knobs: dict, code: str) -> None:
    path = tmp_path / "knob.parquet"
    data = knob_dump(path, **knobs)
    report = run(path)
    named = report["summary"]["diagnosis"]["code"]
    evidence = finding(report, named)["evidence"]
    if code == "logit_processor" and named == "processed_logprobs":
        # Too few tokens for the uncapped mean to separate 1 from the capped mean: the penalty is named beside
        # the truncation, never left out, and its settings are in the fix.
        assert evidence["or_penalty"] and "penalties" in report["recommendation"]["fix"]["text"]
        code = named
    assert named == code
    assert not codes(report) & (BUGS - {code})
    if code in ("processed_logprobs", "logit_processor"):
        d = (data["old"] - data["rollout"]).ravel()
        ratio = np.exp(np.clip(d, -20, 20))  # verl's clamp, as the report's sums take it
        assert evidence["uncapped_ratio_mean"] == pytest.approx(ratio.mean(), rel=1e-6)
        assert evidence["uncapped_ratio_mean_standard_error"] == pytest.approx(ratio.std(ddof=1) / np.sqrt(d.size),
                                                                               rel=1e-4)
        # Truncation keeps its kept mass uncapped (below 1); a penalty keeps the sampling identity (1).
        assert (evidence["uncapped_ratio_mean"] < 0.99) == ("penalty" not in knobs)
        assert evidence.get("or_penalty") == ("penalty" in knobs) if code == "processed_logprobs" else True


def test_a_penalty_is_fixed_in_the_trainers_own_words(tmp_path: Path) -> None:
    path = tmp_path / "penalty.parquet"
    knob_dump(path, penalty=1.2)
    for semantics, setting in (("verl", "repetition_penalty"), ("areal", "gconfig"), ("skyrl", "repetition_penalty")):
        fix = run(path, semantics)["recommendation"]["fix"]
        assert fix["code"] == "logit_processor" and setting in fix["text"], (semantics, fix["text"])
        assert "top_p" not in fix["text"] and "top-p" not in fix["text"]


def test_a_mask_covering_the_prompt_is_counted_exactly(tmp_path: Path) -> None:
    path = tmp_path / "prompt.parquet"
    data = knob_dump(path, noise=0.05, prompt=25, rows=60)
    rollout = data["rollout"]
    # The leading run of exact 0.0 rollout log-probs per row (the old side is never 0.0 here).
    lead = np.argmax(rollout != 0, axis=1)
    expected = int(lead.sum())
    for chunk_rows in (1024, 7):  # numbers never depend on chunking
        report = run(path, chunk_rows=chunk_rows)
        assert report["summary"]["diagnosis"]["code"] == "mask_covers_prompt"
        evidence = finding(report, "mask_covers_prompt")["evidence"]
        assert evidence["prefix_tokens"] == expected >= 25 * 60 and evidence["rows"] == 60
        assert "constant_fill" not in codes(report)  # the prompt's 0.0s are the mask's, not a fill
    assert "response mask" in report["recommendation"]["fix"]["text"]
    trl = run(path, "trl")["recommendation"]["fix"]
    assert trl["settings"] and "TRL" in trl["text"]


def lagged(path: Path, drift: float, column: str = "policy_version", lag: bool = False, per_token: bool = False,
           versions: int = 4) -> dict[str, np.ndarray]:
    rows = 160
    version = np.arange(rows) % versions
    value = versions - 1 - version if lag else version
    # AReaL writes one version per token, -1 on the prompt's: the row's oldest real one counts.
    extra = {column: [[-1, -1, *[int(v)] * 58] for v in value] if per_token else value.astype(np.int64)}
    return knob_dump(path, drift=drift, versions=versions, noise=0.02, rows=rows, extra=extra)


@pytest.mark.parametrize(("column", "lag", "per_token"), [("policy_version", False, False), ("staleness", True, False),
                                                          ("versions", False, True)])
def test_the_gap_per_policy_lag_is_numpys_and_a_growing_one_is_the_lag(tmp_path: Path, column: str, lag: bool,
                                                                       per_token: bool) -> None:
    path = tmp_path / "lag.parquet"
    data = lagged(path, drift=0.3, column=column, lag=lag, per_token=per_token)
    report = run(path)
    lags = finding(report, "policy_lag")["evidence"]["lags"]
    gap = np.abs(np.exp(data["old"]) - np.exp(data["rollout"]))
    for entry in lags:
        rows = (3 - data["version"]) == entry["lag"]
        assert entry["rows"] == rows.sum()
        assert entry["prob_abs_diff_mean"] == pytest.approx(gap[rows].mean(), rel=1e-6)
    assert [e["lag"] for e in lags] == [0, 1, 2, 3]
    diagnosis = report["summary"]["diagnosis"]
    assert diagnosis["kind"] == "lag" and diagnosis["code"] == "policy_lag"
    assert report["recommendation"]["fix"]["code"] == "policy_lag"
    assert report["recommendation"]["recipe"] is None  # the low-precision recipe answers precision only
    named = {c["cause"]: c["verdict"] for c in report["summary"]["causes"]}
    assert named["policy_lag"] == "named"


@pytest.mark.parametrize("noise", [0.15, 0.3])
def test_a_flat_gap_over_lags_is_precision_and_says_so(tmp_path: Path, noise: float) -> None:
    path = tmp_path / "flat.parquet"
    rows = 160
    knob_dump(path, noise=noise, rows=rows, extra={"policy_version": (np.arange(rows) % 4).astype(np.int64)})
    report = run(path)
    diagnosis = report["summary"]["diagnosis"]
    assert diagnosis["kind"] == "precision" and "not the policy lag" in diagnosis["title"]
    assert "lag_ruled_out" in codes(report)
    assert [f["code"] for f in report["recommendation"]["fixes"]] == ["precision_gap"]


def test_without_versions_precision_and_lag_are_named_together_with_what_tells_them_apart(tmp_path: Path) -> None:
    for name, knobs in (("noise", {"noise": 0.2}), ("stale", {"drift": 0.25, "versions": 2})):
        path = tmp_path / f"{name}.parquet"
        if name == "stale":  # every row from the older policy: a stale engine with no version column
            knob_dump(path, rows=120, **knobs)
            table = pq.read_table(path)
            rows = np.arange(table.num_rows) % 2 == 0
            pq.write_table(table.filter(pa.array(rows)), path)
        else:
            knob_dump(path, **knobs)
        report = run(path, "slime")
        diagnosis = report["summary"]["diagnosis"]
        assert diagnosis["kind"] == "precision" and "policy lag" in diagnosis["title"], name
        fixes = report["recommendation"]["fixes"]
        assert [f["code"] for f in fixes] == ["precision_gap", "lag_or_precision"]
        assert "weight sync" in fixes[1]["text"] and "--update-weights-interval" in fixes[1]["text"]
        verdicts = {c["cause"]: c["verdict"] for c in report["summary"]["causes"]}
        assert verdicts["policy_lag"] == "possible" and verdicts["precision"] == "named"
        assert verdicts["temperature"] == verdicts["truncation"] == "ruled out"


def repeats(ids: np.ndarray) -> np.ndarray:
    """bool [rows, positions]: the token id occurred earlier in its row (a plain loop: the reference)."""
    out = np.zeros(ids.shape, dtype=bool)
    for r, row in enumerate(ids):
        seen: set[int] = set()
        for t, token in enumerate(row.tolist()):
            out[r, t] = token in seen
            seen.add(token)
    return out


@pytest.mark.parametrize(("knobs", "code", "concentrated"), [
    ({"penalty": 1.1}, "logit_processor", True), ({"penalty": 1.5}, "logit_processor", True),
    ({"top_k": 8, "noise": 0.1}, "processed_logprobs", False),
    ({"min_p": 0.1, "noise": 0.1}, "processed_logprobs", False),
])
def test_token_ids_put_a_penalty_on_repeated_tokens(tmp_path: Path, knobs: dict, code: str,
                                                   concentrated: bool) -> None:
    path = tmp_path / "ids.parquet"
    data = knob_dump(path, ids=True, **knobs)
    report = run(path, chunk_rows=13)  # repeats are found within rows, whatever the chunking
    assert report["summary"]["diagnosis"]["code"] == code
    evidence = finding(report, code)["evidence"]["repetition"]
    repeated = repeats(data["ids"])
    up = data["old"] > data["rollout"]
    assert evidence["repeated_fraction"] == pytest.approx(repeated.mean())
    assert evidence["tail_tokens"] == up.sum()
    assert evidence["tail_repeated_fraction"] == pytest.approx(repeated[up].mean())
    assert evidence["concentrated"] == concentrated


def test_the_page_and_markdown_say_what_the_screen_says(tmp_path: Path) -> None:
    from mismatch_cli.render.html_lead import render_lead
    from mismatch_cli.render.markdown import render_markdown
    from mismatch_cli.render.summary import summary_lines

    path = tmp_path / "topk.parquet"
    knob_dump(path, top_k=8)
    report = analyze([str(path)], CorrectionConfig(), bootstrap=0)
    screen = " ".join(" ".join(text.split()) for text, _ in summary_lines(report))
    against = "ruled out: identical sides (0 % equal)"
    assert against in screen and "penalty (uncapped mean < 1)" in screen
    assert against in render_lead(report) and against in render_markdown(report)
