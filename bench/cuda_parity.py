"""A pytest plugin that runs the parity suites' `run(..., device="cpu")` calls on CUDA instead.

    PYTHONPATH=.:bench python -m pytest -p cuda_parity tests/engine/test_*_parity.py

Every family's upstream parity case then goes through the CUDA engine against the same reference numbers
and tolerances as on the CPU, plus the GPU bounds tests/helpers.py documents (ON_GPU). Tests that build an
accumulator by hand keep their own device. A check for a machine with a GPU, not part of the suite (CI has
no GPU).
"""

from __future__ import annotations

import torch

import mismatch_cli.engine.runner as runner

_run_on_cpu = runner.run


def _run_on_cuda(*args, **kwargs):
    """`runner.run` with every device moved to CUDA."""
    kwargs["device"] = "cuda"
    return _run_on_cpu(*args, **kwargs)


def pytest_configure(config) -> None:
    """Refuse to run without a GPU (the point is CUDA), then route the engine's `run` there and let the suites'
    documented GPU bounds apply (tests/helpers.py: float32 ulps where the trainer computes in float32, the rounding
    of a std taken by cancellation)."""
    if not torch.cuda.is_available():
        raise SystemExit("cuda_parity: no CUDA device")
    runner.run = _run_on_cuda
    import helpers

    helpers.ON_GPU = True
