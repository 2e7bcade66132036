"""OpenRLHF 0.11.2's train/rollout mismatch correction (`--semantics openrlhf`).

`settings` its fields, defaults and checks, and the family as `--semantics` knows it; `engine` its accumulator;
`keys` the keys it logs.
"""

from mismatch_cli.trainers.openrlhf.settings import FAMILY

TRAINERS = (FAMILY,)
