"""The package's layers: no import circles, and the runtime never pulls in the testbed."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PYLIB = Path(__file__).resolve().parents[2] / "pylib"
PACKAGE = PYLIB / "obmm"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PYLIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every obmm module `path` imports, at module level or inside a function (both count:
    a deferred import still ties the two modules together)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from obmm.x import y` names module obmm.x.y when y is a submodule
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        yield from (t for t in targets if t in known and t != name)


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: set(imported(name, path, known)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_known_edges() -> None:
    graph = import_graph()
    assert "obmm.abi" in graph["obmm.api"]
    assert "obmm.testbed.ssh" in graph["obmm.testbed.vm.cluster"]


def test_no_import_circle_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_import_obmm_loads_neither_paramiko_nor_the_testbed() -> None:
    code = (
        "import json, sys; import obmm; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('paramiko', 'qemu', 'elftools', 'matplotlib') "
        "or m.startswith(('obmm.testbed', 'obmm.bench', 'obmm.tools')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(PYLIB), "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(out.stdout) == []


def test_each_environment_variable_is_defined_in_obmm_envvars_only() -> None:
    """Every variable's name is spelled in one module, obmm.envvars (type, default, help); the
    others read it through that module's Var objects."""
    from obmm import envvars

    where: dict[str, set[str]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in envvars.BY_NAME:
                where.setdefault(str(node.value), set()).add(name)
    assert where["OBMM_TESTBED_CACHE"] == {"obmm.envvars"}
    elsewhere = {var: sorted(mods - {"obmm.envvars"}) for var, mods in where.items()}
    assert {var: mods for var, mods in elsewhere.items() if mods} == {}


def test_no_module_reads_an_undefined_variable() -> None:
    """os.environ.get / os.getenv / os.environ[...] with a literal name: only XDG_* and the
    standard ones (CC, PATH, ...) are read that way; the project's go through obmm.envvars."""
    from obmm import envvars

    literal_reads: set[str] = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and node.args:
                func = ast.unparse(node.func)
                arg = node.args[0]
                if func in ("os.environ.get", "os.getenv", "environ.get") and isinstance(
                    arg, ast.Constant
                ):
                    literal_reads.add(str(arg.value))
    ours = {v for v in literal_reads if v.startswith(("OBMM_", "HW_", "DEBUG_"))}
    assert ours == set(), f"read with a literal name, not through obmm.envvars: {ours}"
    assert set(envvars.BY_NAME) >= {"OBMM_TESTBED_TOPOLOGY", "OBMM_NODE_ID", "HW_HOSTS"}


def test_only_the_paths_module_finds_the_checkout_from_its_own_file() -> None:
    found = [
        name
        for name, path in modules().items()
        if re.search(r"__file__\)\.resolve\(\)\.parents\[", path.read_text())
    ]
    assert found == ["obmm.testbed.paths"]
