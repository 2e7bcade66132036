"""`mismatch analyze` / `convert` on slime, NeMo-RL and prime-rl dumps as they are: same numbers as the
equivalent parquet, numbers checked by hand in numpy, data quality with examples, --by COLUMN."""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mismatch_cli.cli import app

sys.path.append(str(Path(__file__).resolve().parent / "io"))  # the dump writers live next to the reader tests
from framework_dumps import (  # noqa: E402
    Seq,
    flat,
    make_seqs,
    write_nemo,
    write_parquet,
    write_prime,
    write_slime_rollout,
    write_slime_train,
)

runner = CliRunner(env={"NO_COLOR": None, "FORCE_COLOR": None, "MISMATCH_DEBUG": None})
FORMATS = ("slime", "nemo-rl", "prime-rl")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(result) -> None:
    assert result.exit_code == 0, (result.exit_code, result.output)
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)


def error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def report(*args) -> dict:
    result = invoke("analyze", *args, "--format", "json", "--device", "cpu", "--dtype", "float64", "-q")
    ok(result)
    return json.loads(result.stdout)


def write(fmt: str, root: Path, seqs: list[Seq], step: int = 0) -> str:
    """The dump of `fmt` for `seqs`, at the place the trainer would put it under `root`."""
    if fmt == "slime":
        return write_slime_train(str(root / "train_data" / f"{step}.pt"), seqs, rollout_id=step)
    if fmt == "nemo-rl":
        return write_nemo(str(root / f"train_data_step{step}.jsonl"), seqs)
    return write_prime(str(root / "token_exports"), step, 0, seqs)


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-12 * abs(b) + 1e-15


def masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    """verl's masked_mean, by hand: sum over valid tokens / (count + 1e-8)."""
    return float(values[mask].sum() / (mask.sum() + 1e-8))


def assert_same_metrics(got: dict, want: dict, skip: tuple[str, ...] = ()) -> None:
    keys = set(got) | set(want)
    bad = {k: (got.get(k), want.get(k)) for k in keys if k not in skip and not close(got.get(k), want.get(k))}
    assert not bad, bad


# ------------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_numbers_as_the_equivalent_parquet(tmp_path, fmt):
    seqs = make_seqs(41, count=9)
    dump = write(fmt, tmp_path / "run", seqs)
    flags = ("--is", "token", "--rs", "token_k3", "--rs-threshold", "0.01")
    ours = report(dump, *flags)
    base = report(write_parquet(str(tmp_path / "same.parquet"), seqs), *flags)
    assert ours["inputs"][0]["format"] == fmt
    assert_same_metrics(ours["metrics"], base["metrics"])
    assert ours["rounds"] == base["rounds"]
    old, rollout, mask = flat(seqs)
    assert ours["metrics"]["diag/valid_tokens"] == mask.sum() == ours["inputs"][0]["tokens"]
    assert close(ours["metrics"]["rollout_corr/kl"], masked_mean(rollout - old, mask))
    assert close(ours["metrics"]["diag/logprob_abs_diff_mean"], float(np.mean(np.abs(old[mask] - rollout[mask]))))
    assert ours["metrics"]["diag/sequences"] == len(seqs)


def _with_bad_tokens(seqs: list[Seq]) -> tuple[list[Seq], list[Seq], dict[str, tuple[int, int]]]:
    """Dirty copies of `seqs` and the clean equivalent (excluded tokens masked out), with where each case is."""
    dirty = copy.deepcopy(seqs)
    cases = {  # category: (row, response position, side, value)
        "nonfinite_tokens": (1, 0, "old", float("nan")),
        "sentinel_tokens": (2, 0, "rollout", -9999.0),
        "positive_logprob_tokens": (4, 0, "old", 0.25),
        "one_side_zero_tokens": (5, 0, "rollout", 0.0),
    }
    where = {}
    for category, (row, position, side, value) in cases.items():
        getattr(dirty[row], side)[position] = value
        dirty[row].mask[position] = 1
        where[category] = (row, position)
    dirty[6].rollout[0] = float("-inf")  # a second non-finite token
    dirty[6].mask[0] = 1
    clean = copy.deepcopy(dirty)
    for row in (1, 2, 6):  # excluded tokens behave exactly like padding
        clean[row].mask[0] = 0
        clean[row].old[0] = clean[row].rollout[0] = -1.0
    return dirty, clean, where


