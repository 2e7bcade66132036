"""Golden output: whole terminal outputs of analyze (summary and --full), compare (two and three runs), check,
replay, presets and metrics at 80 and 120 columns.

After an intended change to what a command prints, regenerate the snapshots with

    MISMATCH_UPDATE_GOLDEN=1 python -m pytest tests/golden

and review the diff of `tests/golden/snapshots/` before committing it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("MISMATCH_UPDATE_GOLDEN") == "1"
FAST = ("--device", "cpu", "--bootstrap", "0")
# Each case: a name and the argv, run from the repository root so paths print the same everywhere.
CASES = {
    "analyze_single_turn": ("analyze", "sample_data/single_turn.parquet", *FAST),
    "analyze_multi_turn": ("analyze", "sample_data/multi_turn.parquet", *FAST),
    "analyze_preset": ("analyze", "sample_data/single_turn.parquet", "--preset", "decoupled_geo_rs_token_tis", *FAST),
    "analyze_multi_turn_full": ("analyze", "sample_data/multi_turn.parquet", "--full", *FAST),
    "analyze_preset_full": ("analyze", "sample_data/single_turn.parquet", "--preset", "decoupled_geo_rs_token_tis",
                            "--full", *FAST),
    "compare": ("compare", "sample_data/single_turn.parquet", "sample_data/multi_turn.parquet", *FAST),
    "compare_3way": ("compare", "sample_data/single_turn.parquet", "sample_data/multi_turn.parquet",
                     "sample_data/packed.safetensors", *FAST),
    "check": ("check", "sample_data/multi_turn.parquet", "--fail-on", "abs(rollout_corr/kl)<=0.01",
              "--fail-on", "rollout_corr/chi2_token<=1", *FAST),
    "replay": ("replay", "sample_data/real/top_p_bug.parquet", "--trainers", "verl,xtuner,trl", "--device", "cpu"),
    "presets": ("presets",),
    "metrics": ("metrics", "chi2"),
}


def _run(argv: tuple[str, ...], width: int) -> str:
    env = {"COLUMNS": str(width), "NO_COLOR": "1", "FORCE_COLOR": None, "TERM": "dumb", "MISMATCH_DEBUG": None}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = CliRunner(env=env).invoke(app, list(argv))
    finally:
        os.chdir(cwd)
    assert result.exit_code in (0, 1), result.output
    # Trailing spaces are rich's padding, not content.
    return re.sub(r"[ \t]+$", "", result.stdout, flags=re.M)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", list(CASES))
def test_output_matches_snapshot(name: str, width: int) -> None:
    output = _run(CASES[name], width)
    snapshot = SNAPSHOTS / f"{name}_{width}.txt"
    if UPDATE:
        snapshot.write_text(output)
    assert snapshot.exists(), f"no snapshot {snapshot.name}: run MISMATCH_UPDATE_GOLDEN=1 python -m pytest tests/golden"
    assert output == snapshot.read_text(), (
        f"{name} at {width} columns differs from {snapshot.name}; if the change is intended, run "
        "MISMATCH_UPDATE_GOLDEN=1 python -m pytest tests/golden and review the diff")


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", list(CASES))
def test_output_fits_its_width(name: str, width: int) -> None:
    lines = _run(CASES[name], width).splitlines()
    assert max(map(len, lines), default=0) <= width
