"""What each family of keys folds from a chunk: verl's off-policy diagnostics, IS and RS, the rounds, the what-if
ladder, the diagnostics and bug signatures, the worst rows and tokens, and the older families' blocks.

May import: engine.core, engine.kernels, batch, correction, errors.
"""
