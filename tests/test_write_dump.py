"""`mismatch_cli.write_dump`: a trainer writes `[B, T]` tensors; `analyze` reads them back to the same numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import mismatch_cli
from mismatch_cli.errors import DataError, InputError, UsageError


def make_batch(seed: int, rows: int = 24, width: int = 20) -> dict[str, np.ndarray]:
    """Right-padded [B, T] log-probs (float64) with a 0/1 mask; the padding holds junk that must not count."""
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(0.7, size=(rows, width))
    old = rollout + rng.normal(0.01, 0.05, size=(rows, width))
    lengths = rng.integers(1, width + 1, size=rows)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    old[mask == 0] = 0.0  # padding: trainers leave zeros (or anything) there
    rollout[mask == 0] = -123.0
    return {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}


def expected(batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """verl's k1 KL, chi2_token and mean |d| over every valid token, in float64 numpy."""
    d = np.concatenate([(b["old_log_probs"] - b["rollout_log_probs"])[b["response_mask"] == 1] for b in batches])
    n = d.size + 1e-8  # verl's masked_mean
    return {"rollout_corr/kl": float(-d.sum() / n), "rollout_corr/chi2_token": float(np.exp(2 * d).sum() / n - 1),
            "diag/logprob_abs_diff_mean": float(np.abs(d).mean())}


def analyzed(path: Path, **kwargs) -> mismatch_cli.Report:
    return mismatch_cli.analyze([str(path)], device="cpu", dtype="float64", bootstrap=0, hash_inputs=False, **kwargs)


def assert_metrics(report: mismatch_cli.Report, want: dict[str, float], rel: float) -> None:
    for key, value in want.items():
        assert report.metrics[key] == pytest.approx(value, rel=rel, abs=1e-12), key


def test_numpy_keywords_float64_read_back_exactly(tmp_path: Path) -> None:
    batch = make_batch(1)
    path = mismatch_cli.write_dump(tmp_path / "one.parquet", dtype="float64", **batch)
    assert path == tmp_path / "one.parquet"
    assert_metrics(analyzed(path), expected([batch]), rel=1e-9)
    table = pq.read_table(path)
    assert table.column_names == ["old_log_probs", "rollout_log_probs", "response_mask"]  # no step given


def test_torch_tensors_in_a_verl_like_dataproto(tmp_path: Path) -> None:
    batches = [make_batch(seed) for seed in (2, 3, 4)]
    for step, batch in zip((7, 8, 9), batches, strict=True):
        proto = SimpleNamespace(
            batch={"old_log_probs": torch.tensor(batch["old_log_probs"], dtype=torch.float32),
                   "rollout_log_probs": torch.tensor(batch["rollout_log_probs"], dtype=torch.float32),
                   "response_mask": torch.tensor(batch["response_mask"], dtype=torch.int64),
                   "responses": torch.zeros(batch["response_mask"].shape, dtype=torch.int64)},
            meta_info={"global_steps": step},
        )
        written = mismatch_cli.write_dump(tmp_path / "dumps", proto)
        assert written == tmp_path / "dumps" / f"step_{step:06d}.parquet"
    report = analyzed(tmp_path / "dumps", by_step=True)
    # Stored as float32: the reference is the float64 computation on the float32-rounded inputs.
    rounded = [{k: v.astype(np.float32).astype(np.float64) if k != "response_mask" else v for k, v in b.items()}
               for b in batches]
    assert_metrics(report, expected(rounded), rel=1e-6)
    assert [entry["step"] for entry in report.steps] == [7, 8, 9]
    for entry, batch in zip(report.steps, rounded, strict=True):
        assert entry["metrics"]["rollout_corr/kl"] == pytest.approx(expected([batch])["rollout_corr/kl"], rel=1e-6)