@pytest.mark.parametrize("fmt", FORMATS)
def test_data_quality_counted_excluded_and_located(tmp_path, fmt):
    dirty, clean, where = _with_bad_tokens(make_seqs(42, count=8))
    dump = write(fmt, tmp_path / "run", dirty)
    ours = report(dump)
    base = report(write_parquet(str(tmp_path / "clean.parquet"), clean))
    # NaN/inf and sentinels are excluded (same numbers as with them masked out); > 0 and 0.0 one side are kept.
    # (An excluded token still belongs to its round's run of 1s, so only the round count may differ.)
    skip = ("diag/nonfinite_tokens", "diag/sentinel_tokens", "diag/rounds")
    assert_same_metrics(ours["metrics"], base["metrics"], skip=skip)
    entry = ours["data_quality"]["files"][dump]
    assert (entry["nonfinite_tokens"], entry["sentinel_tokens"]) == (2, 1)
    assert (entry["positive_logprob_tokens"], entry["one_side_zero_tokens"]) == (1, 1)
    assert ours["metrics"]["diag/nonfinite_tokens"] == 2 and ours["metrics"]["diag/sentinel_tokens"] == 1
    for category, (row, position) in where.items():
        example = entry["examples"][category][0]
        offset = 0 if fmt == "slime" else dirty[row].prompt  # full-sequence formats count the prompt
        assert (example["file"], example["row"], example["position"]) == (dump, row, position + offset)
    assert [e["row"] for e in entry["examples"]["nonfinite_tokens"]] == [1, 6]
    assert entry["examples"]["sentinel_tokens"][0]["rollout_log_prob"] == -9999.0
    warning = next(w for w in ours["warnings"] if "sentinel log-prob" in w)
    assert warning.startswith("1 valid tokens") and f"(first: {dump} row 2 position" in warning


def test_by_env_name_weights_groups_by_their_tokens(tmp_path):
    seqs0, seqs1 = make_seqs(43, count=8, step=0), make_seqs(44, count=6, step=1)
    root = tmp_path / "out" / "token_exports"
    write_prime(str(root), 0, 0, seqs0[:5])
    write_prime(str(root), 0, 1, seqs0[5:])
    write_prime(str(root), 1, 0, seqs1)
    ours = report(str(root), "--by", "step", "--by", "env_name")
    assert [s["step"] for s in ours["steps"]] == [0, 1]
    groups = {g["group"]: g for g in ours["groups"]["env_name"]}
    assert sorted(groups) == ["code", "math"]
    everything = seqs0 + seqs1
    for env, group in groups.items():
        old, rollout, mask = flat([s for s in everything if s.env == env])
        assert group["valid_tokens"] == mask.sum()
        assert close(group["metrics"]["rollout_corr/kl"], masked_mean(rollout - old, mask))
    # Token means combine with token weights: no per-env vs overall inconsistency (verl's masked_mean
    # divides by count + 1e-8, so the weights are count + 1e-8 for the combination to be exact).
    total = sum(g["valid_tokens"] for g in groups.values())
    combined = sum((g["valid_tokens"] + 1e-8) * g["metrics"]["rollout_corr/kl"] for g in groups.values())
    assert total == ours["metrics"]["diag/valid_tokens"]
    assert math.isclose(combined / (total + 1e-8), ours["metrics"]["rollout_corr/kl"], rel_tol=1e-12)
    assert ours["config"]["group_by"] == ["env_name"] and ours["config"]["by_step"] is True
    same = report(write_parquet(str(tmp_path / "same.parquet"), everything), "--by", "env_name")
    for a, b in zip(ours["groups"]["env_name"], same["groups"]["env_name"], strict=True):
        assert a["group"] == b["group"] and a["valid_tokens"] == b["valid_tokens"]
        assert_same_metrics(a["metrics"], b["metrics"])


def test_slime_folder_of_rollout_ids_gives_steps(tmp_path):
    root = tmp_path / "dump_details"
    for rollout_id in (0, 1, 2):
        seqs = make_seqs(50 + rollout_id, count=4)
        write_slime_train(str(root / "train_data" / f"{rollout_id}.pt"), seqs, rollout_id=rollout_id)
        write_slime_rollout(str(root / "rollout_data" / f"{rollout_id}.pt"), seqs, rollout_id=rollout_id)
    ours = report(str(root), "--by", "step")
    assert [s["step"] for s in ours["steps"]] == [0, 1, 2]
    assert [os.path.basename(i["path"]) for i in ours["inputs"]] == ["0.pt", "1.pt", "2.pt"]


