"""Miles' TIS / IcePop and its MIS helper, a slime fork (`--semantics miles`, `miles-mis`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.miles.settings import FAMILY, MIS_FAMILY

TRAINERS = (FAMILY, MIS_FAMILY)
