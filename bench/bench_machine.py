"""What this machine does with a run's history: `mismatch analyze` on one process, on every core and on the GPU.

    python bench/bench_machine.py [--tokens 50000000 500000000] [--files 8] [--turns 4] [--repeats 1]
                                  [--jobs N] [--workdir /tmp/mismatch-machine] [--full] [--skip jobs1,cuda]

For each size it makes the dump as `--files` parquet files of `mismatch synth --turns 4` (rows spread over 10
training steps per file, files made in parallel, kept in --workdir for reuse), then times, each in a fresh
process (start-up and imports count, as a user sees them):

  read 1    pyarrow reading and flattening the three columns of every file on one thread;
  read N    the same on N threads across files and row groups (the read limit of this machine);
  jobs 1    `mismatch analyze --device cpu --jobs 1` (one process);
  jobs N    `mismatch analyze --device cpu --jobs N` (N processes; N = the usable cores unless --jobs);
  cuda      `mismatch analyze --device cuda` (when torch sees a GPU; --cuda-read-threads K adds it fed by K threads
            instead of the reader processes).

It prints wall seconds, Mtok/s, the ratio to `read N`, CPU seconds (all processes) and the largest process's
peak RSS (for `jobs N`, the per-worker peak) as a Markdown table. `--full` adds token IS with batch normalization,
three RS options and `--by step`. Sizes that would not fit this machine's disk or memory are skipped with a note.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_scale import measure  # wall seconds, peak RSS (MiB), CPU seconds of one command and its children

READ = """
import sys
from concurrent.futures import ThreadPoolExecutor
import pyarrow as pa, pyarrow.parquet as pq
pa.set_cpu_count(max(1, int(sys.argv[1])))
COLUMNS = ["old_log_probs", "rollout_log_probs", "response_mask"]
def group(item):
    path, index = item
    table = pq.ParquetFile(path, pre_buffer=False).read_row_group(index, columns=COLUMNS, use_threads=False)
    return sum(len(column.combine_chunks().values.to_numpy(zero_copy_only=False)) for column in table.columns)
items = [(p, i) for p in sys.argv[2:] for i in range(pq.ParquetFile(p).metadata.num_row_groups)]
with ThreadPoolExecutor(int(sys.argv[1])) as pool:
    print(sum(pool.map(group, items)))