def test_nemo_steps_from_file_names(tmp_path):
    for step in (3, 1):
        write_nemo(str(tmp_path / f"train_data_step{step}.jsonl"), make_seqs(step, count=3))
    ours = report(str(tmp_path), "--by", "step")
    assert [s["step"] for s in ours["steps"]] == [1, 3]


# ------------------------------------------------------------------------------------------------ errors


def test_refused_pickles_exit_3(tmp_path):
    path = write_slime_rollout(str(tmp_path / "rollout_data" / "0.pt"), make_seqs(45), 0)
    error(invoke("analyze", path), 3, "slime rollout-side dump", "fix: analyze the train-side dump")


def test_incomplete_prime_step_is_reported(tmp_path):
    path = write_prime(str(tmp_path), 4, 0, make_seqs(46, count=3), stable=False)
    ours = report(path)
    assert any("has no STABLE marker" in w for w in ours["warnings"])
    assert "STABLE" in ours["data_quality"]["files"][path]["notes"][0]


def test_length_mismatch_names_the_row(tmp_path):
    seqs = make_seqs(47, count=3)
    import torch

    seqs[1].extra = {"loss_masks": torch.ones(len(seqs[1].old) + 1, dtype=torch.int32)}
    path = write_slime_train(str(tmp_path / "0.pt"), seqs, 0)
    error(invoke("analyze", path), 3, "row 1 (rollout_position 1)", "in 'loss_masks'")


def test_by_and_input_format_errors(tmp_path):
    path = write_nemo(str(tmp_path / "train_data_step0.jsonl"), make_seqs(48, count=2))
    error(invoke("analyze", path, "--by", "data_source"), 3, "no field 'data_source' (asked for by --by data_source)")
    error(invoke("analyze", path, "--by", ""), 2, "--by expects")
    error(invoke("analyze", path, "--input-format", "parquet"), 3, "cannot read", "as parquet")
    error(invoke("analyze", path, "--input-format", "csv"), 2)
    renamed = tmp_path / "dump.txt"
    renamed.write_bytes(Path(path).read_bytes())
    assert report(str(renamed), "--input-format", "nemo-rl")["inputs"][0]["format"] == "nemo-rl"
    assert report(str(renamed))["inputs"][0]["format"] == "nemo-rl"  # found from the content alone


# ------------------------------------------------------------------------------------------------ convert


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_command(tmp_path, fmt):
    dirty, _, _ = _with_bad_tokens(make_seqs(49, count=8))
    dump = write(fmt, tmp_path / "run", dirty, step=3)
    out = tmp_path / "converted.parquet"
    result = invoke("convert", dump, "-o", out)
    ok(result)
    assert f"wrote {out}: 8 sequences" in result.stderr
    assert "2 valid tokens with a NaN or infinite log-prob (copied as they are" in result.stderr
    assert_same_metrics(report(str(out), "--by", "step")["metrics"], report(dump)["metrics"])
    assert report(str(out), "--by", "step")["steps"][0]["step"] == 3


def test_convert_errors(tmp_path):
    path = write_nemo(str(tmp_path / "train_data_step0.jsonl"), make_seqs(50, count=2))
    error(invoke("convert", path, "-o", "-"), 2, "not stdout")
    error(invoke("convert", path, "-o", tmp_path), 2, "is a directory")
    error(invoke("convert", str(tmp_path / "missing.jsonl"), "-o", tmp_path / "x.parquet"), 3, "no such file")
    assert not (tmp_path / "x.parquet").exists()
    result = invoke("convert", path)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)  # -o is required


def test_groups_and_examples_do_not_depend_on_chunking(tmp_path):
    from mismatch_cli.api import analyze
    from mismatch_cli.io import ReadOptions

    dirty, _, _ = _with_bad_tokens(make_seqs(51, count=8))
    root = str(tmp_path / "token_exports")
    write_prime(root, 0, 0, dirty[:5])
    write_prime(root, 1, 0, dirty[5:])

    def run(rows: int):
        return analyze([root], read_options=ReadOptions(chunk_rows=rows), device="cpu", dtype="float64",
                       group_by=["step", "env_name"], hash_inputs=False)

    whole, single = run(1024), run(1)
    assert_same_metrics(single.metrics, whole.metrics)
    for a, b in zip(single.groups["env_name"] + single.steps, whole.groups["env_name"] + whole.steps, strict=True):
        assert a["valid_tokens"] == b["valid_tokens"]
        assert_same_metrics(a["metrics"], b["metrics"])
    assert json.dumps(single.data_quality) == json.dumps(whole.data_quality)  # examples in the same order, NaN too
