"""Where the CUDA path waits for the GPU: every synchronizing call of one full-configuration pass, by our line.

    PYTHONPATH=.:bench python bench/gpu_syncs.py [--tokens 8000000] [--chunk-positions N]

Runs the engine over a `mismatch synth` dump (4 turns, 10 steps; made when missing) in memory, with
torch's CUDA sync debug mode on, and counts each synchronizing call (a host read, a copy to pageable
memory, an op that sizes its output on the host) by the deepest line of mismatch_cli that led to it.
A diagnostic for a machine with a GPU, not a test.
"""

from __future__ import annotations

import argparse
import collections
import traceback
import warnings
from pathlib import Path

import torch
from bench_engine import FULL, load

from mismatch_cli.correction import resolve
from mismatch_cli.engine.runner import Analysis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--chunk-positions", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mismatch-bench"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    batches = load(args.workdir / f"engine_{args.tokens}_4_10steps.parquet", args.tokens, 4)
    sites: collections.Counter[str] = collections.Counter()

    def seen(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001, ARG001
        ours = [frame for frame in traceback.extract_stack()[:-1] if "mismatch_cli" in frame.filename]
        where = ours[-1] if ours else None
        label = f"{where.filename.split('mismatch_cli/')[-1]}:{where.lineno} {where.line}" if where else filename
        sites[f"{label[:110]}"] += 1

    for attempt in ("warm-up", "counted"):
        analysis = Analysis(resolve(FULL), torch.device("cuda"), by_step=True)
        if args.chunk_positions:
            analysis.chunk_positions = args.chunk_positions
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            torch.cuda.set_sync_debug_mode("warn" if attempt == "counted" else 0)
            for batch in batches:
                analysis.update(batch)
            analysis.flush()
            torch.cuda.set_sync_debug_mode(0)
        if attempt == "warm-up":
            sites.clear()
    positions = sum(b.num_positions for b in batches)
    chunks = -(-positions // analysis.chunk_positions)
    print(f"{sum(sites.values())} synchronizing calls over about {chunks} chunks "
          f"({sum(sites.values()) / chunks:.1f} per chunk), by line:")
    for label, count in sites.most_common(40):
        print(f"{count:6d} {label}")


if __name__ == "__main__":
    main()