"""

API_CUDA = """
import os, sys
os.environ["MISMATCH_EARLY_READS"] = "0"  # read-ahead threads only, not the reader processes
from mismatch_cli.api import analyze
analyze(sys.argv[2:], device="cuda", read_workers=int(sys.argv[1]))
"""

FULL = ["--is", "token", "--is-threshold", "2.0", "--is-batch-normalize", "--rs", "seq_mean_k1,token_k3,seq_max_k2",
        "--rs-threshold", "0.999_1.001,0.5,2.0", "--by", "step"]
BYTES_PER_TOKEN = 7.3  # a synth parquet file on disk, about
SYNTH_PEAK_BYTES_PER_TOKEN = 40  # mismatch synth's peak memory per token of the file it writes, about


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def make_files(folder: Path, tokens: int, files: int, turns: int) -> list[Path]:
    """`files` synth dumps of tokens / files tokens each (distinct seeds), made in parallel, reused when present."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{index:03d}.parquet" for index in range(files)]
    missing = [(index, path) for index, path in enumerate(paths) if not path.exists()]

    def synth(entry: tuple[int, Path]) -> None:
        index, path = entry
        partial = path.with_suffix(".partial")
        subprocess.run([sys.executable, "-m", "mismatch_cli", "synth", str(partial), "--tokens", str(tokens // files),
                        "--turns", str(turns), "--steps", "10", "--seed", str(7 + index), "--format", "parquet"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        partial.rename(path)

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    parallel = max(1, min(usable_cores(), int(memory * 0.5 // (SYNTH_PEAK_BYTES_PER_TOKEN * tokens / files))))
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(synth, missing))
    return paths


def fits(tokens: int, workdir: Path) -> str | None:
    """Why a size does not fit this machine (disk for the files), or None."""
    free = shutil.disk_usage(workdir).free
    if tokens * BYTES_PER_TOKEN > 0.8 * free:
        return f"needs about {tokens * BYTES_PER_TOKEN / 2**30:.0f} GiB of disk, {free / 2**30:.0f} GiB free"
    return None


def commands(paths: list[Path], jobs: int, full: bool, skip: set[str], threads: int = 0) -> dict[str, list[str]]:
    python, names = sys.executable, [str(p) for p in paths]
    analyze = [python, "-m", "mismatch_cli", "analyze", *names, "--format", "json", "-o", os.devnull, "-q",
               *(FULL if full else [])]
    runs = {"read 1": [python, "-c", READ, "1", *names], f"read {jobs}": [python, "-c", READ, str(jobs), *names],
            "jobs 1": [*analyze, "--device", "cpu", "--jobs", "1"],
            f"jobs {jobs}": [*analyze, "--device", "cpu", "--jobs", str(jobs)]}
    if _has_cuda():
        runs["cuda"] = [*analyze, "--device", "cuda"]
        if threads:  # the GPU fed by fewer read-ahead threads than the default (the API, no rendering)
            runs[f"cuda {threads} threads"] = [python, "-c", API_CUDA, str(threads), *names]
    return {name: command for name, command in runs.items() if name.split(" ")[0] not in skip and name not in skip}


def _has_cuda() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[50_000_000, 500_000_000])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=usable_cores())
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mismatch-machine"))
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--skip", default="", help="comma-separated runs to leave out: read, jobs1 is 'jobs 1', cuda")
    parser.add_argument("--skip-at", default="", help="SIZE:RUN,... leaves RUN out at SIZE tokens only")
    parser.add_argument("--cuda-read-threads", type=int, default=0, help="also the GPU fed by this many read threads")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    skip = {name.strip().replace("jobs1", "jobs 1") for name in args.skip.split(",") if name.strip()}
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"machine: {usable_cores()} usable cores, {memory:.0f} GiB; {'full' if args.full else 'default'} "
          f"configuration; {args.files} files, {args.turns} turns", flush=True)
    table = []
    for tokens in args.tokens:
        reason = fits(tokens, args.workdir)
        if reason is not None:
            print(f"{tokens / 1e6:.0f}M tokens skipped: {reason}", flush=True)
            continue
        started = time.perf_counter()
        paths = make_files(args.workdir / f"{tokens // 1_000_000}M_{args.files}files_{args.turns}turns", tokens,
                           args.files, args.turns)
        print(f"{tokens / 1e6:.0f}M tokens in {args.files} files ready in {time.perf_counter() - started:.0f} s",
              flush=True)
        here = {run.split(":")[1].replace("jobs1", "jobs 1") for run in args.skip_at.split(",")
                if run.startswith(f"{tokens}:")}
        runs = commands(paths, args.jobs, args.full, skip | here, args.cuda_read_threads)
        measure(runs[f"read {args.jobs}"] if f"read {args.jobs}" in runs else [sys.executable, "-c", READ, "8",
                                                                                *map(str, paths)])  # warm the cache
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, command in runs.items():
                results[name].append(measure(command))
                wall, rss, cpu = results[name][-1]
                print(f"  {name}: {wall:.2f} s, {cpu:.1f} CPU s, {rss:.0f} MiB", flush=True)
        table.append((tokens, {name: (statistics.median(r[0] for r in rs), max(r[1] for r in rs),
                                      statistics.median(r[2] for r in rs)) for name, rs in results.items()}))
    reference = f"read {args.jobs}"
    print(f"\n| tokens | run | wall | Mtok/s | / {reference} | CPU s | peak RSS (largest process) |")
    print("|---|---|---|---|---|---|---|")
    for tokens, results in table:
        base = results.get(reference, (float("nan"),))[0]
        for name, (wall, rss, cpu) in results.items():
            print(f"| {tokens / 1e6:.0f}M | {name} | {wall:.2f} s | {tokens / wall / 1e6:.0f} | {wall / base:.2f} "
                  f"| {cpu:.1f} | {rss:.0f} MiB |")


if __name__ == "__main__":
    main()
