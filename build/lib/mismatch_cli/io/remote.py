"""Object-store inputs (`s3://`, `gs://`) through `pyarrow.fs`: naming, discovery, opening, and errors.

A URI names one object, a prefix ("folder", walked recursively) or a glob over keys. Credentials come
from the SDKs' standard places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or
~/.aws for S3, GOOGLE_APPLICATION_CREDENTIALS for GCS). The S3 endpoint comes from
AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL: pyarrow's `S3FileSystem()` ignores both (only
`FileSystem.from_uri` reads them), so they are read here. Every call is bounded: a connect timeout, a
stalled-transfer timeout and at most three attempts, so an unreachable endpoint fails in seconds.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..errors import InputError, UsageError

SCHEMES = ("s3://", "gs://", "gcs://")
# Formats whose readers need only ranged reads (parquet row groups, safetensors byte ranges).
STREAMABLE = frozenset({"parquet", "safetensors"})
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 20.0  # a transfer stalled this long is abandoned
ATTEMPTS = 3
GCS_RETRY_S = 5.0  # google-cloud-cpp retries a failing call this long (plus backoff): unreachable fails in ~10 s
DETAIL_CHARS = 200
_EXTENSIONS = {".parquet": "parquet", ".safetensors": "safetensors", ".pt": "slime", ".pth": "slime",
               ".jsonl": "jsonl"}
_GLOB_CHARS = frozenset("*?[")
_CREDENTIALS_HINT = ("check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or GOOGLE_APPLICATION_CREDENTIALS) and that "
                     "they may read this bucket")


def is_remote(path: str) -> bool:
    """True for an object-store URI (`s3://`, `gs://`, `gcs://`)."""
    return isinstance(path, str) and path.lower().startswith(SCHEMES)


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of an object-store URI; UsageError when it names no bucket."""
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket or _GLOB_CHARS & set(bucket):
        raise UsageError(f"expected {scheme}://BUCKET/KEY, got {uri}", hint="name the bucket, then the key or prefix")
    return scheme.lower(), bucket, key


def endpoint() -> str | None:
    """The S3 endpoint from AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (None: AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def filesystem(uri: str) -> tuple[Any, str]:
    """The pyarrow FileSystem serving `uri` and the path within it (`bucket/key`)."""
    scheme, bucket, key = split_uri(uri)
    where = f"{bucket}/{key}".rstrip("/") if key else bucket
    try:
        if scheme == "s3":
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            # Keyed by the access key too: a notebook that switches credentials gets a fresh client.
            return _s3(bucket, endpoint(), region, os.environ.get("AWS_ACCESS_KEY_ID")), where
        return _gcs(), where
    except OSError as exc:
        raise remote_error(exc, uri) from None
    except ImportError:  # pragma: no cover - a pyarrow built without S3/GCS
        raise UsageError(f"cannot read {uri}: this pyarrow was built without {scheme} support",
                         hint="install the pyarrow wheel from PyPI, or copy the dump to a local folder") from None


@functools.lru_cache(maxsize=16)
def _s3(bucket: str, url: str | None, region: str | None, access_key: str | None) -> Any:
    from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem, resolve_s3_region

    if region is None and url is None:
        region = resolve_s3_region(bucket)  # AWS itself: the bucket's region, or every request is redirected
    return S3FileSystem(region=region, endpoint_override=url, connect_timeout=CONNECT_TIMEOUT_S,
                        request_timeout=REQUEST_TIMEOUT_S,
                        retry_strategy=AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS))


@functools.lru_cache(maxsize=1)
def _gcs() -> Any:
    from pyarrow.fs import GcsFileSystem

    return GcsFileSystem(retry_time_limit=timedelta(seconds=GCS_RETRY_S))


def remote_error(exc: BaseException, uri: str) -> InputError:
    """The one-line InputError (exit 3) for an object-store failure, naming the URI and the likely fix."""
    known = store_error(exc, uri)
    if known is not None:
        return known
    return InputError(f"cannot read {uri}: {_detail(' '.join(str(exc).split()))}",
                      hint="check the URI, the credentials and the endpoint")


def store_error(exc: BaseException, uri: str) -> InputError | None:
    """The InputError for a failure of the store itself (no bucket or object, access, network), else None."""
    text = " ".join(str(exc).split())
    upper = text.upper()
    if "NO_SUCH_BUCKET" in upper or "NOSUCHBUCKET" in upper:
        return InputError(f"cannot read {uri}: no such bucket", hint="check the bucket name (and the endpoint)")
    if any(word in upper for word in ("ACCESS_DENIED", "ACCESSDENIED", "INVALIDACCESSKEYID", "INVALID_ACCESS_KEY_ID",
                                      "SIGNATUREDOESNOTMATCH", "SIGNATURE_DOES_NOT_MATCH",
                                      "FORBIDDEN", "HTTP 403", "PERMISSION_DENIED")):
        return InputError(f"cannot read {uri}: access denied", hint=_CREDENTIALS_HINT)
    if any(word in upper for word in ("NETWORK_CONNECTION", "CURLCODE", "COULD NOT CONNECT", "TIMEOUT",
                                      "COULD NOT RESOLVE", "UNAVAILABLE")):
        if uri.lower().startswith("s3://"):
            shown, hint = endpoint() or "the default endpoint", "check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3)"
        else:
            shown, hint = "Google Cloud Storage", "check GOOGLE_APPLICATION_CREDENTIALS (or STORAGE_EMULATOR_HOST)"
        return InputError(f"cannot read {uri}: the object store at {shown} did not answer ({_detail(text)})",
                          hint=f"{hint} and the network")
    if isinstance(exc, FileNotFoundError) or "NO_SUCH_KEY" in upper:
        return InputError(f"cannot read {uri}: no such object or prefix",
                          hint="check the key (list the bucket with your object-store client)")
    return None


def _detail(text: str) -> str:
    """The store's own reason, cut to one short clause (google-cloud-cpp repeats its whole retry history)."""
    match = (re.search(r"Details: (.*)$", text) or re.search(r"AWS Error (.*)$", text)
             or re.search(r"underlying error message was: (.*?)(?: error_info=|$)", text))
    detail = (match.group(1) if match else text).strip().rstrip(".")
    return detail if len(detail) <= DETAIL_CHARS else detail[:DETAIL_CHARS].rstrip() + "…"


