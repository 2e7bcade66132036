"""TRL 1.16.0's vLLM importance sampling (`--semantics trl`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.trl.settings import FAMILY

TRAINERS = (FAMILY,)
