"""verl's parity cases through the CLI: parquet written from the case, config from a TOML file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import close, verl_case_params
from typer.testing import CliRunner

from mismatch_cli.cli import app

NUMERIC, ERRORS, NUMERIC_IDS, ERROR_IDS = verl_case_params()
TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (1e-3, 1e-5)}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_case(case: dict, folder: Path, semantics: str = "verl") -> tuple[Path, Path]:
    """The case as a wide parquet (list<double>) plus a [correction] TOML with its semantics and kwargs."""
    table = pa.table({
        "old_log_probs": pa.array(case["old_log_prob"], type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(case["rollout_log_prob"], type=pa.list_(pa.float64())),
        "response_mask": pa.array(case["response_mask"], type=pa.list_(pa.float64())),
    })
    dump = folder / "case.parquet"
    pq.write_table(table, dump)
    lines = ["[correction]", f"semantics = {json.dumps(semantics)}"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in case["kwargs"].items() if v is not None]
    config = folder / "mismatch.toml"
    config.write_text("\n".join(lines) + "\n")
    return dump, config


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("semantics", "case"), NUMERIC, ids=NUMERIC_IDS)
def test_cli_matches_verl(semantics: str, case: dict, dtype: str, tmp_path: Path) -> None:
    dump, config = write_case(case, tmp_path, semantics)
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


@pytest.mark.parametrize(("semantics", "case"), ERRORS, ids=ERROR_IDS)
def test_cli_error_cases_exit_with_a_message(semantics: str, case: dict, tmp_path: Path) -> None:
    dump, config = write_case(case, tmp_path, semantics)
    result = CliRunner().invoke(app, ["analyze", str(dump), "--config", str(config), "--out-dir",
                                      str(tmp_path / "out")])
    expected = 3 if case["name"] == "ERR_all_zero_mask" else 2
    assert result.exit_code == expected, result.output
    assert isinstance(result.exception, SystemExit)
    message = result.stderr.strip()
    assert message.startswith("error: ") and len(message.splitlines()) == 1
    assert not (tmp_path / "out" / "report.json").exists()
