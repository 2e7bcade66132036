"""prime-rl token exports: `token_exports/step_{N}/rank_{R}.jsonl`, one record per sequence.

`trainer_logprobs` vs `inference_logprobs` over the full (unpacked, trailing-padding-trimmed)
sequence with a boolean `loss_mask`; non-finite floats and absent streams are written as `null`
(read as NaN: excluded and counted on valid tokens). `env_name` is attached as a group column. A
step folder is complete once its empty `STABLE` file exists; discovery notes when it does not.
"""

from __future__ import annotations

from collections.abc import Iterator

from .detect import prime_notes, step_from_name
from .jsonl import Flavor, decode_records
from .options import ReadOptions
from .validate import Decoded


def decode_prime_rl(path: str, options: ReadOptions) -> Iterator[Decoded]:
    """Stream a prime-rl token-export rank file as decoded chunks."""
    hint = "check that the file is a complete rank_{R}.jsonl written by prime-rl (one JSON object per line)"
    if prime_notes(path):
        hint = ("its step folder has no STABLE marker, so prime-rl may still be writing it: wait for STABLE, "
                "or leave this step out")
    flavor = Flavor(
        name="prime-rl",
        id_fields=("export_sequence_idx",),
        row_mask_field=None,
        default_groups=("env_name",),
        step_from_path=step_from_name(path),
        parse_hint=hint,
    )
    yield from decode_records(path, options, flavor)
