"""xtuner over several packs (one pack = one dump file): the 12 cases merged by xtuner's own code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REFERENCE
from legacy_cases import matches
from typer.testing import CliRunner

from mismatch_cli.batch import Batch
from mismatch_cli.cli import app
from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.runner import run

CASES = json.loads((REFERENCE / "xtuner_multipack_cases.json").read_text())["cases"]
IDS = [c["id"] for c in CASES]
# One known deviation: in this case upstream's third pack reaches the merge with a rollout_is_std one
# float32 step above ours (0.2011242956 vs 0.2011242807 after rounding), although our per-pack std
# matches an independent float64 numpy evaluation of the formula to 1e-15. Held to one float32 step.
FLOAT32_STEP = {("xtuner-2025-12-29-3packs-geometric-both", "mismatch/rollout_is_std")}


def _wrong(case: dict, metrics: dict) -> dict:
    wrong = {}
    for key, expected in case["expected_float64"].items():
        rel = 2.0**-23 if (case["id"], key) in FLOAT32_STEP else 1e-9
        if not matches(metrics.get(key), expected, rel, 1e-12):
            wrong[key] = (metrics.get(key), expected)
    return wrong


def _pack_batch(pack: dict, source: str) -> Batch:
    lengths = [len(row) for row in pack["old_log_probs"]]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = {k: np.concatenate([np.asarray(r, dtype=np.float64) for r in pack[k]]) for k in pack}
    return Batch(flat["old_log_probs"], flat["rollout_log_probs"], flat["response_mask"] != 0, offsets, source=source)


def _fields(case: dict) -> dict:
    return {**case["fields"], "mask_dtype": case["mask_dtype"]}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_engine_merges_packs_as_xtuner_does(case: dict) -> None:
    batches = [_pack_batch(pack, f"pack{i}") for i, pack in enumerate(case["packs"])]
    correction = resolve(CorrectionConfig(semantics=case["family"], family_fields=_fields(case)))
    metrics = run(batches, correction, device="cpu", dtype="float64").overall.metrics
    assert not _wrong(case, metrics)


@pytest.mark.parametrize("case", CASES[1::3], ids=IDS[1::3])
def test_cli_merges_one_pack_per_file(case: dict, tmp_path: Path) -> None:
    for i, pack in enumerate(case["packs"]):
        table = pa.table({k: pa.array(v, type=pa.list_(pa.float64())) for k, v in pack.items()})
        pq.write_table(table, tmp_path / f"pack{i}.parquet")
    lines = ["[correction]", f'semantics = "{case["family"]}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in _fields(case).items()]
    (tmp_path / "mismatch.toml").write_text("\n".join(lines) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("pack*.parquet"))
    result = CliRunner().invoke(app, ["analyze", *files, "--config", str(tmp_path / "mismatch.toml"),
                                      "--dtype", "float64", "--format", "json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert not _wrong(case, json.loads(result.stdout)["metrics"])
