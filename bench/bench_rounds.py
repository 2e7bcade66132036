"""What round segmentation costs: `analyze` on a multi-turn dump with and without the rounds family.

`python bench/bench_rounds.py [--tokens 20000000] [--turns 8] [--repeats 3]`. Runs alternate
(with, without, with, ...) in one process after a warm-up, so page cache and torch start-up are
the same for both; prints each run, the medians and their ratio. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mismatch_cli.api import analyze
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.synth import SynthSpec, write_synthetic_dump

FULL = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                        rollout_rs_threshold="0.999_1.001,0.5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dump", type=Path, help="reuse this dump instead of generating one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dump = args.dump or Path(tmp) / "multi_turn.parquet"
        if args.dump is None:
            summary = write_synthetic_dump(dump, SynthSpec(tokens=args.tokens, turns=args.turns, seed=0))
            print(f"dump: {summary.tokens:,} tokens, {summary.sequences:,} rows, {args.turns} turns max")
        for label, config in (("metrics only", CorrectionConfig()), ("token IS + 2 RS", FULL)):
            analyze([str(dump)], config, device="cpu", hash_inputs=False)  # warm-up: page cache, imports
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for rounds in (True, False):
                    start = time.perf_counter()
                    analyze([str(dump)], config, device="cpu", hash_inputs=False, rounds=rounds)
                    times[rounds].append(time.perf_counter() - start)
            with_rounds, without = statistics.median(times[True]), statistics.median(times[False])
            print(f"in process  {label:16s} without rounds {without:6.2f} s   with rounds {with_rounds:6.2f} s   "
                  f"overhead {100 * (with_rounds / without - 1):+5.1f} %")
        # The same as a user sees it: a fresh interpreter per run (imports included), like `mismatch analyze`.
        for label, preset in (("metrics only", None), ("token IS + 2 RS", "full")):
            times = {True: [], False: []}
            for _ in range(args.repeats):
                for rounds in (True, False):
                    config = "FULL" if preset else "CorrectionConfig()"
                    code = ("import sys; sys.path.insert(0, 'bench'); from bench_rounds import *; "
                            f"analyze([{str(dump)!r}], {config}, device='cpu', rounds={rounds})")
                    start = time.perf_counter()
                    subprocess.run([sys.executable, "-c", code], check=True)
                    times[rounds].append(time.perf_counter() - start)
            with_rounds, without = statistics.median(times[True]), statistics.median(times[False])
            print(f"end to end  {label:16s} without rounds {without:6.2f} s   with rounds {with_rounds:6.2f} s   "
                  f"overhead {100 * (with_rounds / without - 1):+5.1f} %")


if __name__ == "__main__":
    main()
