"""Below the declared minimum versions the CLI says one line naming the requirement and exits 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mismatch_cli.system.requirements import MINIMUM_VERSIONS, release, unmet_requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_minimums_are_pyprojects() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, oldest in MINIMUM_VERSIONS:
        assert f"{name}>={oldest}" in declared, name


@pytest.mark.parametrize("text, parts", [("2.13.0+cpu", (2, 13, 0)), ("0.29.0rc1", (0, 29, 0)), ("14", (14,)),
                                         ("2.2.0.dev20240101", (2, 2, 0)), ("1.x", (1,))])
def test_release_reads_the_leading_numbers(text: str, parts: tuple[int, ...]) -> None:
    assert release(text) == parts


def test_a_met_minimum_passes_and_an_equal_version_is_enough() -> None:
    assert unmet_requirement({"typer": "0.29.0", "pyarrow": "14.0.2", "torch": "2.2.0"}) is None
    assert unmet_requirement({"typer": "0.29", "pyarrow": "23.0", "torch": "2.10.0"}) is None  # 2.10 > 2.2
    assert unmet_requirement({"typer": "0.29.2", "pyarrow": None, "torch": "2.13.0"}) == (
        "mismatch needs pyarrow>=14, which is not installed", 'pip install "pyarrow>=14"')


@pytest.mark.parametrize("name, old", [("typer", "0.27.0"), ("pyarrow", "13.0.0"), ("torch", "2.1.2")])
def test_an_older_library_is_one_line_and_exit_2(tmp_path: Path, name: str, old: str) -> None:
    # A dist-info first on the path is what importlib.metadata finds: an environment with the old version installed.
    info = tmp_path / f"{name}-{old}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {old}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "mismatch_cli", "analyze", "run.parquet"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    oldest = dict(MINIMUM_VERSIONS)[name]
    assert done.stderr == (f"error: mismatch needs {name}>={oldest}, but {name} {old} is installed; "
                           f'fix: pip install --upgrade "{name}>={oldest}"\n')
    assert done.stdout == ""
