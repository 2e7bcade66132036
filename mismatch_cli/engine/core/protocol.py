"""How accumulators talk: one protocol (update / merge / compute) and the typed per-chunk decisions.

A batch's accumulators run over each chunk in one fixed order. Some of them decide something per
token or per row that others use: the IS accumulator its applied weights, RS its rejections, an older
family its RS band and veto. They write those into the chunk's `ChunkDecisions` (device tensors, no
host round trip) and the consumers (bootstrap, rounds, the older family's kept-token count) read them
from there. `check_order` refuses an order in which a consumer runs before the accumulator whose
decision it reads, and `ChunkDecisions.require` fails loudly when a decision is missing.

`compute()` is the one place an accumulator turns its state into numbers (and the only host sync it
needs); it returns a `Contribution`, which `BatchAccumulator` folds into the batch's result.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Self

import torch

from mismatch_cli.engine.core.chunk import Chunk

VERL_PREFIX = "rollout_corr/"
DIAG_PREFIX = "diag/"


@dataclass
class ChunkDecisions:
    """What the deciding accumulators decided about one chunk, for the accumulators that use it.

    Every field is None until its decider has run on the chunk; each is decided at most once.
    """

    is_token_weight: torch.Tensor | None = None  # [N] applied IS weight per valid token (token-level IS)
    is_row_weight: torch.Tensor | None = None  # [B] applied IS weight per row (sequence-level IS)
    rs_row_reject: torch.Tensor | None = None  # [B] bool: a sequence-level RS option rejects the row
    rs_token_reject: torch.Tensor | None = None  # [N] bool: a token-level RS option rejects the token
    family_rs_row_reject: torch.Tensor | None = None  # [B] bool: an older family's RS band rejects the row
    family_rs_token_reject: torch.Tensor | None = None  # [N] bool: an older family's RS band rejects the token
    vetoed_rows: torch.Tensor | None = None  # [B] bool: an older family's token veto drops the row

    def decide(self, **decisions: torch.Tensor) -> None:
        """Record decisions; deciding the same field twice on one chunk is a bug."""
        for name, value in decisions.items():
            assert name in DECISIONS, f"unknown decision {name!r}"
            assert getattr(self, name) is None, f"{name} decided twice for one chunk"
            setattr(self, name, value)

    def require(self, name: str) -> torch.Tensor:
        """A decision a consumer cannot do without; fails when no accumulator made it for this chunk."""
        value = getattr(self, name)
        assert value is not None, f"{name} is read before any accumulator decided it"
        return value


DECISIONS = frozenset(f.name for f in fields(ChunkDecisions))


@dataclass
class Contribution:
    """What one accumulator adds to its batch's result (every field optional)."""

    # Keys of the correction family (verl's `rollout_corr/` ones, or an older family's), full names, as
    # computed (inf / NaN allowed): the batch sorts them together and notes the non-finite ones.
    family: dict[str, float] = field(default_factory=dict)
    # Every other key (`diag/`, `per_round/`), full names, final values (None where undefined), in order.
    metrics: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    icepop_rejects_all: bool = False
    # The report's tables, one accumulator each (named as in BatchResult).
    rounds: list[dict] = field(default_factory=list)
    rounds_from_end: list[dict] = field(default_factory=list)
    intervals: dict[str, list[float]] = field(default_factory=dict)
    quantiles: dict[str, Any] = field(default_factory=dict)
    histograms: dict[str, Any] = field(default_factory=dict)
    worst_sequences: list[dict] = field(default_factory=list)
    what_if: list[dict] = field(default_factory=list)
    signatures: dict[str, Any] = field(default_factory=dict)  # what the findings read (accumulators/signatures.py)


TABLES = ("rounds", "rounds_from_end", "intervals", "quantiles", "histograms", "worst_sequences", "what_if",
          "signatures")


class Accumulator(ABC):
    """Fixed-size, mergeable state of one family of metrics over a stream of chunks."""

    decides: frozenset[str] = frozenset()  # ChunkDecisions fields this accumulator may fill
    reads: frozenset[str] = frozenset()  # ChunkDecisions fields it reads (decided by earlier ones)
    # Folds a chunk after the others: it reads the fused sweep, which runs on its own thread meanwhile.
    late: bool = False

    @abstractmethod
    def update(self, chunk: Chunk, decisions: ChunkDecisions) -> None:
        """Fold one chunk of whole sequences in, reading and adding per-chunk decisions."""

    @abstractmethod
    def merge(self, other: Self) -> None:
        """Fold the state of another shard of the same batch (same configuration) into this one."""

    @abstractmethod
    def compute(self) -> Contribution:
        """The metrics and tables this state stands for."""

    def pack(self) -> None:  # noqa: B027 - optional: most states are a few numbers
        """Shrink the state while nothing updates it (its large count arrays to their occupied entries)."""


def finite_or_none(value: float | None) -> float | None:
    """A reported value: the number, or None where it is undefined, overflowed or its input is absent."""
    return value if value is not None and math.isfinite(value) else None


def check_order(accumulators: Sequence[Accumulator]) -> None:
    """Refuse an order in which an accumulator reads a decision that a later one makes."""
    for i, accumulator in enumerate(accumulators):
        assert accumulator.decides <= DECISIONS and accumulator.reads <= DECISIONS, type(accumulator).__name__
        assert not (accumulator.late and accumulator.decides), f"{type(accumulator).__name__} decides, so runs early"
        later = frozenset().union(*(other.decides for other in accumulators[i + 1:]))
        early = accumulator.reads & later
        assert not early, f"{type(accumulator).__name__} runs before the accumulator deciding {sorted(early)}"


__all__ = ["DIAG_PREFIX", "TABLES", "VERL_PREFIX", "Accumulator", "ChunkDecisions", "Contribution", "check_order",
           "finite_or_none"]
