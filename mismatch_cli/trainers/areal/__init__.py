"""AReaL 1.0.4's decoupled-PPO rejection sampling (`--semantics areal`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.areal.settings import FAMILY

TRAINERS = (FAMILY,)
