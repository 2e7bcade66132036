"""Write small dumps in the layouts other frameworks use, from the documented key names
(`docs/formats.md`), plus the equivalent wide parquet; shared by the reader,
convert and CLI tests.

Every sequence is a `Seq`: a prompt length (used by the full-sequence formats) and the response's
trainer / inference log-probs and mask. Values are multiples of 1/256, exact in float32.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass
class Seq:
    """One sequence: response arrays (mask 1 = trained on), prompt length, labels."""

    old: list[float]
    rollout: list[float]
    mask: list[int]
    prompt: int = 2
    env: str = "math"
    step: int = 0
    extra: dict = field(default_factory=dict)


def make_seqs(seed: int = 0, count: int = 7, step: int = 0) -> list[Seq]:
    """`count` sequences of varied lengths with multi-turn masks, one empty row, two environments."""
    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(count):
        n = int(rng.integers(1, 9))
        old = np.round(-rng.exponential(0.8, n) * 256) / 256
        rollout = np.round((old + rng.normal(0, 0.05, n)) * 256) / 256
        rollout = np.minimum(rollout, -1 / 256)  # no accidental 0.0 or positive values
        old = np.minimum(old, -1 / 256)
        mask = (rng.random(n) > 0.25).astype(int)
        if i == 3:
            mask[:] = 0  # an empty row
        else:
            mask[0] = 1
        seqs.append(Seq(old.tolist(), rollout.tolist(), mask.tolist(), prompt=int(rng.integers(0, 4)),
                        env="math" if i % 3 else "code", step=step))
    return seqs


def flat(seqs: Sequence[Seq]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Response old, rollout, mask (bool) of all sequences, concatenated."""
    old = np.array([v for s in seqs for v in s.old], dtype=np.float64)
    rollout = np.array([v for s in seqs for v in s.rollout], dtype=np.float64)
    mask = np.array([v for s in seqs for v in s.mask], dtype=bool)
    return old, rollout, mask


def write_parquet(path: str, seqs: Sequence[Seq], steps: bool = True, env: bool = True) -> str:
    """The equivalent wide parquet: response-only lists, a step and an env_name column."""
    columns = {
        "old_log_probs": pa.array([s.old for s in seqs], pa.list_(pa.float64())),
        "rollout_log_probs": pa.array([s.rollout for s in seqs], pa.list_(pa.float64())),
        "response_mask": pa.array([s.mask for s in seqs], pa.list_(pa.int8())),
    }
    if steps:
        columns["step"] = pa.array([s.step for s in seqs], pa.int64())
    if env:
        columns["env_name"] = pa.array([s.env for s in seqs])
    pq.write_table(pa.table(columns), path)
    return path


# ------------------------------------------------------------------------------------------------ slime


def slime_sample(seq: Seq, position: int, torch_dtype=None) -> dict:
    """One `samples` entry of slime's train-side dump (format_version 2)."""
    import torch

    dtype = torch_dtype or torch.float32
    n = len(seq.old)
    return {
        "data_parallel_rank": position % 2,
        "rollout_position": position,
        "sample_index": 100 + position,
        "tokens": torch.arange(seq.prompt + n),
        "response_lengths": n,
        "total_lengths": seq.prompt + n,
        "loss_masks": torch.tensor(seq.mask, dtype=torch.int32),
        "rollout_log_probs": torch.tensor(seq.rollout, dtype=dtype),
        "log_probs": torch.tensor(seq.old, dtype=dtype),
        "ref_log_probs": torch.zeros(n),
        "advantages": torch.ones(n),
        "rewards": 1.0,
        "truncated": 0,
        **seq.extra,
    }


def write_slime_train(path: str, seqs: Sequence[Seq], rollout_id: int, torch_dtype=None,
                      shuffle: bool = True) -> str:
    """`torch.save` of slime's train-side payload; samples stored out of order to test the sort."""
    import torch

    samples = [slime_sample(s, i, torch_dtype) for i, s in enumerate(seqs)]
    if shuffle:
        samples = samples[1::2] + samples[0::2]
    payload = {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": samples,
        "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": [s["sample_index"] for s in samples]}],
        "raw_reward": [1.0] * len(samples),
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(payload, path)
    return path


