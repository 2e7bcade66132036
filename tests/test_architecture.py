"""The package's shape: no import cycle, a correction model that knows no CLI flag, an engine that never
branches on a family's name."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

import mismatch_cli
from mismatch_cli.correction import FAMILIES

PACKAGE = Path(mismatch_cli.__file__).parent
# Cycles that existed when this test was written and are still to be broken: this list may only shrink.
KNOWN_CYCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every mismatch_cli module `module` imports, at any depth of its code (function-level ones included)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `from pkg import name`: name is a module, or an attribute of pkg
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != module:
                found.add(name)
    return found


@cache  # the tree does not change during a run; each test reads the same graph
def import_graph() -> dict[str, set[str]]:
    """mismatch_cli module -> the mismatch_cli modules it imports."""
    modules = _modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_the_walk_sees_function_level_imports() -> None:
    graph = import_graph()
    assert "mismatch_cli.api" in graph["mismatch_cli"]  # imported inside __getattr__
    assert "mismatch_cli.correction.model" in graph["mismatch_cli.correction.verl"]


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"


def test_only_the_cli_knows_the_correction_flags() -> None:
    graph = import_graph()
    assert {m for m, targets in graph.items() if "mismatch_cli.cli.flags" in targets} <= {
        m for m in graph if m.startswith("mismatch_cli.cli")}
    assert not {t for m, targets in graph.items() if m.startswith("mismatch_cli.correction") for t in targets
                if not t.startswith(("mismatch_cli.correction", "mismatch_cli.errors", "mismatch_cli.system.numbers",
                                     "mismatch_cli.system.tomlconfig"))}


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_the_correction_model_names_fields_not_flags() -> None:
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    found = [f"{path.name}:{line}: {text!r}" for path in sorted((PACKAGE / "correction").glob("*.py"))
             for line, text in _strings(path) if flag.search(text)]
    assert not found, f"CLI flags in the correction model: {found}"


def test_the_engine_never_compares_family_names() -> None:
    found = [f"{path.name}:{line}: {text!r}" for path in sorted((PACKAGE / "engine").glob("*.py"))
             for line, text in _strings(path) if text in FAMILIES]
    assert not found, f"the engine branches on family names: {found}"


def _third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_cli_package_imports_typer_and_nothing_imports_click() -> None:
    offenders = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if "typer" in _third_party_imports(path) and path.parent.name != "cli"]
    assert not offenders, f"typer imported outside mismatch_cli/cli/: {offenders}"
    clicks = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if "click" in _third_party_imports(path)]
    assert not clicks, f"click imported (typer vendors its own; click's exceptions exit with the wrong code): {clicks}"


def test_the_library_never_imports_the_cli() -> None:
    graph = import_graph()
    leaks = sorted(m for m, targets in graph.items() if not m.startswith("mismatch_cli.cli")
                   and m != "mismatch_cli.__main__" and any(t.startswith("mismatch_cli.cli") for t in targets))
    assert not leaks, f"library modules import the command line: {leaks}"


def test_command_line_modules_stay_small() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in (PACKAGE / "cli").glob("*.py")}
    assert sizes and max(sizes.values()) <= 300, sizes


def _reaches(graph: dict[str, set[str]], start: str, forbidden: str) -> list[str]:
    """The modules under `start` that import (directly) any module under `forbidden`."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m == start or m.startswith(start + ".")
                  for t in targets if t == forbidden or t.startswith(forbidden + "."))


def test_the_engine_reads_no_file() -> None:
    found = _reaches(import_graph(), "mismatch_cli.engine", "mismatch_cli.io")
    assert not found, f"the engine imports the readers: {found}"


def test_renderers_parse_no_dump() -> None:
    found = _reaches(import_graph(), "mismatch_cli.render", "mismatch_cli.io")
    assert not found, f"a renderer imports the readers: {found}"


