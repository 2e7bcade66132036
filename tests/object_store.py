"""A local S3-compatible server (moto) for object-store tests, and the environment that points `mismatch` at it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BUCKET = "dumps"
# Everything pyarrow / the AWS SDK might pick up from the developer's machine is replaced.
_CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE")


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def store_env(url: str, key: str = "testing") -> dict[str, str]:
    """The environment a `mismatch` subprocess needs to read from the server at `url`."""
    env = {name: "" for name in _CLEARED}
    env.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=url, AWS_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true")
    return env


@dataclass
class Store:
    """A running moto S3 server with one bucket."""

    url: str
    client: object

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess reading from this server."""
        return store_env(self.url)

    def upload(self, local: Path, key: str) -> str:
        """Put a local file at `key`; returns its s3:// URI."""
        self.client.upload_file(str(local), BUCKET, key)  # type: ignore[attr-defined]
        return f"s3://{BUCKET}/{key}"


def _wait_up(url: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


@contextmanager
def moto_server(require_auth: bool = False) -> Iterator[str]:
    """A moto server on a free port in its own process (its own settings), stopped by its pid; yields its URL.

    With `require_auth`, every request must be signed by a known IAM key, so any key is refused.
    """
    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="0") if require_auth else None
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def store() -> Iterator[Store]:
    """A moto server with an empty bucket, and a boto3 client to fill it."""
    import boto3

    with moto_server() as url:
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield Store(url, client)
