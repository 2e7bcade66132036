"""NeMo-RL `train_data_step{N}.jsonl`: one record per sample, full-sequence arrays right-padded.

`prev_logprobs` (trainer) and `generation_logprobs` (inference) cover prompt + response; position i
is the log-prob of token i (0.0 where nothing was generated), and `token_loss_mask` is 1 only on
generated assistant tokens (several runs in multi-turn), so the arrays are read as they are, with
the mask picking the trained-on tokens. `sample_loss_mask` = 0 empties the row, as NeMo-RL's loss
multiplies by it. Each field holds a one-element list (NeMo-RL logs micro-batches of one); plain
values are accepted too. The step comes from the file name.
"""

from __future__ import annotations

from collections.abc import Iterator

from .detect import step_from_name
from .jsonl import Flavor, decode_records
from .options import ReadOptions
from .validate import Decoded


def decode_nemo_rl(path: str, options: ReadOptions) -> Iterator[Decoded]:
    """Stream a NeMo-RL train-data JSONL file as decoded chunks."""
    flavor = Flavor(
        name="nemo-rl",
        id_fields=("idx",),
        row_mask_field="sample_loss_mask",
        default_groups=(),
        step_from_path=step_from_name(path),
        parse_hint="check that the file is a complete train_data_step{N}.jsonl written by NeMo-RL "
        "(one JSON object per line)",
    )
    yield from decode_records(path, options, flavor)
