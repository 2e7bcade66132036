"""In-process engine throughput: the accumulators over batches already in memory, no reading, no start-up.

    python bench/bench_engine.py [--tokens 10000000] [--turns 1 4] [--repeats 3] [--device cpu] [--profile]
                                 [--chunk-positions N] [--fused] [--gpu-sweep on|off|both]

Makes a `mismatch synth` dump per turn count (rows over 10 steps; kept in --workdir), reads it once into
memory, then times `Analysis.update` + `finish` over those batches with the default and the full
configuration (issue 23's: token IS with batch normalization, three RS options, `--by step`),
alternating, one torch thread, the process tuned as `analyze` tunes its own (system/runtime.py). Prints
Mtok/s per run and the best of each.
`--fused` takes the fused CPU sweep (engine/kernels/sweep.py), as `analyze` does on inputs of 256 MiB or more;
its thread's CPU time counts (the clock is the process's CPU time).
`--profile` prints cProfile's top functions of one full-configuration run instead (on CUDA: torch's
profiler, with the host time of each accumulator's update, the kernels launched and the host waits per
chunk). `--gpu-sweep both` alternates runs with the fused GPU sweep (engine/kernels/sweep_gpu.py) and without.
`--chunk-positions N` joins consecutive batches into chunks of up to N positions, as the GPU path does
(default: the device's own setting). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mismatch_cli.correction import CorrectionConfig, resolve
from mismatch_cli.engine.core.chunk import DEVICE_CHUNK_POSITIONS
from mismatch_cli.engine.runner import Analysis, resolve_device
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.system.runtime import one_command_process

FULL = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True,
                        rollout_rs="seq_mean_k1,token_k3,seq_max_k2", rollout_rs_threshold="0.999_1.001,0.5,2.0")


def load(path: Path, tokens: int, turns: int) -> list:
    """The dump's batches, read once into memory (made with `mismatch synth` when missing)."""
    if not path.exists():
        subprocess.run([sys.executable, "-m", "mismatch_cli", "synth", str(path), "--tokens", str(tokens),
                        "--turns", str(turns), "--steps", "10", "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
    return list(iter_batches(discover_inputs([str(path)]), ReadOptions()))


def once(batches: list, config: CorrectionConfig, device: str, chunk_positions: int | None = None,
         fused: bool = False) -> float:
    """Seconds for one pass of the engine over the batches (CPU time on the CPU: robust to a busy machine)."""
    analysis = Analysis(resolve(config), resolve_device(device), by_step=config is FULL, fused=fused)
    if chunk_positions:
        analysis.join_batches, analysis.chunk_positions = True, chunk_positions
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    start = clock()
    for batch in batches:
        analysis.update(batch)
    analysis.finish()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return clock() - start


@contextmanager
def by_accumulator() -> Iterator[None]:
    """Name each accumulator's update in torch's profiler (`accumulator:Name`)."""
    from torch.profiler import record_function

    from mismatch_cli.engine import analysis, runner

    classes = {type(a) for a in analysis.BatchAccumulator(resolve(FULL), torch.device("cpu")).accumulators}
    saved = {cls: cls.update for cls in classes}
    made, concat = runner.make_chunk, runner.concat_rows

    def timed(name: str, function: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            with record_function(name):
                return function(*args, **kwargs)
        return call

    def named(cls: type) -> Callable:
        def update(self: Any, *args: Any) -> Any:
            with record_function(f"accumulator:{cls.__name__}"):
                return saved[cls](self, *args)
        return update

    for cls in classes:
        cls.update = named(cls)
    runner.make_chunk = timed("accumulator:(make_chunk)", made)
    runner.concat_rows = timed("accumulator:(concat)", concat)
    try:
        yield
    finally:
        for cls, update in saved.items():
            cls.update = update
        runner.make_chunk, runner.concat_rows = made, concat


def profile_cuda(batches: list, device: str, chunk_positions: int | None, config: CorrectionConfig = FULL) -> None:
    """torch's profiler over one run: host and GPU time per accumulator, launches and host waits per chunk."""
    from torch.profiler import ProfilerActivity, profile

    positions = sum(b.num_positions for b in batches)
    chunks = -(-positions // (chunk_positions or DEVICE_CHUNK_POSITIONS))
    with by_accumulator(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds = once(batches, config, device, chunk_positions)
    ranges: dict[str, list[float]] = {}
    for event in prof.events():
        if event.name.startswith("accumulator:"):
            took = ranges.setdefault(event.name, [0, 0.0, 0.0])
            took[0] += 1
            took[1] += event.cpu_time_total / 1e3
            took[2] += event.device_time_total / 1e3
    print("host and GPU time per accumulator update (ms per call, calls):")
    for name, (calls, host_ms, device_ms) in sorted(ranges.items(), key=lambda item: -item[1][1]):
        print(f"  {name[12:]:28s} host {host_ms / calls:8.2f} ms  GPU {device_ms / calls:8.2f} ms  x{calls}")
    stats = torch.cuda.memory_stats()
    keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
    print("allocator: " + ", ".join(f"{key} {stats.get(key, 0)}" for key in keys))
    events = prof.key_averages()
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    waits = {name: sum(e.count for e in events if e.key == name)
             for name in ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaStreamSynchronize",
                          "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "aten::_local_scalar_dense", "cudaMemcpyAsync", "cudaLaunchKernel")}
    print(f"{seconds:.3f} s (profiled) for {positions / 1e6:.1f}M positions in about {chunks} chunks; "
          f"{kernels} kernels ({kernels / chunks:.0f} per chunk), {kernel_us / 1e6:.3f} s of kernel time; "
          + ", ".join(f"{k} {v} ({v / chunks:.1f}/chunk)" for k, v in waits.items()))
    print(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=50))
    print(events.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=50))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mismatch-bench"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--chunk-positions", type=int, default=None)
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--config", choices=("default", "full"), default="full", help="what --profile runs")
    parser.add_argument("--gpu-sweep", choices=("on", "off", "both"), default="on")
    args = parser.parse_args()
    torch.set_num_threads(1)
    one_command_process()  # the allocator and collector as `analyze` has them
    args.workdir.mkdir(parents=True, exist_ok=True)
    for turns in args.turns:
        path = args.workdir / f"engine_{args.tokens}_{turns}_10steps.parquet"
        batches = load(path, args.tokens, turns)
        tokens = sum(int(b.response_mask.sum()) for b in batches)
        once(batches[:2], FULL, args.device, fused=args.fused)  # warm-up: lazy imports, work buffers, kernels
        if args.profile and args.device.startswith("cuda"):
            profile_cuda(batches, args.device, args.chunk_positions,
                         CorrectionConfig() if args.config == "default" else FULL)
            continue
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            once(batches, CorrectionConfig() if args.config == "default" else FULL, args.device, args.chunk_positions,
                 args.fused)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            continue
        best: dict[str, float] = {}
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()  # this dump's peak, not the process's
        sweeps = {"both": ("1", "0"), "on": ("1",), "off": ("0",)}[args.gpu_sweep]
        for _ in range(args.repeats):
            for sweep in sweeps:
                os.environ["MISMATCH_FUSED"] = sweep  # read per chunk: the GPU sweep on (1) or off (0)
                for name, config in (("default", CorrectionConfig()), ("full", FULL)):
                    label = name if len(sweeps) == 1 else f"{name}/sweep{'+' if sweep == '1' else '-'}"
                    seconds = once(batches, config, args.device, args.chunk_positions, args.fused)
                    best[label] = min(best.get(label, seconds), seconds)
                    print(f"turns {turns} {label:15s} {seconds:6.3f} s  {tokens / seconds / 1e6:7.1f} Mtok/s",
                          flush=True)
        peak = (f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
                if args.device.startswith("cuda") else "")
        print(f"turns {turns}: {tokens / 1e6:.1f}M valid tokens; best "
              + ", ".join(f"{label} {tokens / seconds / 1e6:.1f}" for label, seconds in best.items()) + " Mtok/s"
              + peak)


if __name__ == "__main__":
    main()
