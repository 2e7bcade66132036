"""The flags that reach the library's newer parts: `--format csv`/`--table`, `--by` and rules over steps in
`check`/`compare`, `--min-difference`; expected values from float64 numpy over the dump."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_check import assert_exit, invoke


def write_run(path: Path, scale: float = 1.0) -> dict[int, float]:
    """Three steps whose log-ratio scale grows with the step; returns the per-step verl kl, from numpy."""
    rng = np.random.default_rng(7)
    rows, width = 90, 12
    rollout = -rng.exponential(0.4, size=(rows, width))
    step = np.repeat([1, 2, 3], rows // 3)
    delta = rng.normal(0.1, 1.0, size=(rows, width)) * (0.002 * scale * step[:, None])
    lengths = rng.integers(1, width + 1, size=rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    pq.write_table(pa.table({
        "old_log_probs": pa.array((rollout + delta).tolist(), type=pa.list_(pa.float64())),
        "rollout_log_probs": pa.array(rollout.tolist(), type=pa.list_(pa.float64())),
        "response_mask": pa.array(mask.astype(np.int8).tolist(), type=pa.list_(pa.int8())),
        "step": pa.array(step.tolist(), type=pa.int64()),
    }), path)
    return {int(s): float(-delta[step == s][mask[step == s]].sum() / (mask[step == s].sum() + 1e-8)) for s in (1, 2, 3)}


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("wiring")
    kl = write_run(root / "run.parquet")
    write_run(root / "slightly_worse.parquet", scale=1.05)
    return {"path": root / "run.parquet", "worse": root / "slightly_worse.parquet", "kl": kl}


def test_csv_prints_the_step_table_at_full_precision(stepped) -> None:
    result = invoke("analyze", stepped["path"], "--by", "step", "--format", "csv", "--dtype", "float64",
                    "--device", "cpu", "--bootstrap", "0")
    assert_exit(result, 0)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    for r in rows:
        assert float(r["rollout_corr/kl"]) == pytest.approx(stepped["kl"][int(r["step"])], rel=1e-9)


def test_csv_table_flag_and_its_misuse(stepped, tmp_path: Path) -> None:
    result = invoke("analyze", stepped["path"], "--format", "csv", "--table", "metrics", "--bootstrap", "0")
    assert_exit(result, 0)
    assert result.stdout.splitlines()[0].startswith("metric,")
    assert_exit(invoke("analyze", stepped["path"], "--table", "steps"), 2)
    assert_exit(invoke("analyze", stepped["path"], "--format", "csv", "--table", "nope"), 2)
    out = tmp_path / "out"
    assert_exit(invoke("analyze", stepped["path"], "--by", "step", "--out-dir", out, "--no-plots",
                       "--bootstrap", "0"), 0)
    assert {"report.json", "steps.csv", "rounds.csv"} <= {p.name for p in out.iterdir()}


def test_check_rule_over_steps_names_the_worst_step(stepped) -> None:
    worst = max(stepped["kl"], key=lambda s: abs(stepped["kl"][s]))
    limit = abs(stepped["kl"][worst]) * 0.99
    result = invoke("check", stepped["path"], "--fail-on", f"max(step:abs(kl))<={limit}", "--format", "json",
                    "--dtype", "float64", "--device", "cpu", "--bootstrap", "0")
    assert_exit(result, 1)
    rule = json.loads(result.stdout)["rules"][0]
    assert rule["value"] == pytest.approx(abs(stepped["kl"][worst]), rel=1e-9)
    assert f"at step {worst}" in rule["message"]
    passing = invoke("check", stepped["path"], "--fail-on", f"max(step:abs(kl))<={limit / 0.98}",
                     "--bootstrap", "0")
    assert_exit(passing, 0)


def test_compare_min_difference_marks_a_small_change_same(stepped) -> None:
    def kl_mark(*flags: str) -> str:
        body = json.loads(invoke("compare", stepped["path"], stepped["worse"], *flags, "--format", "json",
                                 "--bootstrap", "0").stdout)
        return {r["metric"]: r["mark"] for r in body["metrics"]}["rollout_corr/kl"]

    assert kl_mark() == "="  # |kl| 5 % larger: inside the registry's 10 % default, so not called worse
    assert kl_mark("--min-difference", "kl=none") == "+"  # every change counts: worse (no intervals to overlap)
    assert kl_mark("--min-difference", "kl=1%") == "+"
    assert_exit(invoke("compare", stepped["path"], stepped["path"], "--min-difference", "nokey=1"), 2)


def test_cli_choices_list_what_the_library_knows() -> None:
    # The CLI spells these out (importing the library would slow `--help`); they must not drift apart.
    from mismatch_cli.cli.options import InputFormat, Semantics
    from mismatch_cli.correction import FAMILIES
    from mismatch_cli.io import READERS
    from mismatch_cli.io.detect import FORMAT_NAMES

    assert tuple(s.value for s in Semantics) == FAMILIES
    assert tuple(f.value for f in InputFormat if f.value != "auto") == FORMAT_NAMES == READERS
