"""The package's shape: no import cycle, a correction model that knows no CLI flag, an engine in layers that never
branches on a family's name, and the replayed trainers as one package each that the core never names."""

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
    found = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for path in sorted((PACKAGE / "engine").rglob("*.py"))
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





def _docstring(package: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / package.replace(".", "/") / "__init__.py").read_text())) or ""


def _allowed(package: str) -> set[str] | None:
    """The `May import:` sentence of a package's docstring as dotted prefixes (`engine (core, kernels)` is
    engine.core and engine.kernels); None when the docstring has none, empty for "nothing of the package"."""
    doc = " ".join(_docstring(package).split())
    if "May import:" not in doc:
        return None
    sentence = re.split(r"[.;](?:\s|$)", doc.split("May import:", 1)[1].strip(), maxsplit=1)[0]
    if sentence.startswith("nothing"):
        return set()
    allowed = set()
    for name, inner in re.findall(r"([\w.]+)(?:\s*\(([^)]*)\))?", sentence):
        parts = [p.strip() for p in inner.split(",")] if inner else []
        allowed |= {f"{name}.{p}" for p in parts} if parts else {name}
    return allowed


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# Each trainer package may import what the trainers' docstring allows, and these other trainers: Miles is a slime fork
# whose fields, accumulators and keys build on slime's.
TRAINER_BASES = {"miles": {"slime"}}


def trainer_packages() -> list[str]:
    return sorted(p.name for p in (PACKAGE / "trainers").iterdir() if (p / "__init__.py").exists())


def layer_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """The imports of a package's modules beyond its docstring's `May import:` (and beyond the package itself);
    a trainer package (`trainers.X`) is held to the trainers' docstring."""
    rule = "trainers" if package.startswith("trainers.") else package
    allowed = _allowed(rule)
    assert allowed is not None, f"mismatch_cli/{rule.replace('.', '/')}/__init__.py says nothing of what it may import"
    if package.startswith("trainers."):
        allowed = allowed | {f"trainers.{base}" for base in TRAINER_BASES.get(package.split(".")[1], ())}
    found = []
    for module, targets in graph.items():
        name = module.removeprefix("mismatch_cli.")
        if not _under(name, package):
            continue
        for target in targets:
            used = target.removeprefix("mismatch_cli.")
            if target == "mismatch_cli" or _under(used, package) or any(_under(used, a) for a in allowed):
                continue
            found.append(f"{module} -> {target}")
    return sorted(found)


LAYERED = ["answers", "gate", "system", "engine", "engine.kernels", "engine.core", "engine.accumulators"]


@pytest.mark.parametrize("package", LAYERED + [f"trainers.{t}" for t in trainer_packages()])
def test_a_package_imports_only_what_its_docstring_says(package: str) -> None:
    found = layer_violations(import_graph(), package)
    assert not found, f"mismatch_cli.{package} imports beyond its docstring: {found}"


def test_the_engine_layers_stack() -> None:
    # kernels import nothing of the package; core may import the kernels; the accumulators both; none the drivers.
    assert _allowed("engine.kernels") == set()
    assert "engine.kernels" in _allowed("engine.core") and "engine.accumulators" not in _allowed("engine.core")
    assert {"engine.core", "engine.kernels"} <= _allowed("engine.accumulators")


def test_a_planted_back_edge_fails() -> None:
    graph = {module: set(targets) for module, targets in import_graph().items()}
    assert not layer_violations(graph, "engine.core")
    graph["mismatch_cli.engine.core.chunk"].add("mismatch_cli.engine.accumulators.rounds")
    graph["mismatch_cli.engine.kernels.ops"].add("mismatch_cli.engine.core.state")
    graph["mismatch_cli.trainers.trl.engine"].add("mismatch_cli.trainers.skyrl.engine")
    graph["mismatch_cli.trainers.skyrl.settings"].add("mismatch_cli.render.lead")
    assert layer_violations(graph, "engine.core") == [
        "mismatch_cli.engine.core.chunk -> mismatch_cli.engine.accumulators.rounds"]
    assert layer_violations(graph, "engine.kernels") == [
        "mismatch_cli.engine.kernels.ops -> mismatch_cli.engine.core.state"]
    assert layer_violations(graph, "trainers.trl") == [
        "mismatch_cli.trainers.trl.engine -> mismatch_cli.trainers.skyrl.engine"]
    assert layer_violations(graph, "trainers.skyrl") == [
        "mismatch_cli.trainers.skyrl.settings -> mismatch_cli.render.lead"]
    assert not layer_violations(graph, "trainers.miles")  # a declared base (slime) is no violation


def test_no_module_outside_a_trainer_imports_it() -> None:
    # The core reaches a trainer only through correction.registry, which finds it at run time.
    found = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                   if t.startswith("mismatch_cli.trainers.") and not _under(m, ".".join(t.split(".")[:3]))
                   and not any(_under(m, f"mismatch_cli.trainers.{b}") for b, bases in TRAINER_BASES.items()
                               if t.split(".")[2] in bases))
    assert not found, f"modules name a trainer's package: {found}"


# Beyond the readers (io/: the dump formats slime, NeMo-RL, prime-rl and SkyRL write) and the command line's
# --input-format choices, the product never spells a replayed trainer's name: it asks the registry.
NAMING_ALLOWED = ("io", "cli")


def test_the_core_never_names_a_trainer() -> None:
    from mismatch_cli.correction import REPLAY_FAMILIES

    names = set(REPLAY_FAMILIES) | set(trainer_packages())
    found = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).parts[0] not in ("trainers", *NAMING_ALLOWED)
             for line, text in _strings(path) if text in names]
    assert not found, f"modules outside mismatch_cli/trainers/ name a trainer: {found}"


def test_modules_stay_under_400_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda item: -item[1])[:3]


def test_the_root_holds_the_public_api_and_the_packages() -> None:
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert modules == ["api", "batch", "convert", "distributed", "dump", "errors", "processes", "replay", "report",
                       "version"], \
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
