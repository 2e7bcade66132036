"""`mismatch analyze s3://...` against a local S3 server (moto): the same report as the local files, and
one-line errors naming the URI when the store cannot serve it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moto", reason="the object-store tests need moto[server] (the dev extra)")
pytest.importorskip("boto3")

from adversarial.conftest import assert_clean_failure, mismatch  # noqa: E402
from object_store import BUCKET, free_port, moto_server, store, store_env  # noqa: E402

from mismatch_cli.api import analyze  # noqa: E402
from mismatch_cli.errors import InputError, UsageError  # noqa: E402
from mismatch_cli.synth import SynthSpec, write_synthetic_dump  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Everything a report says about the data (not about where it came from) must match exactly. The bootstrap
# intervals are left out: each file's resampling weights are keyed by its name (engine/core/bootstrap.py), so
# the same bytes under another name get other, equally valid, intervals.
SAME = ("metrics", "summary", "steps", "groups", "rounds", "rounds_from_end", "quantiles", "histograms", "what_if")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto server holding a run folder (three parquet files, a README, a hidden file) and single dumps."""
    local = tmp_path_factory.mktemp("run")
    with store() as server:
        for step, seed in ((2, 1), (10, 2), (1, 3)):  # natural order: step_1, step_2, step_10
            path = local / "run" / f"step_{step}" / "part.parquet"
            path.parent.mkdir(parents=True)
            write_synthetic_dump(path, SynthSpec(tokens=12_000, turns=2, seed=seed, steps=2, row_group_tokens=3_000))
            server.upload(path, f"run/step_{step}/part.parquet")
        (local / "run" / "README.md").write_text("not a dump\n")
        server.upload(local / "run" / "README.md", "run/README.md")
        server.upload(local / "run" / "README.md", "run/.hidden.parquet")  # hidden: skipped, like a local walk
        server.upload(local / "run" / "README.md", "docs/README.md")
        for name in ("single_turn.parquet", "multi_turn.parquet", "packed.safetensors"):
            server.upload(ROOT / "sample_data" / name, f"samples/{name}")
        _bf16_dump(local / "bf16.safetensors")
        server.upload(local / "bf16.safetensors", "samples/bf16.safetensors")
        (local / "train_data_step1.jsonl").write_text('{"prev_logprobs": [-0.1], "generation_logprobs": [-0.2]}\n')
        server.upload(local / "train_data_step1.jsonl", "nemo/train_data_step1.jsonl")
        yield server, local