def write_slime_rollout(path: str, seqs: Sequence[Seq], rollout_id: int, status: object = "completed") -> str:
    """slime's rollout-side payload: `Sample.to_dict()` entries; `status` may be any picklable object."""
    import torch

    samples = [
        {"tokens": list(range(s.prompt + len(s.old))), "response_length": len(s.old), "loss_mask": s.mask,
         "rollout_log_probs": s.rollout, "index": i, "group_index": i // 2, "rollout_id": rollout_id,
         "status": status, "reward": 1.0, "remove_sample": False}
        for i, s in enumerate(seqs)
    ]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return path


# ------------------------------------------------------------------------------------------------ NeMo-RL


def _json_number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


def nemo_record(seq: Seq, width: int, idx: int, nested: bool = True, sample_mask: float = 1.0) -> dict:
    """One line of `train_data_step{N}.jsonl`: full-sequence arrays right-padded to `width`."""
    n, p = len(seq.old), seq.prompt
    pad = width - p - n
    prev = [-0.5] * p + seq.old + [0.0] * pad  # the trainer scores prompt tokens too
    gen = [0.0] * p + seq.rollout + [0.0] * pad  # 0.0 where nothing was generated
    mask = [0] * p + seq.mask + [0] * pad

    def wrap(value):
        return [value] if nested else value

    return {
        "content": wrap("..."),
        "rewards": wrap(1.0),
        "input_lengths": wrap(p + n),
        "token_ids": wrap(list(range(width))),
        "token_loss_mask": wrap(mask),
        "sample_loss_mask": wrap(sample_mask),
        "advantages": wrap([0.25] * width),
        "generation_logprobs": wrap(gen),
        "prev_logprobs": wrap(prev),
        "idx": idx,
        **seq.extra,
    }


def write_nemo(path: str, seqs: Sequence[Seq], nested: bool = True, sample_masks: Sequence[float] | None = None,
               records: list[dict] | None = None) -> str:
    """A NeMo-RL train-data JSONL (json.dumps with NaN / Infinity literals, as NeMo-RL writes it)."""
    width = max(s.prompt + len(s.old) for s in seqs)
    if records is None:
        records = [nemo_record(s, width, i, nested, 1.0 if sample_masks is None else sample_masks[i])
                   for i, s in enumerate(seqs)]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ prime-rl


def prime_record(seq: Seq, step: int, rank: int, index: int) -> dict:
    """One record of `token_exports/step_{N}/rank_{R}.jsonl` (full sequence, no trailing padding)."""
    n, p = len(seq.old), seq.prompt
    none = [None] * (p + n)
    return {
        "schema_version": 1,
        "step": step,
        "rank": rank,
        "micro_step": 0,
        "micro_sequence_idx": index,
        "export_sequence_idx": index,
        "env_name": seq.env,
        "token_ids": list(range(p + n)),
        "position_ids": list(range(p + n)),
        "loss_mask": [False] * p + [bool(m) for m in seq.mask],
        "advantages": [0.5] * (p + n),
        # prime-rl writes non-finite floats as null
        "inference_logprobs": [None] * p + [v if math.isfinite(v) else None for v in seq.rollout],
        "trainer_logprobs": [0.0] * p + [v if math.isfinite(v) else None for v in seq.old],
        "entropy": none,
        "mismatch_kl": none,
        "is_masked": [False] * (p + n),
        **seq.extra,
    }


def write_prime(root: str, step: int, rank: int, seqs: Sequence[Seq], stable: bool = True,
                records: list[dict] | None = None) -> str:
    """`root/step_{step}/rank_{rank}.jsonl`, plus the empty STABLE marker when `stable`."""
    folder = os.path.join(root, f"step_{step}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank_{rank}.jsonl")
    if records is None:
        records = [prime_record(s, step, rank, i) for i, s in enumerate(seqs)]
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    if stable:
        open(os.path.join(folder, "STABLE"), "w").close()
    return path
