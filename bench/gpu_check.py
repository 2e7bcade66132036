"""CPU-vs-CUDA parity on the verl cases and random dumps, and engine throughput on each device.

Run on a machine with a GPU: `python bench/gpu_check.py [--tokens 50000000]`. Prints a table; exits 1
when a parity check fails. A benchmark and a check, not a test (CI has no GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from mismatch_cli.batch import Batch  # noqa: E402
from mismatch_cli.correction import CorrectionConfig, resolve  # noqa: E402
from mismatch_cli.engine.runner import run  # noqa: E402

FULL = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                        rollout_rs_threshold="0.999_1.001,0.5")


def parity(cases_path: Path) -> bool:
    """Every verl parity case on CUDA within the parity tolerance, and CUDA vs CPU agreement."""
    from helpers import batch_from_padded, close

    cases = json.loads(cases_path.read_text())["cases"]
    ok = True
    worst_vs_cpu = 0.0
    for case in cases:
        if case["name"].startswith("ERR"):
            continue
        correction = resolve(CorrectionConfig(**case["kwargs"]))
        batch = batch_from_padded(case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for dtype, rel, abs_ in (("float64", 1e-9, 1e-12), ("float32", 1e-3, 1e-5)):
            gpu = run([batch], correction, device="cuda", dtype=dtype).overall.metrics
            cpu = run([batch], correction, device="cpu", dtype=dtype).overall.metrics
            for key, want in case["fp64"]["metrics"].items():
                if not close(gpu[key], want, rel, abs_):
                    print(f"FAIL {case['name']} {dtype} {key}: cuda {gpu[key]} verl {want}")
                    ok = False
                if dtype == "float64":
                    worst_vs_cpu = max(worst_vs_cpu, abs(gpu[key] - cpu[key]) / (abs(cpu[key]) + 1e-300))
    print(f"verl parity on CUDA: {'all cases pass' if ok else 'FAILURES'}; "
          f"max rel |cuda - cpu| (float64) = {worst_vs_cpu:.2e}")
    return ok


def legacy_parity() -> bool:
    """Every older-family case (legacy_parity_cases.json) on CUDA within the parity tolerance."""
    from legacy_cases import load_legacy_cases, matches

    from mismatch_cli.correction import resolve_family

    ok, checked = True, 0
    for case in load_legacy_cases():
        if case.error is not None:
            continue
        resolved, _ = resolve_family(case.family, case.fields)
        metrics = run([case.batch], resolved, device="cuda", dtype=case.dtype).overall.metrics
        rel, abs_ = (1e-9, 1e-12) if case.dtype == "float64" else (1e-3, 1e-5)
        for key, want in case.expected.items():
            got = metrics.get(key)
            if not (matches(got, want, rel, abs_) or (key in case.overflows and got is None)):
                print(f"FAIL {case.id} {key}: cuda {got} upstream {want}")
                ok = False
        checked += 1
    print(f"legacy parity on CUDA: {checked} numeric (case, backend, dtype) results, "
          f"{'all pass' if ok else 'FAILURES'}")
    return ok


def synthetic_batches(tokens: int, seed: int = 0, row_length: int = 512) -> list[Batch]:
    """In-memory flat batches of about `tokens` positions, 2^20 positions each."""
    rng = np.random.default_rng(seed)
    batches, done, row = [], 0, 0
    while done < tokens:
        rows = (1 << 20) // row_length
        n = rows * row_length
        rollout = -rng.exponential(0.3, n).astype(np.float32)
        old = (rollout + rng.normal(0, 0.01, n)).astype(np.float32)
        mask = rng.random(n) > 0.05
        batches.append(Batch(old, rollout, mask, np.arange(rows + 1, dtype=np.int64) * row_length,
                             source="memory", first_row=row))
        done += n
        row += rows
    return batches


def throughput(tokens: int) -> None:
    """Engine-only throughput (arrays already in memory) on CPU and CUDA, default and full config."""
    batches = synthetic_batches(tokens)
    total = sum(b.num_positions for b in batches)
    results = {}
    for device in ("cpu", "cuda"):
        for label, config in (("default", CorrectionConfig()), ("full", FULL)):
            correction = resolve(config)
            run(batches[:2], correction, device=device)  # warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = run(batches, correction, device=device)
            elapsed = time.perf_counter() - start
            results[(device, label)] = result.overall.metrics
            print(f"in-memory {device:4s} {label:7s}: {elapsed:6.2f} s  {total / elapsed / 1e6:8.1f} Mtok/s")
    cpu, gpu = results[("cpu", "full")], results[("cuda", "full")]
    outside = [k for k, v in cpu.items() if v is not None and abs(gpu[k] - v) > 1e-3 * abs(v) + 1e-5]
    worst = max(abs(gpu[k] - v) / (abs(v) + 1e-5) for k, v in cpu.items() if v is not None)
    print(f"float32 CPU vs CUDA on {total / 1e6:.0f}M tokens: {len(outside)} keys outside 1e-3 rel + 1e-5 abs "
          f"{outside}; max |diff| / (|cpu| + 1e-5) = {worst:.1e}")


def end_to_end(tokens: int) -> None:
    """`mismatch analyze` on a synthetic parquet dump with --device cpu and --device cuda."""
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "dump.parquet"
        from mismatch_cli.synth import SynthSpec, write_synthetic_dump

        write_synthetic_dump(dump, SynthSpec(tokens=tokens, seed=1))
        for device in ("cpu", "cuda"):
            for extra in ([], ["--preset", "decoupled_geo_rs_token_tis"]):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "mismatch_cli", "analyze", str(dump), "--device", device,
                                "--format", "json", "-o", str(Path(tmp) / "r.json"), "-q", *extra], check=True)
                elapsed = time.perf_counter() - start
                print(f"end-to-end {device:4s} {' '.join(extra) or 'default':36s}: {elapsed:6.2f} s "
                      f"{tokens / elapsed / 1e6:6.1f} Mtok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--cases", type=Path, default=ROOT / "tests" / "data" / "verl_parity_cases.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}")
    ok = parity(args.cases)
    ok = legacy_parity() and ok
    throughput(args.tokens)
    end_to_end(args.tokens)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
