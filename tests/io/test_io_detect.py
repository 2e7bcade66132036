"""Format detection from the content (not the extension), --input-format, and folder walks over the
trainers' own layouts."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from framework_dumps import make_seqs, write_nemo, write_parquet, write_prime, write_slime_train
from safetensors.numpy import save_file

from mismatch_cli.errors import InputError, UsageError
from mismatch_cli.io import ReadOptions, detect_format, discover_inputs, iter_batches


@pytest.fixture
def dumps(tmp_path):
    seqs = make_seqs(31, count=3)
    made = {
        "parquet": write_parquet(str(tmp_path / "a.parquet"), seqs),
        "slime": write_slime_train(str(tmp_path / "train.pt"), seqs, 0),
        "nemo-rl": write_nemo(str(tmp_path / "train_data_step4.jsonl"), seqs),
        "prime-rl": write_prime(str(tmp_path / "exports"), 2, 0, seqs),
    }
    made["safetensors"] = str(tmp_path / "b.safetensors")
    save_file({"old_log_probs": np.zeros((2, 3), np.float32), "rollout_log_probs": np.zeros((2, 3), np.float32),
               "response_mask": np.ones((2, 3), np.int8)}, made["safetensors"])
    return made


def test_content_decides_not_the_extension(tmp_path, dumps):
    for fmt, path in dumps.items():
        renamed = str(tmp_path / f"renamed_{fmt}.dat")
        shutil.copy(path, renamed)
        assert detect_format(renamed) == fmt
        (found,) = discover_inputs([renamed])
        assert found.format == fmt
        assert sum(b.num_rows for b in iter_batches([found], ReadOptions())) > 0


def test_unknown_content_and_forced_format(tmp_path, dumps):
    other = tmp_path / "notes.jsonl"
    other.write_text('{"loss": 0.5}\n')
    with pytest.raises(InputError, match=r"cannot tell the format of .*notes.jsonl.*; fix: name the format with "
                                         r"--input-format") as err:
        discover_inputs([str(other)])
    assert err.value.exit_code == 3
    (forced,) = discover_inputs([dumps["prime-rl"]], input_format="nemo-rl")
    assert forced.format == "nemo-rl"
    with pytest.raises(UsageError, match="unknown input format 'csv'"):
        discover_inputs([dumps["parquet"]], input_format="csv")
    (auto,) = discover_inputs([dumps["parquet"]], input_format="auto")
    assert auto.format == "parquet"


def test_nemo_log_dir_walk(tmp_path):
    seqs = make_seqs(32, count=2)
    log_dir = tmp_path / "logs" / "exp_001"
    for step in (10, 2, 1):
        write_nemo(str(log_dir / f"train_data_step{step}.jsonl"), seqs)
    write_nemo(str(log_dir / "val_data_step1.jsonl"), seqs)  # validation: not training data
    (log_dir / "metrics.jsonl").write_text('{"loss": 1}\n')
    found = discover_inputs([str(tmp_path / "logs")])
    assert [os.path.basename(f.path) for f in found] == [f"train_data_step{s}.jsonl" for s in (1, 2, 10)]
    assert [int(b.steps[0]) for b in iter_batches(found, ReadOptions())] == [1, 2, 10]
    forced = discover_inputs([str(log_dir)], input_format="nemo-rl")  # forced: every .jsonl
    assert len(forced) == 5
    with pytest.raises(InputError, match=r"no dump file under directory .* \(looked for \*.parquet\)"):
        discover_inputs([str(log_dir)], input_format="parquet")


def test_globs_skip_what_is_not_a_dump(tmp_path):
    seqs = make_seqs(33, count=2)
    write_nemo(str(tmp_path / "train_data_step1.jsonl"), seqs)
    (tmp_path / "README.jsonl").write_text("not json\n")
    found = discover_inputs([str(tmp_path / "*.jsonl")])
    assert [os.path.basename(f.path) for f in found] == ["train_data_step1.jsonl"]
    with pytest.raises(InputError, match="matched no dump file"):
        discover_inputs([str(tmp_path / "README*")])