def test_bf16_tensors_and_a_bool_mask(tmp_path: Path) -> None:
    batch = make_batch(5)
    old = torch.tensor(batch["old_log_probs"]).to(torch.bfloat16)
    rollout = torch.tensor(batch["rollout_log_probs"]).to(torch.bfloat16)
    path = mismatch_cli.write_dump(tmp_path / "bf16.parquet", {"batch": {
        "old_log_probs": old, "rollout_log_probs": rollout,
        "response_mask": torch.tensor(batch["response_mask"]).bool()}, "meta_info": {"global_steps": 3}})
    want = expected([{"old_log_probs": old.double().numpy(), "rollout_log_probs": rollout.double().numpy(),
                      "response_mask": batch["response_mask"]}])
    assert_metrics(analyzed(path), want, rel=1e-6)
    assert pq.read_table(path).column("step").to_pylist() == [3] * 24


def test_keywords_override_the_batch_and_step_wins_over_meta_info(tmp_path: Path) -> None:
    batch = make_batch(6)
    shifted = batch["rollout_log_probs"] - np.linspace(0.0, 0.05, batch["rollout_log_probs"].size).reshape(24, 20)
    proto = {"batch": {k: torch.tensor(v) for k, v in batch.items()}, "meta_info": {"global_steps": 1}}
    path = mismatch_cli.write_dump(tmp_path / "d", proto, rollout_log_probs=shifted, step=42, dtype="float64")
    assert path.name == "step_000042.parquet"
    mixed = {**batch, "rollout_log_probs": shifted}
    assert_metrics(analyzed(path), expected([mixed]), rel=1e-9)


def test_folder_without_steps_numbers_the_files_and_groups_are_columns(tmp_path: Path) -> None:
    batch = make_batch(8, rows=4)
    first = mismatch_cli.write_dump(tmp_path / "d", **batch, groups={"env_name": ["a", "b", "a", "b"]},
                                    uid=np.array([10, 11, 12, 13]))
    second = mismatch_cli.write_dump(tmp_path / "d", **batch, groups={"env_name": ["a", "b", "a", "b"]})
    assert (first.name, second.name) == ("dump_000000.parquet", "dump_000001.parquet")
    report = analyzed(first, group_by=["env_name"])
    by_env = {g["group"]: g["metrics"]["rollout_corr/kl"] for g in report.groups["env_name"]}
    for label, rows in (("a", [0, 2]), ("b", [1, 3])):
        subset = {k: v[rows] for k, v in batch.items()}
        assert by_env[label] == pytest.approx(expected([subset])["rollout_corr/kl"], rel=1e-6)


@pytest.mark.parametrize(("change", "error", "needles"), [
    ({"old_log_probs": np.zeros(5)}, InputError, ["old_log_probs must be [B, T]", "shape [5]"]),
    ({"rollout_log_probs": np.zeros((3, 4))}, InputError, ["shapes differ", "rollout_log_probs [3, 4]"]),
    ({"old_log_probs": np.zeros((24, 20), dtype=np.int64)}, InputError, ["floating-point", "int64"]),
    ({"response_mask": np.full((24, 20), 2)}, DataError, ["row 0 position 0", "not 0 or 1"]),
    ({"response_mask": np.zeros((0, 20)), "old_log_probs": np.zeros((0, 20)),
      "rollout_log_probs": np.zeros((0, 20))}, DataError, ["empty"]),
    ({"step": "7"}, UsageError, ["step must be an integer"]),
    ({"dtype": "bfloat16"}, UsageError, ["unknown dtype"]),
])
def test_bad_input_is_a_one_line_error(tmp_path: Path, change, error, needles) -> None:
    args = {**make_batch(9), **change}
    with pytest.raises(error) as caught:
        mismatch_cli.write_dump(tmp_path / "bad.parquet", **args)
    text = str(caught.value)
    assert "\n" not in text and "fix:" in text
    for needle in needles:
        assert needle in text
    assert not (tmp_path / "bad.parquet").exists()


def test_a_batch_without_a_role_names_its_keys(tmp_path: Path) -> None:
    proto = SimpleNamespace(batch={"old_log_probs": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)},
                            meta_info={})
    with pytest.raises(InputError, match="no rollout_log_probs in the batch .*old_log_probs, response_mask"):
        mismatch_cli.write_dump(tmp_path / "x.parquet", proto)


