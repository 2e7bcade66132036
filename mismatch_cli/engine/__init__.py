"""The streaming engine: chunks of whole sequences in, mergeable fixed-size state, metrics out.

Three layers, each a subpackage that imports only the ones below it:

- `kernels`: the per-token passes (numpy / torch segment primitives, the fused CPU sweep, the GPU sweep, the
  mergeable quantile sketch);
- `core`: a chunk and its layout, the accumulator protocol, mergeable state, the bootstrap, how rows split;
- `accumulators`: what each family of keys folds (off-policy diagnostics, IS, RS, rounds, what-if, diagnostics,
  signatures, worst rows and tokens, the older families' blocks).

The modules here drive them (`analysis`: one batch's accumulators; `runner`: a stream of batches; `many`:
several corrections on the same chunks; `distributed`: partial states and their merge). A replayed trainer's
accumulator comes with its resolved correction (`ResolvedCorrection.trainer_accumulator`): the engine never
names a trainer.

May import: batch, correction, errors.
"""

# How a family's non-finite key is said in the notes (replay reads them back): infinity is an overflow, NaN undefined.
INFINITE_NOTE = "overflowed to infinity (reported as null)"
UNDEFINED_NOTE = "undefined here (NaN: nothing to reduce, a std of one value, or NaN log-probs; reported as null)"
