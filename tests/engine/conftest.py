"""The engine's tests split dumps into batches to test chunk boundaries: each batch is folded as a chunk of its own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _chunks_as_made(separate_chunks: None) -> None:
    """Every engine test folds its batches as made (tests/engine/test_cpu_join.py tests the CPU's joining)."""
