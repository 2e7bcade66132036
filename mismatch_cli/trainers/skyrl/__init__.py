"""SkyRL 0.4.0's off-policy correction (`--semantics skyrl`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.skyrl.settings import FAMILY

TRAINERS = (FAMILY,)
