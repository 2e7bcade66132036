"""Write a large synthetic dump for benchmarks and print its summary, elapsed time and peak RSS."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mismatch_cli.synth import SynthSpec, write_synthetic_dump  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, write the dump and report how long it took and how much memory it used."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="output file (.parquet or .safetensors)")
    parser.add_argument("--tokens", type=int, default=50_000_000, help="response tokens (mask 1)")
    parser.add_argument("--turns", type=int, default=1, help="rounds per row (>1: multi-turn)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument(
        "--format", choices=["parquet", "safetensors"], default=None, help="default: by suffix"
    )
    parser.add_argument("--layout", choices=["padded", "packed"], default="packed")
    parser.add_argument("--row-group-tokens", type=int, default=SynthSpec.row_group_tokens)
    args = parser.parse_args(argv)
    file_format = args.format or ("safetensors" if args.out.suffix == ".safetensors" else "parquet")
    spec = SynthSpec(
        tokens=args.tokens,
        turns=args.turns,
        seed=args.seed,
        steps=args.steps,
        format=file_format,
        layout=args.layout,
        row_group_tokens=args.row_group_tokens,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary = write_synthetic_dump(args.out, spec)
    elapsed = time.perf_counter() - started
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    size_mib = args.out.stat().st_size / 2**20
    print(
        f"{summary.path}: {summary.sequences} sequences, {summary.tokens} tokens, "
        f"{summary.positions} positions, {size_mib:.1f} MiB"
    )
    print(
        f"elapsed {elapsed:.1f} s ({summary.tokens / elapsed / 1e6:.1f} Mtok/s), "
        f"peak RSS {peak_rss_mib:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
