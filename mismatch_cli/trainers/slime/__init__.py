"""slime's TIS / IcePop and its MIS helper (`--semantics slime`, `slime-mis`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.slime.settings import FAMILY, MIS_FAMILY

TRAINERS = (FAMILY, MIS_FAMILY)
