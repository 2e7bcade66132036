"""The unit that flows from readers to the engine: whole sequences as flat token arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROLES = ("old_log_probs", "rollout_log_probs", "response_mask")


@dataclass(frozen=True)
class Batch:
    """A chunk of whole sequences: per-token arrays of length N and row offsets of length B+1.

    `old_log_probs` is the trainer side, `rollout_log_probs` the inference side, both float32 or
    float64; `response_mask` is bool (True = trained-on token). Row i spans
    `offsets[i]:offsets[i+1]`. Padding, prompt and tool tokens are simply positions whose mask is
    False. `steps` is the training step per row (int64) or None when unknown. `source` names the
    file and `first_row` the index, within that file, of row 0 (for error messages and ids).
    """

    old_log_probs: np.ndarray
    rollout_log_probs: np.ndarray
    response_mask: np.ndarray
    offsets: np.ndarray
    source: str
    first_row: int = 0
    steps: np.ndarray | None = None
    sequence_ids: np.ndarray | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """Number of sequences in the chunk."""
        return len(self.offsets) - 1

    @property
    def num_positions(self) -> int:
        """Number of token positions (masked and unmasked) in the chunk."""
        return int(self.offsets[-1])

    def row_of_position(self, position: int) -> int:
        """Row index within the source file of the row holding flat position `position`."""
        return self.first_row + int(np.searchsorted(self.offsets, position, side="right") - 1)
