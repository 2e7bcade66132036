"""Object-store naming without a server: URIs, key globs, and which store failures get which message."""

from __future__ import annotations

import pytest

from mismatch_cli.errors import UsageError
from mismatch_cli.io.remote import _glob_match, endpoint, is_remote, natural_key, split_uri, store_error


def test_uris() -> None:
    assert is_remote("s3://b/k") and is_remote("GS://b/k") and is_remote("gcs://b")
    assert not is_remote("runs/s3://x") and not is_remote("/data/run.parquet")
    assert split_uri("s3://bucket/run/step_1/x.parquet") == ("s3", "bucket", "run/step_1/x.parquet")
    assert split_uri("gs://bucket") == ("gs", "bucket", "")
    for bad in ("s3://", "s3:///key", "s3://buck*/x"):
        with pytest.raises(UsageError, match="BUCKET/KEY"):
            split_uri(bad)


@pytest.mark.parametrize(("path", "pattern", "expected"), [
    ("b/run/step_1/part.parquet", "b/run/*/part.parquet", True),
    ("b/run/step_1/deep/part.parquet", "b/run/*/part.parquet", False),  # `*` stays within one level
    ("b/run/step_1/deep/part.parquet", "b/run/**/part.parquet", True),
    ("b/run/part.parquet", "b/run/**/part.parquet", True),  # `**/` may match no folder
    ("b/run/step_7.parquet", "b/run/step_?.parquet", True),
    ("b/run/step_17.parquet", "b/run/step_?.parquet", False),
    ("b/run/step_3.parquet", "b/run/step_[1-3].parquet", True),
    ("b/run/step_4.parquet", "b/run/step_[!4].parquet", False),
    ("b/run/a+b.parquet", "b/run/a+b.parquet", True),  # regex characters are literal
])
def test_key_globs(path: str, pattern: str, expected: bool) -> None:
    assert _glob_match(path, pattern) is expected


def test_natural_order_of_keys() -> None:
    keys = ["r/step_10/a", "r/step_9/a", "r/step_1/b", "r/step_1/a"]
    assert sorted(keys, key=natural_key) == ["r/step_1/a", "r/step_1/b", "r/step_9/a", "r/step_10/a"]


@pytest.mark.parametrize(("text", "expected"), [
    ("When getting information for key 'x' in bucket 'b': AWS Error NO_SUCH_BUCKET during HeadObject",
     "no such bucket"),
    ("AWS Error ACCESS_DENIED during HeadObject operation: No response body.", "access denied"),
    ("AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: The AWS Access Key Id ...", "access denied"),
    ("AWS Error SIGNATURE_DOES_NOT_MATCH during GetObject operation", "access denied"),
    ("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server; "
     "Details: Failed to connect to 127.0.0.1:9 after 0 ms", "did not answer (Failed to connect to 127.0.0.1:9"),
    ("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 28, Timeout was reached", "did not answer"),
])
def test_store_failures_are_named(text: str, expected: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    error = store_error(OSError(text), "s3://b/x.parquet")
    assert error is not None and error.exit_code == 3
    assert error.message.startswith("cannot read s3://b/x.parquet: ") and expected in error.message
    assert "\n" not in str(error)


def test_other_failures_are_left_to_the_reader() -> None:
    assert store_error(OSError("Parquet magic bytes not found in footer"), "s3://b/x.parquet") is None
    assert "no such object" in store_error(FileNotFoundError(2, "Path does not exist"), "s3://b/x").message


def test_the_endpoint_variables(monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert endpoint() is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://a:1")
    assert endpoint() == "http://a:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://b:2")  # the service-specific one wins, as in the AWS SDKs
    assert endpoint() == "http://b:2"
