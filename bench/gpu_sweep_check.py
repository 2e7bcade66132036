"""The fused GPU sweep (engine/kernels/sweep_gpu.py) against torch's passes on the same GPU and numpy's on the CPU.

Run on a machine with a GPU: `PYTHONPATH=.:tests python bench/gpu_sweep_check.py`. Every table of the
report (metrics, rounds, quantiles, histograms, what-if, signatures, ...) of dirty dumps (zeros, repeats,
spikes, sentinels, multi-turn gaps; tests/engine/test_sweep.py) under the default and the full
configuration, per step too. Prints the largest relative difference per table and exits 1 when the sweep
and torch's passes on the GPU differ beyond float32 rounding (1e-6 relative) or in any count. A check, not
a test (CI has no GPU; there the kernels run in Triton's interpreter: tests/engine/test_sweep_gpu.py).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "engine")]

from test_sweep import TABLES, dirty_batch  # noqa: E402

from mismatch_cli.correction import CorrectionConfig, resolve  # noqa: E402
from mismatch_cli.engine.kernels import sweep, sweep_gpu  # noqa: E402
from mismatch_cli.engine.runner import run  # noqa: E402

FULL = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                        rollout_rs_threshold="1.01,0.5")


def differences(one: object, other: object, path: str, out: list[tuple[float, str]]) -> None:
    """(relative difference, path) of every float pair; inf for a count, string or shape that differs."""
    if isinstance(one, dict) and isinstance(other, dict):
        if one.keys() != other.keys():
            out.append((math.inf, f"{path} keys"))
        for key in one.keys() & other.keys():
            differences(one[key], other[key], f"{path}/{key}", out)
    elif isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)):
        if len(one) != len(other):
            out.append((math.inf, f"{path} length"))
        for i, (a, b) in enumerate(zip(one, other, strict=False)):
            differences(a, b, f"{path}/{i}", out)
    elif isinstance(one, float) and isinstance(other, float):
        if math.isnan(one) or math.isnan(other) or math.isinf(one) or math.isinf(other):
            out.append((0.0 if (one == other or (math.isnan(one) and math.isnan(other))) else math.inf, path))
        else:
            out.append((abs(one - other) / max(abs(one), 1e-12), path))
    elif one != other:
        out.append((math.inf, path))


def main() -> int:
    assert sweep_gpu.wanted(__import__("torch").zeros(1, device="cuda")), "no GPU sweep (no CUDA or no Triton)"
    failed = False
    for config_name, config in (("default", CorrectionConfig()), ("full", FULL)):
        for seed in (1, 2, 3):
            batches = [dirty_batch(seed, steps=True), dirty_batch(seed + 10, rows=7, steps=True),
                       dirty_batch(seed + 20, steps=True, turns=4), dirty_batch(seed + 30, rows=400, turns=1)]
            correction = resolve(config)
            with sweep.forced(False):
                cpu = run(batches, correction, device="cpu", by_step=True)
            os.environ["MISMATCH_FUSED"] = "0"
            plain = run(batches, correction, device="cuda", by_step=True)
            os.environ["MISMATCH_FUSED"] = "1"
            fused = run(batches, correction, device="cuda", by_step=True)
            for name in TABLES:
                versus_plain: list[tuple[float, str]] = []
                versus_cpu: list[tuple[float, str]] = []
                differences(getattr(plain.overall, name), getattr(fused.overall, name), name, versus_plain)
                differences(getattr(cpu.overall, name), getattr(fused.overall, name), name, versus_cpu)
                for step, result in plain.steps.items():
                    differences(result.metrics, fused.steps[step].metrics, f"step {step}", versus_plain)
                worst = max(versus_plain, default=(0.0, ""))
                worst_cpu = max(versus_cpu, default=(0.0, ""))
                bad = worst[0] > 1e-6
                failed |= bad
                print(f"{config_name:7s} seed {seed} {name:16s} sweep vs torch on GPU {worst[0]:9.2e} "
                      f"{worst[1][:40]:40s} vs CPU {worst_cpu[0]:9.2e} {worst_cpu[1][:30]}{'  FAIL' if bad else ''}")
    print("GPU sweep check:", "FAILED" if failed else "every table within 1e-6 of torch's passes on the GPU")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
