"""The engine's core: a Batch as a chunk of device tensors with its layout (valid tokens, quality, rounds),
the accumulator protocol, fixed-size mergeable state, the Poisson bootstrap and how rows split by step or label.

May import: engine.kernels, batch, correction, errors.
"""
