"""ms-swift 4.6.0's rollout importance sampling (`--semantics ms-swift`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.ms_swift.settings import FAMILY

TRAINERS = (FAMILY,)
