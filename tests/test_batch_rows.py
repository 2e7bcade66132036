"""Batch.group_rows and select_rows: each group's rows, their tokens and their file indices, against a by-hand
gather row by row."""

from __future__ import annotations

import numpy as np
import pytest

from mismatch_cli.batch import Batch


def random_batch(seed: int, rows: int, scattered: bool) -> Batch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, size=rows)  # empty rows too
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    return Batch(
        old_log_probs=rng.normal(size=n).astype(np.float32), rollout_log_probs=rng.normal(size=n).astype(np.float32),
        response_mask=rng.random(n) > 0.2, offsets=offsets, source="d.parquet", first_row=40,
        steps=rng.integers(0, 5, size=rows), sequence_ids=np.array([f"id{i}" for i in range(rows)], dtype=object),
        groups={"env": rng.choice(np.array(["a", "b", None], dtype=object), size=rows)},
        advantages=rng.normal(size=n), process_index=rng.integers(0, 4, size=rows),
        rows=np.sort(rng.choice(1000, size=rows, replace=False)) if scattered else None,
        policy_versions=rng.normal(size=rows), version_kind="lag", token_ids=rng.integers(0, 50000, size=n))


def by_hand(batch: Batch, picked: list[int]) -> dict:
    """What a selection of rows `picked` (in order) holds, gathered row by row."""
    spans = [range(int(batch.offsets[r]), int(batch.offsets[r + 1])) for r in picked]
    tokens = [p for span in spans for p in span]
    numbers = [int(batch.rows[r]) if batch.rows is not None else batch.first_row + r for r in picked]
    contiguous = batch.rows is None and (not picked or picked[-1] - picked[0] == len(picked) - 1)
    return {
        "old": [batch.old_log_probs[p] for p in tokens], "rollout": [batch.rollout_log_probs[p] for p in tokens],
        "mask": [batch.response_mask[p] for p in tokens], "advantages": [batch.advantages[p] for p in tokens],
        "token_ids": [batch.token_ids[p] for p in tokens], "lengths": [len(span) for span in spans],
        "steps": [batch.steps[r] for r in picked], "ids": [batch.sequence_ids[r] for r in picked],
        "env": [batch.groups["env"][r] for r in picked], "process": [batch.process_index[r] for r in picked],
        "versions": [batch.policy_versions[r] for r in picked], "numbers": numbers,
        "first_row": numbers[0] if picked else batch.first_row, "rows_none": contiguous,
    }


def held(part: Batch) -> dict:
    return {
        "old": part.old_log_probs.tolist(), "rollout": part.rollout_log_probs.tolist(),
        "mask": part.response_mask.tolist(), "advantages": part.advantages.tolist(),
        "token_ids": part.token_ids.tolist(), "lengths": np.diff(part.offsets).tolist(),
        "steps": part.steps.tolist(), "ids": part.sequence_ids.tolist(), "env": part.groups["env"].tolist(),
        "process": part.process_index.tolist(), "versions": part.policy_versions.tolist(),
        "numbers": part.row_numbers().tolist(), "first_row": part.first_row, "rows_none": part.rows is None,
    }


def as_python(values: dict) -> dict:
    return {k: [x.item() if isinstance(x, np.generic) else x for x in v] if isinstance(v, list) else v
            for k, v in values.items()}


@pytest.mark.parametrize("scattered", [False, True], ids=["rows_onward", "scattered"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_group_rows_holds_each_groups_rows_in_file_order(seed: int, scattered: bool) -> None:
    batch = random_batch(seed, rows=37, scattered=scattered)
    rng = np.random.default_rng(seed + 100)
    codes = rng.integers(0, 6, size=batch.num_rows)
    codes[codes == 4] = 5  # group 4 is empty
    codes[:9] = 0  # group 0 starts with a contiguous run
    parts = batch.group_rows(codes, 7)  # group 6 is empty too
    assert len(parts) == 7
    for g, part in enumerate(parts):
        picked = [r for r in range(batch.num_rows) if codes[r] == g]
        assert held(part) == as_python(by_hand(batch, picked)), g
        assert held(batch.select_rows(codes == g)) == held(part), g


def test_one_group_of_every_row_is_the_batch_itself() -> None:
    batch = random_batch(7, rows=12, scattered=False)
    (part,) = batch.group_rows(np.zeros(batch.num_rows, dtype=np.int64), 1)
    assert held(part) == held(batch) and part.rows is None
