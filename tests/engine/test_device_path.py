"""The device path's torch kernels, run on the CPU (CI has no GPU): the same numbers as numpy's CPU path.

On a GPU the engine takes torch kernels where the CPU takes numpy's (`engine/ops.numpy_kernels`).
`torch_kernels_on_cpu` sends the CPU down that path, so a kernel torch lacks for a dtype, or a formula
that differs between the two paths, fails here and not first on a user's GPU.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import REFERENCE, assert_same_tree, batch_from_padded, case_batch

from mismatch_cli.correction import CorrectionConfig, resolve, resolve_family
from mismatch_cli.engine.kernels.ops import segment_sum, segment_sum_torch, torch_kernels_on_cpu
from mismatch_cli.engine.runner import run
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

FAMILY_FILES = ("trl", "skyrl", "slime", "nemo_rl", "prime_rl", "areal", "openrlhf", "ms_swift", "miles")


def _numpy_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    starts = np.concatenate(([0], np.cumsum(lengths)))
    return np.array([values[a:b].astype(np.float64).sum() for a, b in zip(starts[:-1], starts[1:], strict=True)])


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64, torch.float32, torch.float64])
def test_segment_sum_in_torch_kernels_matches_numpy(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(3)
    lengths = np.array([0, 3, 1, 0, 7, 2, 0], dtype=np.int64)
    raw = rng.integers(0, 5, int(lengths.sum())) if dtype != torch.bool else rng.random(int(lengths.sum())) > 0.5
    values = torch.from_numpy(np.asarray(raw)).to(dtype)
    want = _numpy_sums(np.asarray(raw), lengths)
    got = segment_sum_torch(values, torch.from_numpy(lengths))
    assert not got.is_floating_point() or dtype.is_floating_point
    np.testing.assert_array_equal(got.double().numpy(), want)
    np.testing.assert_array_equal(segment_sum(values, torch.from_numpy(lengths)).double().numpy(), want)
    if dtype.is_floating_point:
        wide = segment_sum_torch(values, torch.from_numpy(lengths), torch.float64)
        assert wide.dtype == torch.float64
        np.testing.assert_array_equal(wide.numpy(), want)


def _agree(ours: dict, want: dict, rel: float) -> list[str]:
    bad = []
    for key, value in want.items():
        got = ours.get(key)
        if value is None or got is None:
            if (value is None) != (got is None):
                bad.append(f"{key}: {got} vs {value}")
            continue
        # A correlation is a difference of moment sums: near 0 its last digits are rounding residue.
        floor = 1e-6 if key.endswith("_corr") else 1e-12
        if not (math.isclose(got, value, rel_tol=rel, abs_tol=floor) or (math.isnan(got) and math.isnan(value))):
            bad.append(f"{key}: {got} vs {value}")
    return bad


def _family_cases() -> list[tuple[str, dict]]:
    picked = []
    for name in FAMILY_FILES:
        cases = json.loads((REFERENCE / f"{name}_parity_cases.json").read_text())["cases"]
        numeric = [c for c in cases if "error" not in c["fp64"] and np.any(np.asarray(c["response_mask"]))]
        picked += [(name, c) for c in numeric[::4]]
    return picked


FAMILY_CASES = _family_cases()


@pytest.mark.parametrize("family, case", FAMILY_CASES, ids=[f"{n}:{c['name']}" for n, c in FAMILY_CASES])
def test_every_family_gives_the_same_numbers_through_torch_kernels(family: str, case: dict) -> None:
    semantics = case.get("family") or family.replace("_", "-")
    correction, _ = resolve_family(semantics, dict(case.get("settings") or {}))
    batch = case_batch(case)
    host = run([batch], correction, device="cpu", dtype="float64").overall.metrics
    with torch_kernels_on_cpu():
        kernels = run([batch], correction, device="cpu", dtype="float64").overall.metrics
    assert set(kernels) == set(host)
    assert not _agree(kernels, host, 1e-9)


VERL_CASES = [c for c in json.loads((REFERENCE / "verl_parity_cases.json").read_text())["cases"][::3]
              if not c["name"].startswith("ERR")]


@pytest.mark.parametrize("case", VERL_CASES, ids=[c["name"] for c in VERL_CASES])
def test_verl_cases_give_the_same_numbers_through_torch_kernels(case: dict) -> None:
    correction = resolve(CorrectionConfig(**case["kwargs"]))
    batch = batch_from_padded(case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
    host = run([batch], correction, device="cpu", dtype="float64").overall.metrics
    with torch_kernels_on_cpu():
        kernels = run([batch], correction, device="cpu", dtype="float64").overall.metrics
    assert not _agree(kernels, host, 1e-9)


@pytest.mark.parametrize("config", [
    CorrectionConfig(),
    CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                     rollout_rs_threshold="0.999_1.001,0.5"),
], ids=["default", "full"])
def test_the_whole_engine_gives_the_same_report_through_torch_kernels(config: CorrectionConfig, tmp_path) -> None:
    write_synthetic_dump(tmp_path / "d.parquet", SynthSpec(tokens=60_000, turns=3, seed=5, steps=3))
    batches = list(iter_batches(discover_inputs([str(tmp_path / "d.parquet")]), ReadOptions(chunk_rows=16)))
    host = run(batches, resolve(config), device="cpu", dtype="float64", by_step=True)
    with torch_kernels_on_cpu():
        kernels = run(batches, resolve(config), device="cpu", dtype="float64", by_step=True)
    assert not _agree(kernels.overall.metrics, host.overall.metrics, 1e-9)
    for step, part in host.steps.items():
        assert not _agree(kernels.steps[step].metrics, part.metrics, 1e-9)


def test_worst_tokens_placed_on_the_device_are_placed_as_on_the_host() -> None:
    # The device places its candidates itself (row, position, round) and defers their read across merges.
    from test_sweep import dirty_batch

    from mismatch_cli.engine.kernels import sweep

    rounds = set()
    for seed in range(6):
        batches = [dirty_batch(seed, steps=True, turns=4), dirty_batch(seed + 50, rows=20, steps=True),
                   dirty_batch(seed + 90, steps=True, turns=2)]
        with sweep.forced(False):
            host = run(batches, resolve(CorrectionConfig()), device="cpu", by_step=True)
        with torch_kernels_on_cpu():
            device = run(batches, resolve(CorrectionConfig()), device="cpu", by_step=True)
        for kind in ("worst_token", "max_log_ratio_token"):
            assert device.overall.signatures[kind] == host.overall.signatures[kind]
            for step, part in host.steps.items():
                assert device.steps[step].signatures[kind] == part.signatures[kind]
                rounds.add(part.signatures[kind]["round"])
    assert len(rounds) > 2  # later rounds are placed too, not only round 0


def test_the_device_path_reads_the_host_only_where_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU every host read waits for the device. Run the device path's kernels here and record every call
    # that would read the host (or size a result there): only the planned ones may remain.
    import traceback

    from test_sweep import TABLES, dirty_batch

    from mismatch_cli.engine.runner import Analysis

    sites: set[str] = set()

    config = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True,
                              rollout_rs="seq_mean_k1,token_k3,seq_max_k2", rollout_rs_threshold="0.999_1.001,0.5,2.0")
    # At most 4 rounds a row: rows of many rounds keep their high rounds sparse, which does read the host.
    batches = [dirty_batch(seed, rows=60, steps=True, turns=turns) for seed, turns in ((1, 1), (2, 4), (3, 3))]
    with torch_kernels_on_cpu():
        analysis = Analysis(resolve(config), torch.device("cpu"), "float64", by_step=True)
        analysis.join_batches, analysis.chunk_positions = True, 4000  # as on a GPU: joined chunks
        with monkeypatch.context() as patch:

            def recording(owner: object, name: str, when=None) -> None:  # noqa: ANN001
                original = getattr(owner, name)

                def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                    if when is None or when(*args):
                        ours = [f for f in traceback.extract_stack()[:-1] if "mismatch_cli" in f.filename]
                        if ours:
                            sites.add(f"{ours[-1].filename.split('mismatch_cli/')[-1]}:{ours[-1].name}")
                    return original(*args, **kwargs)
                patch.setattr(owner, name, call)

            for name in ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__int__", "__float__"):
                recording(torch.Tensor, name)
            for name in ("bincount", "nonzero", "unique", "masked_select"):
                recording(torch, name)
            recording(torch.Tensor, "__getitem__", lambda _, i: isinstance(i, torch.Tensor) and i.dtype == torch.bool)
            for batch in batches:
                analysis.update(batch)
            analysis.flush()
        device = analysis.finish()
    planned = {"engine/core/segments.py:_layout_by_passes",  # the chunk's one combined count
               "engine/accumulators/worst.py:_drain",  # the worst rows, copied without waiting and read a chunk later
               "engine/accumulators/worst_token.py:resolve"}  # the worst tokens' candidates, once every 16 chunks
    assert sites <= planned, sites - planned
    host = run(batches, resolve(config), device="cpu", dtype="float64", by_step=True)
    for name in TABLES:
        assert_same_tree(getattr(host.overall, name), getattr(device.overall, name), 1e-9, name)
