"""`--jobs N`: worker processes fold the work items into partial states that merge in input order, so every number
of the report is the same bit for bit as one process's, whatever N is (issue 36)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import mismatch_cli.io.parallel as parallel
import mismatch_cli.processes as processes
from mismatch_cli.api import analyze
from mismatch_cli.cli import app
from mismatch_cli.correction import CorrectionConfig
from mismatch_cli.io import discover_inputs
from mismatch_cli.processes import resolve_jobs
from mismatch_cli.synth import SynthSpec, write_synthetic_dump


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("jobs")
    paths = []
    for i, turns in enumerate((3, 1)):
        path = folder / f"part{i}.parquet"
        write_synthetic_dump(path, SynthSpec(tokens=120_000, turns=turns, seed=i, steps=3, row_group_tokens=15_000,
                                             catastrophic_rate=1e-4))
        table = pq.read_table(path)  # a label column for --by
        labels = [("math", "code", "chat")[r % 3] for r in range(table.num_rows)]
        pq.write_table(table.append_column("env_name", __import__("pyarrow").array(labels)), path,
                       row_group_size=40)
        paths.append(str(path))
    return paths


def report(paths: list[str], jobs: int, **kwargs: object) -> dict:
    data = analyze(paths, hash_inputs=False, jobs=jobs, **kwargs).to_dict()
    data.pop("created_at")
    return data


@pytest.mark.parametrize("config", [
    CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                     rollout_rs_threshold="0.99_1.01,0.5"),
    CorrectionConfig(semantics="skyrl"),
    CorrectionConfig(semantics="xtuner"),  # one family state per pack (file), merged as xtuner does
])
def test_every_number_is_the_same_for_any_number_of_processes(dumps: list[str], monkeypatch: pytest.MonkeyPatch,
                                                              config: CorrectionConfig) -> None:
    monkeypatch.setattr(parallel, "ITEM_BYTES", 200_000)  # several work items per file
    assert len(parallel.plan(discover_inputs(dumps))) >= 6
    kwargs = {"correction": config, "group_by": ("step", "env_name"), "bootstrap": 40}
    one = report(dumps, 1, **kwargs)
    two = report(dumps, 2, **kwargs)
    assert one["steps"] and one["groups"]["env_name"] and one["rounds"] and one["worst_sequences"]
    assert one["intervals"]
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


@pytest.mark.parametrize("cores, inline", [(2, True), (8, False)])
def test_processes_on_every_core_take_their_token_sweep_inline(dumps: list[str], monkeypatch: pytest.MonkeyPatch,
                                                               cores: int, inline: bool) -> None:
    # A thread more per process only makes processes that fill the cores take turns; with cores to spare it runs
    # beside the fold. Either way the numbers are one process's.
    from mismatch_cli.engine.kernels import sweep

    monkeypatch.setenv("MISMATCH_FUSED", "always")
    monkeypatch.setattr(parallel, "ITEM_BYTES", 200_000)
    monkeypatch.setattr(processes, "usable_cores", lambda: cores)
    entered, real = [], sweep.inline
    monkeypatch.setattr(sweep, "inline", lambda on: entered.append(on) or real(on))
    one = report(dumps, 1, bootstrap=20)
    two = report(dumps, 2, bootstrap=20)
    assert entered == [inline] and not sweep._INLINE[0]
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_a_workers_error_is_the_users_one_line(dumps: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "zz.parquet"
    bad.write_bytes(b"PAR1 not parquet at all PAR1")
    result = CliRunner().invoke(app, ["analyze", *dumps, str(bad), "--jobs", "2", "-q"])
    assert result.exit_code == 3 and "zz.parquet" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "257"])
def test_a_bad_jobs_value_is_refused(dumps: list[str], value: str) -> None:
    result = CliRunner().invoke(app, ["analyze", dumps[0], "--jobs", value])
    assert result.exit_code == 2 and "--jobs" in result.output


def test_auto_uses_one_process_on_a_small_input_and_off_the_cpu(dumps: list[str]) -> None:
    files = discover_inputs(dumps)
    assert resolve_jobs(None, files, "auto") == 1  # far below 256 MiB: a worker's start would cost more
    assert resolve_jobs(3, files, "cpu") == 3


def test_jobs_with_a_gpu_device_is_refused_before_anything_runs(dumps: list[str]) -> None:
    result = CliRunner().invoke(app, ["analyze", dumps[0], "--jobs", "4", "--device", "cuda"])
    assert result.exit_code == 2
    assert "--jobs 4 runs worker processes on the CPU" in result.output and "--device cpu --jobs 4" in result.output
    assert resolve_jobs(1, discover_inputs(dumps), "cuda") == 1  # one process is what a GPU run is


@pytest.mark.parametrize("cores, threads", [(1, 2), (2, 2), (6, 3), (16, 8), (64, 8)])
def test_read_threads_are_half_the_cores_from_2_to_8(monkeypatch: pytest.MonkeyPatch, cores: int,
                                                     threads: int) -> None:
    monkeypatch.setattr(processes, "usable_cores", lambda: cores)
    assert processes.read_threads() == threads


def test_auto_keeps_the_gpu_when_torch_sees_one(dumps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    files = discover_inputs(dumps)
    monkeypatch.setattr(processes, "MIN_JOBS_BYTES", 0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 4)
    monkeypatch.setattr(processes, "gpu_visible", lambda: True)
    assert resolve_jobs(None, files, "auto") == 1
    assert resolve_jobs(None, files, "cpu") == 4  # run_on_processes starts at most one worker per work item
    monkeypatch.setattr(processes, "gpu_visible", lambda: False)
    assert resolve_jobs(None, files, "auto") == 4


def test_one_work_item_starts_no_worker(dumps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker pool was started for one work item")

    monkeypatch.setattr(processes, "ProcessPoolExecutor", no_pool)
    assert report(dumps[:1], jobs=4) == report(dumps[:1], jobs=1)


def test_a_pickled_state_does_not_grow_with_the_tokens_it_folded(tmp_path: Path) -> None:
    # A worker's state crosses a pipe per work item: it holds sums, sketches and the best tokens, never the
    # per-position layouts of the chunks it folded (the worst-token candidates are placed before pickling).
    import pickle

    from mismatch_cli.correction import resolve
    from mismatch_cli.engine.distributed import fold_partial
    from mismatch_cli.engine.partial import PartialSpec
    from mismatch_cli.io import ReadOptions, read_work_item
    from mismatch_cli.io.parallel import WorkItem

    sizes = []
    for tokens in (40_000, 150_000):
        path = tmp_path / f"d{tokens}.parquet"
        write_synthetic_dump(path, SynthSpec(tokens=tokens, turns=2, seed=3, steps=1, row_group_tokens=10_000))
        state, rows = fold_partial(read_work_item(WorkItem(str(path), "parquet"), ReadOptions()),
                                   PartialSpec(resolve(CorrectionConfig()), fused=True))
        assert rows
        sizes.append(len(pickle.dumps(state.overall.signatures.tokens)))  # the worst tokens' part
    assert sizes[1] < 1.2 * sizes[0] < 10_000, sizes


@pytest.mark.parametrize("torch_sees_a_gpu", [False, True])
def test_auto_reads_ahead_while_torch_looks_for_the_gpu(dumps: list[str], monkeypatch: pytest.MonkeyPatch,
                                                        torch_sees_a_gpu: bool) -> None:
    # On a machine with a GPU driver, `auto` on a large input asks torch (its import, a second or two) whether it
    # sees the GPU: the readers run meanwhile, and stop before any worker forks when it does not.
    import threading

    def readers() -> int:
        return sum(t.name.startswith("mismatch-read") and t.is_alive() for t in threading.enumerate())

    seen: dict[str, int] = {}

    def gpu_visible() -> bool:
        seen["asked"] = readers()
        return torch_sees_a_gpu

    real = processes.run_on_processes

    def run_on_processes(*args: object, **kwargs: object) -> object:
        seen["forked"] = readers()
        return real(*args, **kwargs)

    monkeypatch.setattr(processes, "MIN_JOBS_BYTES", 0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    monkeypatch.setattr(processes, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(processes, "gpu_visible", gpu_visible)
    monkeypatch.setattr(processes, "run_on_processes", run_on_processes)
    assert report(dumps, None) == report(dumps, 1)
    assert seen["asked"] > 0  # the readers were reading while torch was asked
    assert seen.get("forked", 0) == 0 and ("forked" in seen) != torch_sees_a_gpu  # none left when workers fork


def test_no_gpu_driver_means_no_torch_import_to_ask() -> None:
    import subprocess
    import sys

    code = ("import sys, mismatch_cli.processes as p; p.gpu_driver_present = lambda: False; "
            "assert p.gpu_visible() is False; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_jobs_after_a_fused_run_in_the_same_process_finish(dumps: list[str]) -> None:
    # A long-lived process (a notebook, a service) that ran the fused CPU sweep and then forks --jobs workers: the
    # workers must get a sweep thread of their own (a cached pool forked without its thread hung them for good),
    # and the numbers must not depend on which kernel call was a process's first (reassociated row sums did).
    import subprocess
    import sys

    code = ("import sys, mismatch_cli.io.parallel as p; from mismatch_cli.api import analyze; p.ITEM_BYTES = 200_000; "
            "one = analyze(sys.argv[1:], jobs=1, hash_inputs=False, bootstrap=0).to_dict(); "
            "two = analyze(sys.argv[1:], jobs=2, hash_inputs=False, bootstrap=0).to_dict(); "
            "one.pop('created_at'); two.pop('created_at'); assert one == two, 'jobs 1 and 2 differ'")
    env = {**__import__("os").environ, "MISMATCH_FUSED": "always"}
    subprocess.run([sys.executable, "-c", code, *dumps], check=True, timeout=60, env=env)


def _tensors(obj: object, path: str = "state", seen: set | None = None) -> dict[str, object]:
    """Every tensor reachable from obj's attributes, dicts, lists and tuples, by path (each object once)."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return {}
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    if isinstance(obj, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    else:
        return {}
    found: dict[str, object] = {}
    for name, value in items:
        found.update(_tensors(value, name, seen))
    return found


def test_a_workers_state_crosses_the_pipe_tensor_for_tensor(dumps: list[str]) -> None:
    import pickle

    import torch

    from mismatch_cli.correction import resolve
    from mismatch_cli.engine.distributed import dumps_state, fold_partial
    from mismatch_cli.engine.partial import PartialSpec
    from mismatch_cli.io import ReadOptions, read_work_item
    from mismatch_cli.io.parallel import WorkItem

    config = CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1,token_k3",
                              rollout_rs_threshold="0.99_1.01,0.5")
    spec = PartialSpec(resolve(config), by_step=True, group_by=("env_name",), bootstrap=40, fused=True)
    state, _ = fold_partial(read_work_item(WorkItem(dumps[0], "parquet"), ReadOptions(group_columns=("env_name",))),
                            spec)
    before = _tensors(state)
    assert len(before) > 50
    storages = [t.untyped_storage().data_ptr() for t in before.values() if t.numel()]
    assert len(storages) == len(set(storages))  # no two views of one storage: each tensor travels on its own
    after = _tensors(pickle.loads(dumps_state(state)))
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        got = after[name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(got, tensor) or (tensor.is_floating_point() and torch.equal(got.isnan(), tensor.isnan())
                                             and torch.equal(got.nan_to_num(), tensor.nan_to_num())), name
        if got.numel():
            got.add_(0)  # writable: a merge adds into it