def test_import_stays_free_of_torch() -> None:
    code = ("import sys, mismatch_cli; mismatch_cli.write_dump; import mismatch_cli.dump; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


class FakeTensorDict:
    """Shaped like tensordict.TensorDict: keys() and [] but not a collections.abc.Mapping."""

    def __init__(self, tensors: dict) -> None:
        self._tensors = tensors
        self.batch_size = [len(next(iter(tensors.values())))]

    def keys(self):
        return self._tensors.keys()

    def __getitem__(self, key: str):
        return self._tensors[key]


def test_a_tensordict_like_batch_directly_or_inside_a_dataproto(tmp_path: Path) -> None:
    batch = make_batch(10)
    td = FakeTensorDict({k: torch.tensor(v) for k, v in batch.items()})
    direct = mismatch_cli.write_dump(tmp_path / "a.parquet", td, dtype="float64")
    inside = mismatch_cli.write_dump(tmp_path / "b", SimpleNamespace(batch=td, meta_info={"global_steps": 5}),
                                     dtype="float64")
    assert inside.name == "step_000005.parquet"
    for path in (direct, inside):
        assert_metrics(analyzed(path), expected([batch]), rel=1e-9)


def test_advantages_per_token_or_per_row_read_back(tmp_path: Path) -> None:
    from mismatch_cli.errors import UsageError
    from mismatch_cli.io import reader
    from mismatch_cli.io.options import ReadOptions

    batch = make_batch(5)
    rows, width = np.asarray(batch["old_log_probs"]).shape
    per_token = np.arange(rows * width, dtype=np.float64).reshape(rows, width) / 7.0
    per_row = np.linspace(-1.0, 1.0, rows)
    for given, want in ((per_token, per_token.reshape(-1)), (per_row, np.repeat(per_row, width))):
        path = mismatch_cli.write_dump(tmp_path / "adv.parquet", dtype="float64", advantages=given, **batch)
        (read,) = list(reader("parquet")(str(path), ReadOptions(chunk_rows=10**6)))
        np.testing.assert_array_equal(read.advantages, want)
    with pytest.raises(UsageError, match=r"advantages have shape \(3,\)"):
        mismatch_cli.write_dump(tmp_path / "bad.parquet", advantages=np.zeros(3), **batch)
    assert not (tmp_path / "bad.parquet").exists()


def test_process_index_is_a_per_row_column(tmp_path: Path) -> None:
    from mismatch_cli.errors import UsageError

    batch = make_batch(6)
    path = mismatch_cli.write_dump(tmp_path / "rank1.parquet", process_index=1, **batch)
    assert set(pq.read_table(path).column("process_index").to_pylist()) == {1}
    with pytest.raises(UsageError, match="process_index must be an integer"):
        mismatch_cli.write_dump(tmp_path / "bad.parquet", process_index=-1, **batch)
@pytest.mark.parametrize("name", ["token_truncate_band", "sequence_mask_min_only", "empty_row_sequence_truncate",
                                  "length_effect_sequence_mask"])
def test_a_trl_grpo_batch_through_write_dump_gives_trls_keys(name: str, tmp_path: Path) -> None:
    """The docs/python-api.md recipe: the dict `GRPOTrainer._generate_and_score_completions` returns, by TRL's own
    key names, goes through write_dump and `analyze --semantics trl` to the `sampling/*` values TRL computed for
    the same tensors (tests/data/trl_parity_cases.json)."""
    import json

    from helpers import REFERENCE, close
    from typer.testing import CliRunner

    from mismatch_cli.cli import app

    case = next(c for c in json.loads((REFERENCE / "trl_parity_cases.json").read_text())["cases"]
                if c["name"] == name)

    def tensor(key: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([[float(v) for v in row] for row in case[key]], dtype=dtype)

    completion_mask = tensor("response_mask", torch.float64).to(torch.int64)
    out = {  # shaped like TRL 1.16.0's output dict (prompt/completion ids left out: write_dump ignores them)
        "completion_mask": completion_mask,
        "old_per_token_logps": tensor("old_log_prob", torch.float64),
        "sampling_per_token_logps": tensor("rollout_log_prob", torch.float64),
        "advantages": torch.linspace(-1.0, 1.0, completion_mask.shape[0], dtype=torch.float64),
        "num_items_in_batch": completion_mask.sum(),
    }
    mask = out["completion_mask"] * out.get("tool_mask", 1)
    path = mismatch_cli.write_dump(tmp_path / "dumps" / "rank0", out, response_mask=mask,
                                   advantages=out["advantages"], step=7, dtype="float64")
    flags = [a for k, v in case["settings"].items() for a in ("--set", f"{k}={'none' if v is None else v}")]
    result = CliRunner().invoke(app, ["analyze", str(path.parent), "--semantics", "trl", *flags, "--dtype", "float64",
                                      "--format", "json", "--bootstrap", "0", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    def number(v):  # non-finite values are written as strings in both JSON files
        return float(v) if isinstance(v, str) else v

    ours = {k: number(v) for k, v in json.loads(result.stdout)["metrics"].items() if k.startswith("sampling/")}
    want = {k: number(v) for k, v in case["fp64"]["metrics"].items()}
    assert want and set(want) <= set(ours)
    bad = {k: (ours[k], v) for k, v in want.items() if not close(ours[k], v, 1e-9, 1e-12)}
    assert not bad, bad
def test_ms_swift_micro_batches_one_file_each_replay_as_ms_swift_logs(tmp_path: Path) -> None:
    """docs/python-api.md's ms-swift recipe: each micro-batch's tensors under ms-swift's own names (float32 log-probs,
    a bool `completion_mask`), one file per micro-batch, read back by `--semantics ms-swift` to ms-swift's numbers."""
    import json

    from mismatch_cli.correction import CorrectionConfig

    data = json.loads((Path(__file__).parent / "data" / "ms_swift_parity_cases.json").read_text())
    case = next(c for c in data["cases"] if c["name"] == "micro_batch_2_token_truncate")
    old = torch.tensor(case["old_log_prob"], dtype=torch.float32)
    rollout = torch.tensor(case["rollout_log_prob"], dtype=torch.float32)
    mask = torch.tensor(case["response_mask"], dtype=torch.bool)
    for index, start in enumerate(range(0, old.shape[0], 2)):
        rows = slice(start, start + 2)
        mismatch_cli.write_dump(tmp_path / f"step000007_mb{index:06d}.parquet",
                                {"old_per_token_logps": old[rows], "rollout_per_token_logps": rollout[rows],
                                 "completion_mask": mask[rows]}, step=7)
    correction = CorrectionConfig(semantics="ms-swift", family_fields=dict(case["settings"]))
    report = mismatch_cli.analyze([str(tmp_path)], correction, device="cpu", dtype="float64", bootstrap=0,
                                  hash_inputs=False)
    for key, value in case["fp64"]["metrics"].items():
        assert report.metrics[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key


def test_policy_versions_and_token_ids_travel_with_the_dump(tmp_path) -> None:
    from mismatch_cli.api import analyze as run_analyze
    from mismatch_cli.correction import CorrectionConfig

    rng = np.random.default_rng(5)
    old = -rng.exponential(1.0, (8, 12)).astype(np.float32)
    ids = rng.integers(0, 50, (8, 12))
    path = mismatch_cli.write_dump(tmp_path / "d.parquet", old_log_probs=old, rollout_log_probs=old + 0.01,
                      response_mask=np.ones((8, 12), np.int8), policy_version=np.arange(8) % 2, token_ids=ids)
    table = pq.read_table(path)
    assert table.column("policy_version").to_pylist() == (np.arange(8) % 2).tolist()
    assert table.column("response_ids").to_pylist() == ids.tolist()
    report = run_analyze([str(path)], CorrectionConfig(), bootstrap=0).to_dict()
    assert report["metrics"]["diag/valid_tokens"] == 96
    with pytest.raises(UsageError, match="policy_version"):
        mismatch_cli.write_dump(tmp_path / "e.parquet", old_log_probs=old, rollout_log_probs=old,
                                response_mask=np.ones((8, 12)),
                   policy_version=[1, 2])
