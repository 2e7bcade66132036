"""Drive the accumulators over a stream of Batches: overall, per step, per source file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from mismatch_cli.batch import Batch
from mismatch_cli.config import ResolvedCorrection
from mismatch_cli.engine.analysis import BatchAccumulator, BatchResult
from mismatch_cli.engine.chunk import bounded, make_chunk
from mismatch_cli.errors import ConfigError, DataError, UsageError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class SourceStats:
    """What one input file contributed: rows, positions and data-quality counts."""

    sequences: int = 0
    quality: dict[str, int] = field(default_factory=dict)

    def add(self, rows: int, quality: dict[str, int]) -> None:
        """Count one chunk of this file."""
        self.sequences += rows
        for key, value in quality.items():
            self.quality[key] = self.quality.get(key, 0) + value


@dataclass
class EngineResult:
    """Finished metrics: the whole input as one batch, each step as its own, and per-file stats."""

    overall: BatchResult
    steps: dict[int, BatchResult]
    sources: dict[str, SourceStats]
    device: str
    dtype: str


def resolve_device(name: str) -> torch.device:
    """Map `auto|cpu|cuda|cuda:N` to a torch device, refusing CUDA when none is present."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device '{name}'", hint="use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device '{name}' requested but CUDA is not available", hint="use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"unsupported device '{name}'", hint="use auto, cpu, cuda or cuda:N")
    return device


def _split_by_step(batch: Batch) -> list[tuple[int, Batch]]:
    steps = batch.steps
    assert steps is not None
    unique = np.unique(steps)
    if len(unique) == 1:
        return [(int(unique[0]), batch)]
    lengths = np.diff(batch.offsets)
    position_step = np.repeat(steps, lengths)
    parts: list[tuple[int, Batch]] = []
    for step in unique:
        rows = steps == step
        positions = position_step == step
        sub_lengths = lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(sub_lengths)]).astype(np.int64)
        parts.append(
            (
                int(step),
                Batch(
                    old_log_probs=batch.old_log_probs[positions],
                    rollout_log_probs=batch.rollout_log_probs[positions],
                    response_mask=batch.response_mask[positions],
                    offsets=offsets,
                    source=batch.source,
                    first_row=batch.first_row,
                    steps=steps[rows],
                ),
            )
        )
    return parts


def run(
    batches: Iterable[Batch],
    correction: ResolvedCorrection,
    device: str = "auto",
    dtype: str = "float32",
    by_step: bool = False,
    threads: int | None = 1,
    source_names: tuple[str, ...] = (),
    rounds: bool = True,
) -> EngineResult:
    """Stream batches through the accumulators; raise when the input as a whole has no valid token."""
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'", hint="use float32 or float64")
    torch_device = resolve_device(device)
    if threads:
        torch.set_num_threads(threads)
    overall = BatchAccumulator(correction, torch_device, rounds)
    per_step: dict[int, BatchAccumulator] = {}
    sources: dict[str, SourceStats] = {}
    compute_dtype = DTYPES[dtype]
    any_rows = False
    for batch in (piece for whole in batches for piece in bounded(whole)):
        if batch.num_rows == 0:
            continue
        any_rows = True
        chunk = make_chunk(batch, torch_device, compute_dtype)
        overall.update(chunk)
        sources.setdefault(batch.source, SourceStats()).add(batch.num_rows, chunk.quality)
        if by_step and batch.steps is not None:
            for step, part in _split_by_step(batch):
                accumulator = per_step.setdefault(step, BatchAccumulator(correction, torch_device, rounds))
                accumulator.update(chunk if part is batch else make_chunk(part, torch_device, compute_dtype))
    if not any_rows:
        raise DataError(
            f"the input has no rows ({', '.join(source_names) or 'no file'})",
            hint="check that the dump files are not empty",
        )
    result = overall.compute()
    if result.valid_tokens == 0:
        raise DataError(
            "no valid token in the whole input: every response_mask value is 0 (or every masked-in "
            "log-prob is NaN/inf/sentinel), so there is nothing to measure (verl raises ValueError here)",
            hint="check the mask column (--column response_mask=NAME) or the dump itself",
        )
    if result.icepop_rejects_all:
        threshold = correction.is_threshold
        raise ConfigError(
            f"the IcePop band {threshold.lower}_{threshold.upper} rejects every valid token's IS weight, "
            "so the effective sample size is undefined (verl crashes with ZeroDivisionError here)",
            hint="widen --is-threshold (e.g. 0.5_5.0) or use a single TIS bound",
        )
    steps = {step: acc.compute() for step, acc in sorted(per_step.items())}
    return EngineResult(overall=result, steps=steps, sources=sources, device=str(torch_device), dtype=dtype)
