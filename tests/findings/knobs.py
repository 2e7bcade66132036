"""Sampled-softmax dumps that turn one knob at a time: tokens drawn from the rollout's processed distribution,
scored by a trainer that applies none of it (tests of issue 37's causes; never fitted to one file).

Every log-prob is computed in float64 numpy and stored as float32, as an engine and a trainer would write them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax (float64; -inf logits stay -inf)."""
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


def knob_dump(path: Path, *, temperature: float = 1.0, top_k: int = 0, min_p: float = 0.0, penalty: float = 1.0,
              noise: float = 0.0, drift: float = 0.0, versions: int = 1, rows: int = 120, length: int = 60,
              vocab: int = 512, prompt: int = 0, seed: int = 11, extra: dict | None = None,
              ids: bool = False) -> dict[str, np.ndarray]:
    """Write the dump and return its columns (float64 old / rollout [rows, positions], versions per row).

    Logits ~ N(10, 3), positive as a language model's are, so a repetition penalty divides them (HF / vLLM rule);
    the penalty applies to `prompt_ids` random tokens per row and to every token sampled before. With `versions`
    > 1, row r samples from the policy at version r % versions, each version adding N(0, drift) to the logits of
    the one before, and the trainer scores with the newest; `noise` adds N(0, noise) to the trainer's logits.
    `prompt` > 0 prepends that many prompt positions (rollout 0.0, mask 1) to every row. With `ids` the sampled
    token ids are written too (`response_ids`).
    """
    rng = np.random.default_rng(seed)
    row_version = np.arange(rows) % versions
    steps = rng.normal(0.0, drift, (versions, vocab)) if versions > 1 else np.zeros((1, vocab))
    offset = np.cumsum(steps, axis=0)  # logits of version v: base + offset[v]; the trainer's: base + offset[-1]
    seen = np.zeros((rows, vocab), dtype=bool)
    seen[np.arange(rows)[:, None], rng.integers(0, vocab, (rows, 20))] = True
    old = np.zeros((rows, length))
    rollout = np.zeros((rows, length))
    picked = np.zeros((rows, length), dtype=np.int64)
    at = np.arange(rows)
    for t in range(length):
        base = rng.normal(10.0, 3.0, (rows, vocab))
        sampler = (base + offset[row_version]) / temperature
        if penalty != 1.0:
            sampler = np.where(seen, np.where(sampler > 0, sampler / penalty, sampler * penalty), sampler)
        if top_k:
            sampler = np.where(sampler >= np.sort(sampler, axis=1)[:, -top_k][:, None], sampler, -np.inf)
        if min_p:
            probs = np.exp(log_softmax(sampler))
            sampler = np.where(probs >= min_p * probs.max(axis=1, keepdims=True), sampler, -np.inf)
        reported = log_softmax(sampler)
        trainer = log_softmax(base + offset[-1] + (rng.normal(0.0, noise, base.shape) if noise else 0.0))
        pick = (rng.random((rows, 1)) < np.cumsum(np.exp(reported), axis=1)).argmax(axis=1)
        seen[at, pick] = True
        old[:, t], rollout[:, t], picked[:, t] = trainer[at, pick], reported[at, pick], pick
    if prompt:
        old = np.concatenate([-rng.exponential(3.0, (rows, prompt)) - 0.01, old], axis=1)
        rollout = np.concatenate([np.zeros((rows, prompt)), rollout], axis=1)
    old, rollout = old.astype(np.float32).astype(np.float64), rollout.astype(np.float32).astype(np.float64)
    columns = {"old_log_probs": list(old.astype(np.float32)), "rollout_log_probs": list(rollout.astype(np.float32)),
               "response_mask": list(np.ones(old.shape, dtype=np.int8)), **(extra or {})}
    if ids:
        columns["response_ids"] = list(picked.astype(np.int32))
    pq.write_table(pa.table(columns), path)
    return {"old": old, "rollout": rollout, "version": row_version, "ids": picked}


__all__ = ["knob_dump", "log_softmax"]
