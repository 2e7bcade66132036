"""verl's parity cases through the CLI: parquet written from the case, config from a TOML file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import close, load_verl_cases
from typer.testing import CliRunner

from mismatch_cli.cli import app

CASES = load_verl_cases()["cases"]
NUMERIC = [c for c in CASES if not c["name"].startswith("ERR")]
ERRORS = [c for c in CASES if c["name"].startswith("ERR")]
TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (1e-3, 1e-5)}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_case(case: dict, folder: Path) -> tuple[Path, Path]:
    """The case as a wide parquet (list<double>) plus a [correction] TOML with its kwargs."""
    table = pa.table({
        "old_log_probs": pa.array(case["old_log_prob"], type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(case["rollout_log_prob"], type=pa.list_(pa.float64())),
        "response_mask": pa.array(case["response_mask"], type=pa.list_(pa.float64())),
    })
    dump = folder / "case.parquet"
    pq.write_table(table, dump)
    lines = ["[correction]"] + [f"{k} = {_toml_value(v)}" for k, v in case["kwargs"].items() if v is not None]
    config = folder / "mismatch.toml"
    config.write_text("\n".join(lines) + "\n")
    return dump, config


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", NUMERIC, ids=[c["name"] for c in NUMERIC])
def test_cli_matches_verl(case: dict, dtype: str, tmp_path: Path) -> None:
    dump, config = write_case(case, tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--dtype", dtype,
                                      "--format", "json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert isinstance(result.exception, (SystemExit, type(None)))
    metrics = json.loads(result.stdout)["metrics"]
    rel, abs_ = TOLERANCE[dtype]
    reference = case["fp64"]["metrics"]
    assert {k for k in metrics if k.startswith("rollout_corr/")} == set(reference)
    wrong = {k: (metrics[k], v) for k, v in reference.items() if not close(metrics[k], v, rel, abs_)}
    assert not wrong


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_cli_error_cases_exit_with_a_message(case: dict, tmp_path: Path) -> None:
    dump, config = write_case(case, tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--out-dir",
                                      str(tmp_path / "out")])
    expected = 3 if case["name"] == "ERR_all_zero_mask" else 2
    assert result.exit_code == expected, result.output
    assert isinstance(result.exception, SystemExit)
    message = result.stderr.strip()
    assert message.startswith("error: ") and len(message.splitlines()) == 1
    assert not (tmp_path / "out" / "report.json").exists()
