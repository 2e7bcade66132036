"""Test-session setup shared by every test module."""

from __future__ import annotations

import os

import torch

# Without a GPU, the fused GPU sweep's Triton kernels run in Triton's interpreter (tests/engine/test_sweep_gpu.py).
# Triton reads this once, when it is first imported, so it is set before any test can import it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
