"""The engine's per-token passes: segment primitives (numpy on the host, torch elsewhere), the fused CPU sweep
(numba), the GPU sweep (Triton) and the mergeable quantile sketch. They know arrays, not chunks or metrics.

May import: nothing of the package (numpy, torch, numba and triton only).
"""
