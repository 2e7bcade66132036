"""Regenerate the sample dumps next to this file: `python sample_data/make_samples.py`."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mismatch_cli.synth import SynthSpec, write_synthetic_dump  # noqa: E402

# Small row groups so that readers of the samples meet more than one.
SAMPLES = {
    "single_turn.parquet": SynthSpec(
        tokens=100_000, seed=1, empty_rows=0.02, steps=2, row_group_tokens=32_768
    ),
    "multi_turn.parquet": SynthSpec(tokens=100_000, turns=4, seed=2, row_group_tokens=32_768),
    "packed.safetensors": SynthSpec(tokens=50_000, seed=3, format="safetensors", layout="packed"),
}


def main() -> int:
    """Write every sample and print one line per file."""
    for name, spec in SAMPLES.items():
        summary = write_synthetic_dump(HERE / name, spec)
        size_kib = (HERE / name).stat().st_size / 1024
        print(f"{name}: {summary.sequences} sequences, {summary.tokens} tokens, {size_kib:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
