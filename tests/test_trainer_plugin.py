"""A trainer is a package: a toy one, installed beside mismatch through the entry-point group `mismatch_cli.trainers`,
is found, accepted by `--semantics` and `--set`, folded by the engine and reported under its own keys, with nothing
in the core touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mismatch_cli.correction import ReplayFamily
from mismatch_cli.correction.registry import _families

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "single_turn.parquet"

TOY = {
    "toy_trainer/__init__.py": '''
        from mismatch_cli.correction.model import ReplayFamily


        def resolve(fields):
            cap = float(fields.get("toy_cap", 2.0))
            return {"cap": cap}, {"toy_cap": cap}


        TRAINERS = (ReplayFamily(
            name="toy", title="Toy trainer", source="tests/test_trainer_plugin.py", defaults={"toy_cap": 2.0},
            kinds={"toy_cap": "number"}, resolve=resolve, describe=lambda c: f"toy_cap={c['toy_cap']}",
            lead_keys=("toy/capped_ratio_mean",), concepts={"weight_mean": "toy/capped_ratio_mean"},
            accumulator="toy_trainer.engine:ToyAccumulator", keys="toy_trainer.keys"),)
    ''',
    "toy_trainer/engine.py": '''
        import torch

        from mismatch_cli.engine.core.protocol import Accumulator, Contribution


        class ToyAccumulator(Accumulator):
            def __init__(self, settings, device):
                self.cap, self.total, self.tokens = settings["cap"], 0.0, 0

            def update(self, chunk, decisions):
                ratio = torch.exp(chunk.old.double() - chunk.rollout.double())
                self.total += float(torch.clamp(ratio, max=self.cap).sum())
                self.tokens += int(ratio.numel())

            def merge(self, other):
                self.total += other.total
                self.tokens += other.tokens

            def compute(self):
                return Contribution(metrics={"toy/capped_ratio_mean": self.total / self.tokens})
    ''',
    "toy_trainer/keys.py": '''
        from mismatch_cli.metrics.model import Direction, Family, Metric

        FAMILY = Family("toy trainer", "`--semantics toy`")
        METRICS = (Metric("toy/capped_ratio_mean", FAMILY, "token-mean over valid tokens", "ratio",
                          Direction.CLOSER_TO_1, "min(exp(old - rollout), toy_cap)"),)
    ''',
    "toy_trainer-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toy-trainer\nVersion: 0.1\n",
    "toy_trainer-0.1.dist-info/entry_points.txt": "[mismatch_cli.trainers]\ntoy = toy_trainer\n",
}


def _install(folder: Path) -> dict[str, str]:
    for name, text in TOY.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _mismatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mismatch_cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _capped_mean(cap: float) -> float:
    """The toy's key in float64 numpy, from the parquet's own columns (every valid token is finite there)."""
    table = pq.read_table(SAMPLE).to_pydict()
    old = np.concatenate([np.asarray(r, dtype=np.float64) for r in table["old_log_probs"]])
    rollout = np.concatenate([np.asarray(r, dtype=np.float64) for r in table["rollout_log_probs"]])
    mask = np.concatenate([np.asarray(r, dtype=bool) for r in table["response_mask"]])
    ratio = np.exp(old[mask] - rollout[mask])
    return float(np.minimum(ratio, cap).mean())


def test_a_toy_trainer_registers_without_touching_the_core(tmp_path: Path) -> None:
    env = _install(tmp_path)
    done = _mismatch(env, "analyze", str(SAMPLE), "--semantics", "toy", "--set", "toy_cap=1.5", "--format", "json",
                     "--dtype", "float64")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["config"]["toy_cap"] == 1.5
    assert report["metrics"]["toy/capped_ratio_mean"] == pytest.approx(_capped_mean(1.5), rel=1e-12)
    listed = _mismatch(env, "metrics", "toy/capped_ratio_mean")
    assert listed.returncode == 0 and "min(exp(old - rollout), toy_cap)" in listed.stdout
    refused = _mismatch(env, "analyze", str(SAMPLE), "--semantics", "toy", "--set", "toy_cup=1")
    assert refused.returncode == 2 and "toy_cap" in refused.stderr


def test_a_broken_trainer_is_skipped_with_one_line(tmp_path: Path) -> None:
    env = _install(tmp_path)
    (tmp_path / "toy_trainer" / "__init__.py").write_text("raise ImportError('no toy today')\n")
    done = _mismatch(env, "analyze", str(SAMPLE), "--semantics", "trl", "--format", "json")
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if "toy" in line]
    assert lines == ["warning: skipped the trainer of entry point toy = toy_trainer (mismatch_cli.trainers): "
                     "ImportError: no toy today"]


def test_what_a_trainer_package_may_provide() -> None:
    family = ReplayFamily("x", "X", "src", {}, {}, lambda f: (None, {}), lambda c: "")
    assert _families(family, "here") == [family]
    assert _families((family, family), "here") == [family, family]
    with pytest.raises(TypeError, match="provides no ReplayFamily"):
        _families("not a trainer", "entry point bad")