def test_the_layer_check_sees_a_violation() -> None:
    graph = {"mismatch_cli.engine.x": {"mismatch_cli.io.parquet"}, "mismatch_cli.engines": {"mismatch_cli.io"},
             "mismatch_cli.render.y": {"mismatch_cli.iox"}}
    assert _reaches(graph, "mismatch_cli.engine", "mismatch_cli.io") == [
        "mismatch_cli.engine.x -> mismatch_cli.io.parquet"]
    assert _reaches(graph, "mismatch_cli.render", "mismatch_cli.io") == []





def _allowed(package: str) -> set[str] | None:
    """The `May import:` line of a package's docstring, as top-level names (None when it has none)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
    line = next((line for line in doc.splitlines() if line.startswith("May import:")), None)
    if line is None:
        return None
    return {re.split(r"[\s(]", part.strip())[0] for part in line[len("May import:"):].rstrip(".").split(",")}


@pytest.mark.parametrize("package", ["answers", "gate", "system"])
def test_a_role_package_imports_only_what_its_docstring_says(package: str) -> None:
    allowed = _allowed(package)
    assert allowed, f"mismatch_cli/{package}/__init__.py says nothing of what it may import"
    used = {t.split(".")[1] for m, targets in import_graph().items()
            if m == f"mismatch_cli.{package}" or m.startswith(f"mismatch_cli.{package}.") for t in targets
            if not t.startswith(f"mismatch_cli.{package}") and t != "mismatch_cli"}
    assert used <= allowed, f"mismatch_cli.{package} imports {sorted(used - allowed)} beyond its docstring"


def test_the_root_holds_the_public_api_and_the_packages() -> None:
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert modules == ["api", "batch", "convert", "distributed", "dump", "errors", "replay", "report", "version"], \
        modules


def _reader_modules() -> list[str]:
    from mismatch_cli.io import _READER_NAMES

    modules = {f"mismatch_cli.io.{module}" for module, _ in _READER_NAMES.values()}
    return sorted(modules | {"mismatch_cli.io.jsonl"})  # the JSONL flavours' shared decoder


def test_readers_decode_and_one_validator_builds_every_batch() -> None:
    # A reader only decodes its format into validate.Decoded: it builds no Batch and runs no value check;
    # io/__init__'s read path alone passes every chunk through validate.to_batch.
    graph = import_graph()
    readers = _reader_modules()
    assert not [m for m in readers if "mismatch_cli.batch" in graph[m]], "a reader imports the Batch"
    imported: dict[str, set[str]] = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("validate"):
                imported.setdefault(module, set()).update(alias.name for alias in node.names)
    for module in readers:
        assert imported.get(module, set()) <= {"Column", "Decoded", "PerRow"}, (module, imported.get(module))
    assert {m for m, names in imported.items() if "to_batch" in names} == {"mismatch_cli.io"}


@pytest.mark.parametrize("workers", [0, 2])
def test_every_read_path_passes_each_chunk_through_the_validator_once(monkeypatch: pytest.MonkeyPatch,
                                                                       workers: int) -> None:
    # Serial, read-ahead and Ray's work items: each format's decoder is visited once per file and every
    # chunk it yields is validated exactly once on its way to a Batch.
    import numpy as np

    import mismatch_cli.io as io
    from mismatch_cli.io import validate
    from mismatch_cli.io.parallel import WorkItem

    checked: list[str] = []
    decoded: list[str] = []

    def count(chunk: validate.Decoded):
        checked.append(chunk.source)
        return validate.to_batch(chunk)

    def decoder(path: str, options: object, *rest: object):
        decoded.append(path)
        column = validate.Column(np.array([-0.5, -1.0]), np.array([0, 2]), "lp")
        yield validate.Decoded(path, 0, column, column)

    monkeypatch.setattr(io, "to_batch", count)
    for module, function in io._READER_NAMES.values():
        monkeypatch.setattr(f"mismatch_cli.io.{module}.{function}", decoder)
    files = [io.InputFile(f"missing-{name}", name, 1) for name in io.READERS]
    batches = list(io.iter_batches(files, io.ReadOptions(), workers=workers))
    assert [b.source for b in batches] == checked == decoded == [f.path for f in files]
    checked.clear()
    assert [b.source for b in io.read_work_item(WorkItem("missing-x", "slime"), io.ReadOptions())] == checked
