"""What a synthetic dump is asked to be (`SynthSpec`) and what was written (`SynthSummary`)."""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("parquet", "safetensors")

LAYOUTS = ("padded", "packed")


@dataclass(frozen=True)
class SynthSpec:
    """What to generate; every field has a realistic default."""

    tokens: int = 100_000  # approx total response (mask=1) tokens
    turns: int = 1  # >1: multi-turn rows (runs of 1s separated by 0-gaps of env/tool tokens)
    seed: int = 0
    format: str = "parquet"  # parquet | safetensors
    layout: str = "padded"  # safetensors only: padded | packed
    empty_rows: float = 0.0  # fraction of rows whose mask is all zero
    steps: int = 1  # rows spread over steps 0..steps-1 (parquet `step` column when steps > 1)
    noise: float = 1.0  # scales the trainer/inference disagreement (for compare demos)
    catastrophic_rate: float = 2e-5  # fraction of response tokens with a large disagreement
    mean_length: int = 512  # mean response length per turn
    row_group_tokens: int = 1_000_000  # parquet: positions per row group at most (bounds readers)


@dataclass(frozen=True)
class SynthSummary:
    """What was written: sequences (rows), valid tokens (mask 1) and positions (any mask, no padding)."""

    path: str
    sequences: int
    tokens: int
    positions: int
