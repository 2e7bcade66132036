"""Miles's own debug dumps (tests/data/miles_dumps/, written by Miles 31f1ca96's writers): its train-side file is
slime's pre-version-2 layout and the slime reader reads it; a context-parallel rank's slice and the per-call
policy-loss dump are refused, naming the file to read instead."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from helpers import REFERENCE
from typer.testing import CliRunner

from mismatch_cli.cli import app
from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches, read_slime

DUMPS = REFERENCE / "miles_dumps"
TRAIN = DUMPS / "train_data" / "3_0.pt"


def _payload() -> dict:
    return torch.load(TRAIN, weights_only=True)


def test_the_dumps_record_their_provenance() -> None:
    provenance = json.loads((DUMPS / "PROVENANCE.json").read_text())
    assert provenance["miles_commit"] == "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
    assert {(s["file"], s["function"]) for s in provenance["source"]} >= {
        ("miles/utils/train_dump_utils.py", "save_debug_train_data_for_rank"),
        ("miles/backends/training_utils/debug_dump.py", "maybe_dump_policy_loss_debug")}
    assert sorted(provenance["files"]) == sorted(str(p.relative_to(DUMPS)) for p in DUMPS.rglob("*.pt"))


def test_miles_train_dump_reads_as_its_samples(concat) -> None:
    data = _payload()["rollout_data"]
    batches = list(read_slime(str(TRAIN), ReadOptions()))
    old, rollout, mask, offsets = concat(batches)
    assert old.dtype == np.float32  # Miles's float32 log-probs stay float32
    np.testing.assert_array_equal(old, torch.cat(data["log_probs"]).numpy())
    np.testing.assert_array_equal(rollout, torch.cat(data["rollout_log_probs"]).numpy())
    np.testing.assert_array_equal(mask, torch.cat(data["loss_masks"]).numpy().astype(bool))
    assert np.diff(offsets).tolist() == data["response_lengths"]
    assert all((b.steps == 3).all() for b in batches)  # rollout_id
    assert np.concatenate([b.sequence_ids for b in batches]).tolist() == data["sample_indices"]


def test_miles_train_dump_through_semantics_miles() -> None:
    """The dump's arrays give Miles's loss keys: the abs diff as a mean over samples of per-sample means."""
    result = CliRunner().invoke(app, ["analyze", str(TRAIN), "--semantics", "miles", "--format", "json",
                                      "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["metrics"]
    data = _payload()["rollout_data"]
    means = [float((abs(o - r) * m).sum() / max(int(m.sum()), 1)) for o, r, m in zip(
        data["log_probs"], data["rollout_log_probs"], data["loss_masks"], strict=True)]
    assert metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(sum(means) / len(means), rel=1e-6)
    assert metrics["train/train_rollout_kl"] > 0 and metrics["train/ess_ratio"] is None


def test_a_context_parallel_slice_is_refused() -> None:
    path = DUMPS / "train_data_cp2" / "3_0.pt"
    assert torch.load(path, weights_only=True)["cp_size"] == 2
    with pytest.raises(InputError, match=r"context-parallel rank 0's slice .*cp_size 2") as info:
        list(read_slime(str(path), ReadOptions()))
    assert "--context-parallel-size 1" in info.value.hint


def test_the_policy_loss_debug_dump_is_refused_naming_the_train_dump() -> None:
    path = DUMPS / "policy_loss_debug" / "rank_0_call_0.pt"
    with pytest.raises(InputError, match="Miles policy-loss debug dump") as info:
        list(read_slime(str(path), ReadOptions()))
    assert "train_data/{rollout_id}_{rank}.pt" in info.value.hint


def test_a_dump_details_folder_reads_its_train_data(tmp_path) -> None:
    """A --dump-details folder: train_data/ is read; policy_loss_debug/ (no rollout_id) is not a dump to walk."""
    for name in ("train_data", "policy_loss_debug"):
        shutil.copytree(DUMPS / name, tmp_path / name)
    found = discover_inputs([str(tmp_path)])
    assert [os.path.relpath(f.path, tmp_path) for f in found] == [os.path.join("train_data", "3_0.pt")]
    assert sum(b.num_rows for b in iter_batches(found, ReadOptions())) == 4


def test_miless_weight_versions_give_each_sample_its_oldest(tmp_path) -> None:
    # Miles forwards Sample.weight_versions (SGLang's version strings, one per turn) into the train data
    # (miles/ray/rollout/train_data_conversion.py:128 at 31f1ca96); a sample's oldest one is its policy version.
    payload = _payload()
    count = len(payload["rollout_data"]["response_lengths"])
    versions = [[str(3 - i % 3), "3"] if i % 2 else [str(3 - i % 3)] for i in range(count)]
    payload["rollout_data"]["weight_versions"] = versions
    path = tmp_path / "3_0.pt"
    torch.save(payload, path)
    batch = next(iter(read_slime(str(path), ReadOptions(chunk_rows=count))))
    assert batch.version_kind == "version"
    assert batch.policy_versions.tolist() == [float(min(int(v) for v in row)) for row in versions]
