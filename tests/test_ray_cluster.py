"""`--engine ray` on a real multi-process Ray cluster (a head and a worker node started with `ray start`),
reading dumps from a local S3 server: the local engine's metrics, steps, rounds and bootstrap intervals under IS and
two RS options, to float64 summation order.

Marked `cluster` (deselect with `-m 'not cluster'`); it runs by default, in `.ci/run` too.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("moto", reason="the cluster test reads from a moto S3 server (the dev extra)")

from adversarial.conftest import mismatch  # noqa: E402
from object_store import BUCKET, free_port, store  # noqa: E402

from mismatch_cli.synth import SynthSpec, write_synthetic_dump  # noqa: E402

pytestmark = pytest.mark.cluster
RAY = Path(sys.executable).with_name("ray")
_START_S = 120


def _ports() -> list[str]:
    """Every port a node would otherwise take from a fixed default (two nodes share this host)."""
    flags = ("--node-manager-port", "--object-manager-port", "--metrics-export-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
    return [arg for flag in flags for arg in (flag, str(free_port()))]


def _node(args: list[str], temp_dir: str, log: Path) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground as the node's supervisor: stopping it (by its pid, in its own
    # process group) stops this node's processes only, never another Ray on the machine (as `ray stop` would).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_ADDRESS"))}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "disabled"  # Ray >= 2.5x turns token auth on for `ray start`; this cluster is loopback-only
    return subprocess.Popen([str(RAY), "start", "--block", "--num-cpus=1", "--disable-usage-stats",
                             f"--temp-dir={temp_dir}", *_ports(), *args],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    # A node drains for up to 30 s on SIGTERM; the run is over by then, so its group gets a second, then SIGKILL.
    for sig, wait in ((signal.SIGTERM, 1), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)  # the group this test created for the node: its raylet, workers, agents
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_started(proc: subprocess.Popen, log: Path) -> None:
    """Until `ray start` says the node runs (it prints that once its raylet has registered), or fail with its log."""
    end = time.monotonic() + _START_S
    while time.monotonic() < end:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Ray runtime started" in text:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"the Ray node did not start: {log.read_text(errors='replace')[-3000:]}")


@contextmanager
def ray_cluster(tmp: Path) -> Iterator[str]:
    """A head node and one worker node, one CPU each, as separate `ray start` processes; yields the address."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp_dir = tempfile.mkdtemp(prefix="mray")  # short: Ray's socket paths must fit 107 bytes
    logs = [tmp / "head.log", tmp / "worker.log"]
    nodes = [_node(["--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false"],
                   temp_dir, logs[0])]
    try:
        _wait_started(nodes[0], logs[0])
        nodes.append(_node([f"--address={address}", "--node-ip-address=127.0.0.1"], temp_dir, logs[1]))
        _wait_started(nodes[1], logs[1])
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_cluster_over_the_object_store_equals_local(tmp_path) -> None:
    started = time.monotonic()
    files = []
    with store() as server:
        for i in range(3):
            path = tmp_path / f"part{i}.parquet"
            write_synthetic_dump(path, SynthSpec(tokens=20_000, turns=2, seed=i, steps=2, row_group_tokens=5_000))
            files.append(path)
            server.upload(path, f"cluster/part{i}.parquet")
        # IS, two RS options and the bootstrap: every accumulator's state crosses the cluster and merges.
        flags = ["--by", "step", "--dtype", "float64", "--bootstrap", "50", "--is", "token", "--is-threshold", "2.0",
                 "--rs", "seq_mean_k1,token_k3", "--rs-threshold", "0.99_1.01,0.5", "--format", "json", "--quiet"]
        # The local engine over the same objects: a row's bootstrap draws follow its input's name, so the intervals
        # are compared between runs of the same URIs.
        here = mismatch("analyze", f"s3://{BUCKET}/cluster/", *flags, env=server.env, timeout=120)
        assert here.code == 0, here.stderr[-3000:]
        local = json.loads(here.stdout)
        with ray_cluster(tmp_path) as address:
            run = mismatch("analyze", f"s3://{BUCKET}/cluster/", "--engine", "ray", "--ray-address", address, *flags,
                           env=server.env, timeout=400)
    assert run.code == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout)
    assert [i["path"] for i in remote["inputs"]] == [f"s3://{BUCKET}/cluster/part{i}.parquet" for i in range(3)]
    assert remote["metrics"].keys() == local["metrics"].keys()
    for key, value in local["metrics"].items():
        _close(remote["metrics"][key], value, key)
    assert [s["step"] for s in remote["steps"]] == [s["step"] for s in local["steps"]]
    for mine, theirs in zip(local["steps"], remote["steps"], strict=True):
        for key, value in mine["metrics"].items():
            _close(theirs["metrics"][key], value, key)
    assert remote["intervals"].keys() == local["intervals"].keys() and local["intervals"]
    for key, (low, high) in local["intervals"].items():
        assert remote["intervals"][key] == pytest.approx([low, high], rel=1e-9, abs=1e-14), key
    assert len(remote["rounds"]) == len(local["rounds"]) >= 2
    print(f"cluster test: {time.monotonic() - started:.1f} s")


def _close(other: object, value: object, key: str) -> None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        assert other is None or (isinstance(other, float) and math.isnan(other)), key
    elif isinstance(value, (int, float)):
        # Shards merge in another order than one stream sums: equal up to float64 summation order.
        assert abs(other - value) <= 1e-10 * abs(value) + 1e-14, (key, value, other)
    else:
        assert other == value, key
