"""Test-session setup shared by every test module."""

from __future__ import annotations

import os

import pytest
import torch

# Without a GPU, the fused GPU sweep's Triton kernels run in Triton's interpreter (tests/engine/test_sweep_gpu.py).
# Triton reads this once, when it is first imported, so it is set before any test can import it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items: list) -> None:
    """Start the cluster test first: it waits on its Ray nodes for half a minute, which the other worker fills with
    the rest of the suite, instead of running alone in the suite's tail."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is None)


@pytest.fixture
def separate_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fold each batch a test makes as a chunk of its own: the CPU would join consecutive small ones of a file into
    one chunk (engine/runner.py), and tests of chunk boundaries must cross them."""
    from mismatch_cli.engine import runner

    monkeypatch.setattr(runner, "JOIN_CPU_BATCHES_BELOW", 0)
