"""Scale benchmark: `mismatch analyze` against pyarrow's own read speed, and a padded-tensor reference.

    python bench/bench_scale.py [--tokens 50000000 200000000] [--turns 1 4] [--steps 10] [--repeats 2]
                                [--workdir /tmp/mismatch-bench]

For each size it makes single- and multi-turn dumps with `mismatch synth` (rows spread over --steps
training steps; kept in --workdir for reuse), then runs, alternating, each in a fresh process (so
start-up and imports count, as a user sees them):
  (a) pyarrow alone reading and flattening the three columns,
  (b) `mismatch analyze` with the default configuration,
  (c) `mismatch analyze` with the full configuration of issue 23: token IS with batch normalization,
      three RS options and `--by step` (rounds and diagnostics are always on),
  (d) a padded [B, T] torch reference computing verl's off-policy metrics the way a trainer does
      (skipped above --padded-limit tokens: it needs ~180 bytes per token),
  (e) the floor: `mismatch analyze` with the engine's per-chunk work skipped but for one row (start-up and
      imports, the fused kernels' load, reading, hashing, a report), which no engine change can go under.
It prints wall time, tokens/s, peak RSS, CPU time and the ratios (b)/(a), (c)/(a) as a Markdown table.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

READ_ONLY = """
import sys, pyarrow.parquet as pq
total = 0
handle = pq.ParquetFile(sys.argv[1], pre_buffer=False)
for batch in handle.iter_batches(batch_size=1024, columns=["old_log_probs", "rollout_log_probs", "response_mask"]):
    for column in batch.columns:
        total += len(column.flatten().to_numpy(zero_copy_only=False))
print(total)
"""

PADDED = """
import sys, numpy as np, pyarrow.parquet as pq, torch
table = pq.read_table(sys.argv[1], columns=["old_log_probs", "rollout_log_probs", "response_mask"])
lengths = np.diff(table.column("response_mask").combine_chunks().offsets.to_numpy())
rows, width = len(lengths), int(lengths.max())
padded = {}
for name in ("old_log_probs", "rollout_log_probs", "response_mask"):
    flat = table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    out = torch.zeros(rows, width)
    out[torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]] = torch.from_numpy(flat)
    padded[name] = out
old, rollout, mask = padded["old_log_probs"], padded["rollout_log_probs"], padded["response_mask"]
log_ratio = old - rollout
count = mask.sum()
kl = ((rollout - old) * mask).sum() / (count + 1e-8)
k3 = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / (count + 1e-8)
chi2 = ((torch.exp(log_ratio.clamp(-20, 20)) ** 2) * mask).sum() / (count + 1e-8) - 1
row = (old * mask).sum(-1) / (mask.sum(-1) + 1e-8)
print(float(kl), float(k3), float(chi2), float(torch.exp(-row).mean()))
"""

FLOOR = """
import sys
from mismatch_cli.engine import runner
from mismatch_cli.engine.kernels import sweep
fold = runner.Analysis._fold
def skip(analysis, batch):  # fold one row of the first batch (a report needs a token), read the rest
    if not analysis.any_rows:
        fold(analysis, batch.slice_rows(0, 1))
    if analysis.fused:  # the kernels a default run loads
        for name in ("layout", "segments", "sweep", "candidates", "round_sketches"):
            sweep._compiled(name)
runner.Analysis._fold = skip
from mismatch_cli.cli.app import main
sys.argv = ["mismatch", "analyze", *sys.argv[1:]]
main()
"""

FULL = ["--is", "token", "--is-threshold", "2.0", "--is-batch-normalize", "--rs", "seq_mean_k1,token_k3,seq_max_k2",
        "--rs-threshold", "0.999_1.001,0.5,2.0", "--by", "step"]


def measure(command: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system) of one child process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{process.stderr.read().decode() if process.stderr else ''}")
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def make_dump(path: Path, tokens: int, turns: int, steps: int) -> None:
    if path.exists():
        return
    subprocess.run([sys.executable, "-m", "mismatch_cli", "synth", str(path), "--tokens", str(tokens),
                    "--turns", str(turns), "--steps", str(steps), "--seed", "7"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[50_000_000, 200_000_000])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mismatch-bench"))
    parser.add_argument("--padded-limit", type=int, default=60_000_000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    rows = []
    for tokens in args.tokens:
        for turns in args.turns:
            dump = args.workdir / f"dump_{tokens // 1_000_000}M_{turns}turn_{args.steps}steps.parquet"
            make_dump(dump, tokens, turns, args.steps)
            runs = {
                "a": [python, "-c", READ_ONLY, str(dump)],
                "b": [python, "-m", "mismatch_cli", "analyze", str(dump), "--format", "json", "-o", os.devnull,
                      "-q", "--device", args.device],
                "c": [python, "-m", "mismatch_cli", "analyze", str(dump), "--format", "json", "-o", os.devnull,
                      "-q", "--device", args.device, *FULL],
            }
            if tokens <= args.padded_limit:
                runs["d"] = [python, "-c", PADDED, str(dump)]
            runs["e"] = [python, "-c", FLOOR, str(dump), "--format", "json", "-o", os.devnull, "-q", "--device",
                         args.device]
            measure(runs["a"])  # warm the page cache
            results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
            for _ in range(args.repeats):
                for key, command in runs.items():
                    results[key].append(measure(command))
            wall = {k: statistics.median(t for t, _, _ in v) for k, v in results.items()}
            rss = {k: max(r for _, r, _ in v) for k, v in results.items()}
            # CPU time (median): less sensitive than wall time to other jobs on a shared machine.
            cpu = {k: statistics.median(c for _, _, c in v) for k, v in results.items()}
            rows.append((tokens, turns, wall, rss, cpu))
            print(f"{tokens / 1e6:.0f}M tokens, {turns} turn(s): " + ", ".join(
                f"{k} {wall[k]:.2f} s wall {cpu[k]:.2f} s CPU / {rss[k]:.0f} MiB" for k in wall), flush=True)
    print()
    print("| tokens | turns | (a) pyarrow read | (b) analyze | (c) full config | (d) padded torch | (b)/(a) | (c)/(a) "
          "| (e) floor / (a) | peak RSS (b) / (c) | CPU s (a) / (b) / (c) / (e) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tokens, turns, wall, rss, cpu in rows:
        padded = f"{wall['d']:.2f} s, {rss['d']:.0f} MiB" if "d" in wall else "skipped (memory)"
        print(f"| {tokens / 1e6:.0f}M | {turns} | {wall['a']:.2f} s ({tokens / wall['a'] / 1e6:.0f} Mtok/s) "
              f"| {wall['b']:.2f} s ({tokens / wall['b'] / 1e6:.0f} Mtok/s) | {wall['c']:.2f} s | {padded} "
              f"| {wall['b'] / wall['a']:.2f} | {wall['c'] / wall['a']:.2f} | {wall['e']:.2f} s, "
              f"{wall['e'] / wall['a']:.2f} | {rss['b']:.0f} / {rss['c']:.0f} MiB "
              f"| {cpu['a']:.2f} / {cpu['b']:.2f} / {cpu['c']:.2f} / {cpu['e']:.2f} |")


if __name__ == "__main__":
    main()