def _bf16_dump(path: Path) -> None:
    """A padded [B, T] dump in bf16 (numpy has none: the object-store reader widens raw bits itself)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    rng = np.random.default_rng(7)
    old = torch.from_numpy(-rng.exponential(0.5, (40, 33)).astype(np.float32)).to(torch.bfloat16)
    rollout = (old.float() + torch.from_numpy(rng.normal(0, 0.02, (40, 33)).astype(np.float32))).clamp(max=0)
    mask = torch.from_numpy((rng.random((40, 33)) < 0.8).astype(np.int8))
    save_file({"old_log_probs": old, "rollout_log_probs": rollout.to(torch.bfloat16), "response_mask": mask},
              str(path))


def _report(*paths: object, by: tuple[str, ...] = ()) -> dict:
    """The report of `paths` through the library, in this process (a CLI run costs seconds of start-up)."""
    return json.loads(analyze([str(p) for p in paths], group_by=by, device="cpu").to_json())


@pytest.fixture
def s3_env(s3, monkeypatch):
    """This process's environment pointed at the moto server, as a user's shell would be."""
    server, local = s3
    for name, value in server.env.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    return server, local


def _assert_same(remote: dict, local: dict) -> None:
    for key in SAME:
        assert remote[key] == local[key], key
    assert remote["intervals"].keys() == local["intervals"].keys()
    assert [(i["format"], i["bytes"], i["sequences"], i["tokens"]) for i in remote["inputs"]] == [
        (i["format"], i["bytes"], i["sequences"], i["tokens"]) for i in local["inputs"]]
    assert all(i["sha256"] is None for i in remote["inputs"])  # objects are not downloaded twice to hash them
    assert remote["metrics"]["diag/valid_tokens"] == sum(i["tokens"] for i in local["inputs"]) > 0


def test_a_prefix_through_the_cli_equals_the_local_folder(s3, tmp_path) -> None:
    server, local = s3
    out = tmp_path / "out"  # outputs stay local
    run = mismatch("analyze", f"s3://{BUCKET}/run/", "--by", "step", "--format", "json", "--quiet", "--out-dir", out,
                   "--no-plots", env=server.env, timeout=120)
    assert run.code == 0, run.stderr
    remote = json.loads(run.stdout)
    _assert_same(remote, _report(local / "run", by=("step",)))
    assert [i["path"] for i in remote["inputs"]] == [f"s3://{BUCKET}/run/step_{n}/part.parquet" for n in (1, 2, 10)]
    assert len(remote["steps"]) == 2
    assert json.loads((out / "report.json").read_text())["metrics"] == remote["metrics"]


def test_jobs_read_the_objects_in_workers_and_change_nothing(s3, tmp_path) -> None:
    # The parent lists the prefix (pyarrow's S3 client is up) before the workers fork; each reads its own objects.
    server, local = s3
    run = mismatch("analyze", f"s3://{BUCKET}/run/", "--by", "step", "--format", "json", "--quiet", "--jobs", "3",
                   env=server.env, timeout=120)
    assert run.code == 0, run.stderr
    _assert_same(json.loads(run.stdout), _report(local / "run", by=("step",)))


def test_one_parquet_object_equals_the_local_file(s3_env) -> None:
    _, local = s3_env
    remote = _report(f"s3://{BUCKET}/run/step_10/part.parquet", by=("step",))
    _assert_same(remote, _report(local / "run" / "step_10" / "part.parquet", by=("step",)))
    assert remote["inputs"][0]["path"] == f"s3://{BUCKET}/run/step_10/part.parquet"
    # Without the trailing slash a prefix is the same folder.
    assert _report(f"s3://{BUCKET}/run")["metrics"] == _report(local / "run")["metrics"]


def test_a_glob_over_keys(s3_env) -> None:
    _, local = s3_env
    remote = _report(f"s3://{BUCKET}/run/step_1*/*.parquet")
    assert [i["path"] for i in remote["inputs"]] == [f"s3://{BUCKET}/run/step_{n}/part.parquet" for n in (1, 10)]
    _assert_same(remote, _report(local / "run" / "step_1" / "part.parquet", local / "run" / "step_10" / "part.parquet"))
    everything = _report(f"s3://{BUCKET}/**/part.parquet")
    assert len(everything["inputs"]) == 3


@pytest.mark.parametrize("name", ["packed.safetensors", "multi_turn.parquet", "bf16.safetensors"])
def test_other_dumps_stream_from_the_store(s3_env, name) -> None:
    _, local = s3_env
    path = local / name if name.startswith("bf16") else ROOT / "sample_data" / name
    _assert_same(_report(f"s3://{BUCKET}/samples/{name}"), _report(path))


def test_a_mix_of_local_files_and_objects(s3_env) -> None:
    remote = _report(ROOT / "sample_data" / "single_turn.parquet", f"s3://{BUCKET}/samples/packed.safetensors")
    both = _report(ROOT / "sample_data" / "single_turn.parquet", ROOT / "sample_data" / "packed.safetensors")
    for key in SAME:
        assert remote[key] == both[key], key
    assert remote["inputs"][0]["sha256"] == both["inputs"][0]["sha256"] is not None  # local files are still hashed
    assert remote["inputs"][1]["sha256"] is None


def test_names_that_find_nothing(s3_env) -> None:
    with pytest.raises(InputError, match="nothing-here/: no such object or prefix"):
        analyze([f"s3://{BUCKET}/nothing-here/"])
    with pytest.raises(InputError, match="no dump object under prefix s3://dumps/docs/"):
        analyze([f"s3://{BUCKET}/docs/"])  # holds only a README
    with pytest.raises(InputError, match="pattern s3://dumps/run/\\*\\*/\\*.pt matched no object"):
        analyze([f"s3://{BUCKET}/run/**/*.pt"])
    with pytest.raises(InputError, match="no-such-bucket/x.parquet: no such bucket"):
        analyze(["s3://no-such-bucket/x.parquet"])
    with pytest.raises(UsageError, match="BUCKET/KEY"):
        analyze(["s3://"])


def test_a_missing_object_is_one_line(s3) -> None:
    server, _ = s3
    uri = f"s3://{BUCKET}/run/step_3/part.parquet"
    assert_clean_failure(mismatch("analyze", uri, env=server.env), 3, uri, "no such object")


def test_a_missing_bucket_is_one_line(s3) -> None:
    server, _ = s3
    uri = "s3://no-such-bucket/run/"
    assert_clean_failure(mismatch("analyze", uri, env=server.env), 3, uri, "no such bucket")


def test_formats_that_cannot_stream_are_refused_by_name(s3) -> None:
    server, _ = s3
    uri = f"s3://{BUCKET}/nemo/train_data_step1.jsonl"
    line = assert_clean_failure(mismatch("analyze", uri, env=server.env), 2, uri, "object store")
    assert "copy the dump to a local folder" in line


def test_a_prefix_holding_a_dump_that_cannot_stream_is_refused(s3_env) -> None:
    with pytest.raises(UsageError, match="nemo/train_data_step1.jsonl from an object store"):
        analyze([f"s3://{BUCKET}/nemo/"])  # not skipped: a folder read without it would be a misread


def test_an_unreachable_endpoint_fails_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    run = mismatch("analyze", f"s3://{BUCKET}/x.parquet", env=store_env(url), timeout=60)
    assert_clean_failure(run, 3, f"s3://{BUCKET}/x.parquet", url, "did not answer")
    assert time.monotonic() - started < 45


def test_access_denied_names_the_credentials(monkeypatch) -> None:
    with moto_server(require_auth=True) as url:  # every request must be signed by a known IAM key
        uri = f"s3://{BUCKET}/run/"
        line = assert_clean_failure(mismatch("analyze", uri, env=store_env(url, key="AKIANOBODY")), 3, uri,
                                    "access denied")
        assert "AWS_ACCESS_KEY_ID" in line
        for name, value in store_env(url, key="AKIANOBODY").items():
            monkeypatch.setenv(name, value)
        with pytest.raises(InputError, match="x.parquet: access denied"):
            analyze([f"s3://{BUCKET}/x.parquet"])  # one object: HeadObject, not a listing


@pytest.mark.parametrize("target", ["s3://dumps/report.json", "gs://b/out", Path("s3://dumps/out")])
def test_an_object_store_output_is_refused_not_written_as_a_local_folder(target, tmp_path, monkeypatch) -> None:
    from mismatch_cli.system.output import Outputs

    monkeypatch.chdir(tmp_path)
    for check, flag in ((Outputs([]).check, "-o"), (Outputs([]).check_dir, "--out-dir")):
        with pytest.raises(UsageError, match=f"cannot write {flag} .*outputs are local files"):
            check(target, flag)
    assert list(tmp_path.iterdir()) == []
