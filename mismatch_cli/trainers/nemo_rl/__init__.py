"""NeMo-RL's ClippedPGLossFn mismatch metrics and correction (`--semantics nemo-rl`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.nemo_rl.settings import FAMILY

TRAINERS = (FAMILY,)
