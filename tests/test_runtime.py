"""How the process runs (system/runtime.py): the cycle collector paused while the engine loads and restored after,
what loaded frozen only in the CLI, and glibc's allocator keeping freed memory in the CLI."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from mismatch_cli.system import runtime


@pytest.fixture
def restored_collector():
    enabled = gc.isenabled()
    yield
    runtime._FREEZE[0] = False
    gc.unfreeze()
    gc.enable() if enabled else gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_pauses_the_collector_and_restores_it(restored_collector: None, enabled: bool) -> None:
    gc.enable() if enabled else gc.disable()
    frozen = gc.get_freeze_count()
    with runtime.loading():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]
    assert gc.isenabled() is enabled
    assert gc.get_freeze_count() == frozen  # a library caller: nothing frozen
    assert len(kept) == 1000


def test_loading_restores_the_collector_when_the_import_fails(restored_collector: None) -> None:
    gc.enable()
    with pytest.raises(ImportError), runtime.loading():
        import mismatch_cli.no_such_module  # noqa: F401
    assert gc.isenabled()


def test_the_cli_freezes_what_loaded_and_only_then(restored_collector: None) -> None:
    gc.enable()
    runtime._FREEZE[0] = True  # as one_command_process sets it, without touching this process's allocator
    sys.modules.pop("json.tool", None)
    before = gc.get_freeze_count()
    with runtime.loading():
        import json.tool  # noqa: F401 - a module loads: what is alive now is frozen
        kept = [[i] for i in range(1000)]
    frozen = gc.get_freeze_count()
    assert frozen >= before + len(kept)
    assert gc.isenabled()
    with runtime.loading():  # nothing new loads (a second analysis in one process): nothing more is frozen
        import json.tool  # noqa: F401, F811
        garbage = [[i] for i in range(1000)]
    # Not more (a freeze would add the 1000 lists); fewer when frozen objects die meanwhile (an earlier test's thread
    # ending in this worker process).
    assert gc.get_freeze_count() <= frozen
    assert len(garbage) == 1000


def test_torch_loads_with_the_collector_paused() -> None:
    # The import audit event fires as each module starts loading: torch's must find the collector off.
    code = ("import gc, sys; seen = []; "
            "sys.addaudithook(lambda event, args: seen.append(gc.isenabled()) if event == 'import' and args[0] in "
            "('torch', 'mismatch_cli.engine.runner') else None); "
            "import mismatch_cli.api as api; assert 'torch' not in sys.modules; api._load_engine(); "
            "assert 'torch' in sys.modules and gc.isenabled(); assert seen == [False, False], seen; "
            "assert gc.get_freeze_count() == 0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("blas", "purge"), [(None, None), ("4", "10")])
def test_the_cli_keeps_freed_memory_and_one_blas_thread(blas: str | None, purge: str | None) -> None:
    # In a child process (mallopt changes the allocator for good): glibc takes both settings, elsewhere nothing is
    # set; one OpenBLAS thread and mimalloc's pages kept, unless the user said otherwise.
    said = {"OPENBLAS_NUM_THREADS": blas, "MIMALLOC_PURGE_DELAY": purge}
    env = {k: v for k, v in os.environ.items() if k not in said} | {k: v for k, v in said.items() if v}
    code = ("import os, sys; from mismatch_cli.system import runtime; took = runtime.one_command_process(); "
            "glibc = sys.platform.startswith('linux') and bool(os.confstr('CS_GNU_LIBC_VERSION')); "
            "assert took is glibc, (took, glibc); assert runtime._FREEZE[0]; "
            f"assert os.environ['OPENBLAS_NUM_THREADS'] == {blas or '1'!r}; "
            f"assert os.environ['MIMALLOC_PURGE_DELAY'] == {purge or '-1'!r}; "
            "assert 'numpy' not in sys.modules and 'pyarrow' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr


def test_the_cli_has_not_loaded_numpy_when_it_tunes_the_process() -> None:
    # OPENBLAS_NUM_THREADS is read when numpy loads, MIMALLOC_PURGE_DELAY when pyarrow does: the CLI's own imports
    # must load neither before entry() runs.
    code = "import sys, mismatch_cli.cli; assert not {'numpy', 'pyarrow'} & set(sys.modules), 'numpy or pyarrow loaded'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