def expand_remote(arg: str, forced: str | None) -> list[tuple[str, str, int]]:
    """(uri, format, bytes) of every dump `arg` names: one object, every dump below a prefix, or a glob's matches."""
    from pyarrow.fs import FileSelector, FileType

    scheme, bucket, key = split_uri(arg)
    fs, where = filesystem(arg)
    base = f"{scheme}://"
    try:
        if _GLOB_CHARS & set(key):
            stem = re.split(r"[*?\[]", key, maxsplit=1)[0].rpartition("/")[0]
            listed = fs.get_file_info(FileSelector(f"{bucket}/{stem}".rstrip("/"), recursive=True,
                                                   allow_not_found=True))
            pattern = f"{bucket}/{key}"
            found = [i for i in listed if i.type == FileType.File and _glob_match(i.path, pattern)]
            if not found:
                raise InputError(f"pattern {arg} matched no object", hint="check the pattern (quote it; ** spans "
                                 "folders)")
            return _typed(base, found, forced, arg, keep_unknown=False)
        info = fs.get_file_info(where)
        if info.type == FileType.File and not key.endswith("/"):
            return _typed(base, [info], forced, arg, keep_unknown=True)
        listed = fs.get_file_info(FileSelector(where, recursive=True, allow_not_found=True))
        if not listed and fs.get_file_info(bucket).type == FileType.NotFound:
            raise InputError(f"cannot read {arg}: no such bucket", hint="check the bucket name (and the endpoint)")
    except OSError as exc:
        raise remote_error(exc, arg) from None
    found = [i for i in listed if i.type == FileType.File and not _hidden(i.path, where)]
    typed = _typed(base, found, forced, arg, keep_unknown=False)
    if not typed:
        what = "prefix" if listed else "object or prefix"
        raise InputError(f"no dump object under {what} {arg}" if listed else f"cannot read {arg}: no such {what}",
                         hint="check the bucket and key; a prefix is read recursively (*.parquet, *.safetensors)")
    return typed


def _glob_match(path: str, pattern: str) -> bool:
    """Shell-style match over keys: `*` and `?` stay within one folder level, `**` spans any number of them."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] in "*?":
            out.append("[^/]*" if pattern[i] == "*" else "[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.fullmatch("".join(out), path) is not None


def natural_key(path: str) -> list[list[str | int]]:
    """Sort key: `step_10` after `step_9` in every folder level."""
    return [[int(p) if n % 2 else p for n, p in enumerate(re.split(r"(\d+)", part))] for part in path.split("/")]


def _hidden(path: str, root: str) -> bool:
    return any(part.startswith(".") for part in path[len(root):].split("/"))


def _typed(base: str, infos: Sequence[Any], forced: str | None, arg: str, keep_unknown: bool) -> list[tuple[str, str,
                                                                                                           int]]:
    """(uri, format, size) for each object, in natural key order; refuses formats that cannot stream."""
    out = []
    for info in sorted(infos, key=lambda i: natural_key(i.path)):
        ext = os.path.splitext(info.path)[1].lower()
        fmt = forced or _EXTENSIONS.get(ext)
        if fmt is None and keep_unknown:
            fmt = _sniff(base + info.path)
        if fmt is None:
            if keep_unknown:
                raise InputError(f"cannot tell the format of {base + info.path} from its name",
                                 hint="name the format with --input-format parquet (or safetensors)")
            continue
        if forced is None and fmt == "jsonl" and not keep_unknown and not re.search(
                r"(train_data_step\d+|rank_\d+)\.jsonl$", info.path):
            continue  # logs next to the dumps
        if fmt not in STREAMABLE:
            raise UsageError(
                f"cannot read {base + info.path} from an object store: {fmt if fmt != 'jsonl' else 'JSONL'} dumps "
                "are read from local files only (only parquet and safetensors stream from s3:// or gs://)",
                hint="copy the dump to a local folder first (e.g. aws s3 cp --recursive), or convert it to parquet")
        out.append((base + info.path, fmt, int(info.size)))
    return out


def _sniff(uri: str) -> str | None:
    head = read_range(uri, 0, 16)
    if head[:4] == b"PAR1":
        return "parquet"
    return "safetensors" if len(head) >= 9 and head[8:9] == b"{" else None


def open_remote(uri: str) -> Any:
    """A random-access pyarrow file over the object (ranged GETs; nothing downloaded up front)."""
    fs, where = filesystem(uri)
    try:
        return fs.open_input_file(where)
    except OSError as exc:
        raise remote_error(exc, uri) from None


def read_range(uri: str, offset: int, length: int) -> bytes:
    """`length` bytes of the object from `offset` (fewer at its end)."""
    with open_remote(uri) as handle:
        try:
            return handle.read_at(length, offset)
        except OSError as exc:
            raise remote_error(exc, uri) from None


def remote_env() -> dict[str, str]:
    """The environment variables that tell pyarrow where and how to reach the object store (for Ray workers)."""
    names = ("AWS_", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")
    return {k: v for k, v in os.environ.items() if k.startswith(names)}
