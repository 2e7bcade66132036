"""The fused GPU sweep (engine/kernels/sweep_gpu.py), run in Triton's interpreter on the CPU (CI has no GPU): the same
numbers as numpy's passes and as the fused CPU sweep, on every kind of chunk."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from helpers import assert_same_tree
from test_sweep import TABLES, dirty_batch

from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.accumulators.signatures import FILL_LOG_RATIO, SLOPE_BINS, SLOPE_RANGE, TAIL_NATS
from mismatch_cli.engine.core.chunk import _safe_ratio_bounds, make_chunk
from mismatch_cli.engine.kernels import sweep, sweep_gpu
from mismatch_cli.engine.kernels.ops import torch_kernels_on_cpu
from mismatch_cli.engine.runner import run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                                reason="needs Triton, and a machine without a GPU (its interpreter runs here)")


# One seed per configuration: Triton's interpreter takes about 2.5 s a case on the 2-core machine.
@pytest.mark.parametrize(("seed", "config"), [(1, {}), (2, {"rollout_is": "token", "rollout_is_threshold": 2.0,
                                                            "rollout_rs": "seq_mean_k1,token_k3",
                                                            "rollout_rs_threshold": "1.01,0.5"})],
                         ids=["default", "full"])
def test_gpu_sweep_gives_the_numpy_passes_results(seed: int, config: dict) -> None:
    # Against numpy's passes: the interpreter takes numpy's exp, as they do (torch's CPU exp differs in an ulp).
    batches = [dirty_batch(seed, steps=True), dirty_batch(seed + 10, rows=7, steps=True),
               dirty_batch(seed + 20, steps=True, turns=4)]
    correction = resolve(CorrectionConfig(**config))
    with sweep.forced(False):
        numpy_path = run(batches, correction, device="cpu", by_step=True)
    with torch_kernels_on_cpu(), sweep_gpu.interpreted():
        fused = run(batches, correction, device="cpu", by_step=True)
    for name in TABLES:
        assert_same_tree(getattr(numpy_path.overall, name), getattr(fused.overall, name), 1e-9, name)
    for step, result in numpy_path.steps.items():
        assert_same_tree(result.metrics, fused.steps[step].metrics, 1e-9, f"step {step}")


@pytest.mark.skipif(not sweep.available(), reason="numba is not installed")
@pytest.mark.parametrize("seed", [4, 5])
def test_gpu_sweep_sums_equal_the_cpu_sweeps(seed: int) -> None:
    chunk = make_chunk(dirty_batch(seed, rows=60), torch.device("cpu"), torch.float32)
    arguments = (chunk.old, chunk.rollout, chunk.ratio_safe, chunk.ratio_safe_sq)
    with sweep.forced(True):
        want = sweep.token_sums(*(a.numpy() for a in (chunk.old, chunk.rollout, chunk.log_ratio,
                                                       chunk.abs_log_ratio, chunk.ratio_safe, chunk.ratio_safe_sq)),
                                chunk.lengths.numpy(), chunk.layout.keep.numpy(), chunk.offsets, FILL_LOG_RATIO,
                                TAIL_NATS, SLOPE_BINS / SLOPE_RANGE, SLOPE_BINS)
        low, high = (float(b) for b in _safe_ratio_bounds(torch.float32, torch.device("cpu")))
        want_rows, _ = sweep.segment_sums(chunk.old.numpy(), chunk.rollout.numpy(), chunk.ratio.numpy(), low, high,
                                          chunk.lengths.numpy())
    with torch_kernels_on_cpu(), sweep_gpu.interpreted():
        got = sweep_gpu.token_sums(*arguments, chunk.lengths, FILL_LOG_RATIO, TAIL_NATS, SLOPE_BINS / SLOPE_RANGE,
                                   SLOPE_BINS)
        got_rows = sweep_gpu.segment_sums(*arguments, chunk.k3, chunk.lengths)
    for name, value in want.sums.items():
        assert float(got.sums[name]) == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), name
    assert torch.equal(got.sketch, want.sketch) and torch.equal(got.slopes, want.slopes)
    np.testing.assert_allclose(got.octaves.numpy(), want.octaves.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got_rows.numpy().T, want_rows, rtol=1e-12, atol=1e-12)
    assert got.position_sums is None  # the GPU sweep leaves the position profile to the diagnostics


def test_gpu_sweep_is_taken_only_for_float32_on_the_device_path() -> None:
    values = torch.zeros(3, dtype=torch.float32)
    assert not sweep_gpu.wanted(values)  # numpy's CPU path
    with torch_kernels_on_cpu():
        assert not sweep_gpu.wanted(values)  # not interpreted: a CPU tensor never reaches a real kernel
        with sweep_gpu.interpreted():
            assert sweep_gpu.wanted(values)
            assert not sweep_gpu.wanted(values.double())


def test_a_sweep_that_cannot_launch_falls_back_to_torch_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setattr(sweep_gpu, "_FAILED", [])

    def no_kernel(*arguments: object) -> None:
        raise RuntimeError("no kernel image is available for execution on the device\nsecond line")

    monkeypatch.setattr(sweep_gpu, "segment_sums", no_kernel)
    batches = [dirty_batch(6, steps=True), dirty_batch(7, rows=30, steps=True)]
    correction = resolve(CorrectionConfig())
    with torch_kernels_on_cpu():
        torch_path = run(batches, correction, device="cpu", by_step=True)
        with sweep_gpu.interpreted(), caplog.at_level("WARNING"):
            fallback = run(batches, correction, device="cpu", by_step=True)
            assert not sweep_gpu.wanted(torch.zeros(3))  # off for the rest of the process
    for name in TABLES:
        assert_same_tree(getattr(torch_path.overall, name), getattr(fallback.overall, name), 1e-12, name)
    notices = [r.getMessage() for r in caplog.records if "GPU sweep" in r.getMessage()]
    assert notices == ["mismatch: the fused GPU sweep is unavailable (RuntimeError: no kernel image is available "
                       "for execution on the device); using torch's kernels"]
