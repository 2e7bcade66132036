"""prime-rl's RL loss: its mismatch masks and keys (`--semantics prime-rl`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.prime_rl.settings import FAMILY

TRAINERS = (FAMILY,)
