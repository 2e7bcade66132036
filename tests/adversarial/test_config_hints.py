"""Every error the tool raises says how to fix it: each raise site passes a hint, and the CLI prints `; fix:`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from conftest import ROOT, assert_clean_failure, mismatch

import mismatch_cli
from mismatch_cli import errors

PACKAGE = Path(mismatch_cli.__file__).parent
ERROR_CLASSES = {name for name, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, errors.MismatchError)}


def _error_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in ERROR_CLASSES and path.name != "errors.py":
                    calls.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    return calls


def _hint(call: ast.Call) -> ast.expr | None:
    keyword = next((k.value for k in call.keywords if k.arg == "hint"), None)
    return keyword if keyword is not None else (call.args[1] if len(call.args) > 1 else None)


def test_the_walk_finds_the_error_sites():
    assert len(_error_calls()) > 100  # the walk itself works (a silent walk would pass anything)


def test_every_error_site_passes_a_hint():
    missing = []
    for where, line, call in _error_calls():
        hint = _hint(call)
        if hint is None or (isinstance(hint, ast.Constant) and not hint.value):
            missing.append(f"{where}:{line}")
    assert not missing, f"errors without a fix: {missing}"


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "sample_data/single_turn.parquet", "--rs", "seq_mean_k1", "--rs-threshold", "2,3"],
        ["analyze", "sample_data/single_turn.parquet", "--semantics", "xtuner", "--is-threshold", "2,0.5",
         "--is-level", "tokn"],
        ["analyze", "sample_data/single_turn.parquet", "--semantics", "verl-0.6.0", "--is-threshold", "2",
         "--veto-threshold", "-1", "--is-mode", "both"],
        ["analyze", "sample_data/single_turn.parquet", "--rs", "", "--rs-threshold", "1"],
        ["check", "sample_data/single_turn.parquet", "--fail-on", "kl<=1", "--fail-on", "kl:+5%"],
    ],
)
def test_configuration_errors_print_a_fix(args):
    line = assert_clean_failure(mismatch(*args, cwd=ROOT), 2)
    assert "; fix: " in line and not line.endswith("; fix: ")
