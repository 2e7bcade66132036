"""The one-screen summary `mismatch analyze` prints by default: it names the cause, recommends a correction
whose after-health is in band, reports drift and bug signatures, fits its width and never splits a number."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.render.cells import format_value

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "multi_turn.parquet"


def screen(*args: object, width: int = 80) -> str:
    env = {"COLUMNS": str(width), "NO_COLOR": "1", "TERM": "dumb", "MISMATCH_DEBUG": None, "FORCE_COLOR": None}
    result = CliRunner(env=env).invoke(app, ["analyze", *map(str, args), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return result.stdout


def largest_token(path: Path) -> tuple[int, int, float, int]:
    """Row, position, Δ of the largest Δ = old - rollout among masked tokens (chi2's largest term), and how many
    have Δ >= 8 (numpy)."""
    table = pq.read_table(path)
    best = (-1, -1, -np.inf)
    big = 0
    for row, (old, rollout, mask) in enumerate(zip(*(table[c].to_pylist() for c in (
            "old_log_probs", "rollout_log_probs", "response_mask")), strict=True)):
        delta = np.asarray(old, np.float64) - np.asarray(rollout, np.float64)
        delta[np.asarray(mask) == 0] = -np.inf
        big += int((delta >= 8).sum())
        if delta.max() > best[2]:
            best = (row, int(delta.argmax()), float(delta.max()))
    return (*best, big)


def test_the_first_screen_names_the_cause_and_a_correction_that_works(monkeypatch) -> None:
    # From the repository root with a relative path, so the screen is the same wherever the checkout lives.
    monkeypatch.chdir(ROOT)
    text = screen("sample_data/multi_turn.parquet", "--bootstrap", "0")
    lines = text.splitlines()
    assert len(lines) <= 48 and max(map(len, lines)) <= 80  # the fix also in the trainer's own overrides
    row, position, delta, big = largest_token(SAMPLE)
    assert text.index("Health: WARNING") < text.index("Why") < text.index("What to do")
    flat = " ".join(text.split())
    assert f"{big} tokens" in flat and "χ²_token" in flat
    assert f"multi_turn.parquet:{row}:{position}" in flat and f"Δ {delta:+.3g}" in flat
    advice = re.search(r"turn on .*?: (--is \S+ --is-threshold \S+)", flat)
    assert advice is not None and "health after: HEALTHY" in flat
    corrected = screen("sample_data/multi_turn.parquet", *advice.group(1).split(), "--bootstrap", "0")
    assert "Health: HEALTHY" in corrected
    assert "before the correction (raw ratios): WARNING" in " ".join(corrected.split())


@pytest.mark.parametrize("width", [60, 80, 120])
def test_no_number_or_key_is_split_at_any_width(width: int, monkeypatch) -> None:
    # A relative path, as a user types it: a single word longer than the terminal (a deep absolute path)
    # is never broken, so only such a word may overflow.
    monkeypatch.chdir(ROOT)
    text = screen("sample_data/multi_turn.parquet", "--bootstrap", "20", width=width)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width
    from mismatch_cli import analyze

    report = analyze(["sample_data/multi_turn.parquet"], device="cpu", bootstrap=20)  # the same name: the same draws
    numbers = [format_value(c["value"]) for c in report.summary["checks"]]
    numbers += [format_value(v) for v in report.intervals.get("rollout_corr/k3_kl", [])]
    for number in numbers:
        assert any(re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", line) for line in lines), number
    for key in ("k3_kl", "chi2_seq", "ppl_ratio", "decoupled_token_is"):
        assert any(key in line for line in lines), key


def test_full_prints_every_table() -> None:
    text = screen(SAMPLE, "--full", "--bootstrap", "0")
    assert "Off-policy (rollout_corr/)" in text and "What to do" not in text


def _write(path: Path, old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, steps: np.ndarray | None = None) -> None:
    columns = {"old_log_probs": pa.array(old.tolist(), type=pa.list_(pa.float64())),
               "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
               "response_mask": pa.array(mask.astype(np.int8).tolist(), type=pa.list_(pa.int8()))}
    if steps is not None:
        columns["step"] = pa.array(steps.tolist(), type=pa.int64())
    pq.write_table(pa.table(columns), path)


def test_a_drifting_run_shows_its_trend(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows_per_step, width, steps = 40, 24, 12
    step = np.repeat(np.arange(steps), rows_per_step)
    rollout = -rng.exponential(0.5, size=(step.size, width))
    # k1 = mean(rollout - old) grows from about 0.01 to 0.2 over the steps: out of band (|kl| <= 0.1) at the end.
    shift = np.linspace(0.01, 0.2, steps)[step][:, None]
    old = rollout - shift + rng.normal(0, 0.01, size=rollout.shape)
    mask = np.ones_like(rollout, dtype=bool)
    path = tmp_path / "drift.parquet"
    _write(path, old, rollout, mask, step)
    flat = " ".join(screen(path, "--by", "step", "--bootstrap", "0").split())
    assert "Drift over steps" in flat
    kl = re.search(r"(?<!\w)kl: (\S+) per step \[(\S+), (\S+)\]; out of band from step (\d+)", flat)
    assert kl is not None, flat
    slope, low, high = (float(v) for v in kl.groups()[:3])
    expected = np.polyfit(np.arange(steps), np.linspace(0.01, 0.2, steps), 1)[0]  # verl's kl = mean(rollout - old)
    assert low <= expected <= high and low > 0 and slope == pytest.approx(expected, rel=0.05)
    first = int(np.argmax(np.linspace(0.01, 0.2, steps) > 0.1))
    assert int(kl.group(4)) == pytest.approx(first, abs=1)


def test_a_zero_filled_rollout_side_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    old = -rng.exponential(0.6, size=(80, 32))
    rollout = old + rng.normal(0, 0.01, size=old.shape)
    rollout[:, 16:] = 0.0  # the engine's log-probs were padded with zeros past position 16
    path = tmp_path / "zeros.parquet"
    _write(path, old, rollout, np.ones_like(old, dtype=bool))
    text = screen(path, "--bootstrap", "0")
    section = text[text.index("Dump checks"):]
    assert "none found" not in section.splitlines()[1] and "0.0" in " ".join(section.split())


def test_the_readme_shows_the_real_first_screen(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the README runs it from the repository root, with a relative path
    readme = (ROOT / "README.md").read_text()
    block = readme.split("`mismatch analyze sample_data/real/top_p_bug.parquet`):\n\n```\n", 1)[1]
    shown = block.split("\n...\n```", 1)[0].splitlines()
    assert shown == screen("sample_data/real/top_p_bug.parquet", "--bootstrap", "0").splitlines()[:len(shown)]
