"""The package's layers: no import circles, and the runtime never pulls in the testbed."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from obmm.tools import layers
from obmm.tools.layers import cycles, import_graph, layer_of, modules, upward_imports

PYLIB = Path(__file__).resolve().parents[3] / "pylib"
PACKAGE = PYLIB / "obmm"
TESTBED = PACKAGE / "testbed"


def test_the_graph_sees_known_edges() -> None:
    graph = import_graph()
    assert "obmm.abi" in graph["obmm.api"]
    assert "obmm.testbed.ssh" in graph["obmm.testbed.vm.cluster"]
    assert "obmm.testbed.topology" in graph["obmm.testbed.session"]


def test_no_import_circle_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_layers_command_prints_the_layers_and_passes() -> None:
    """`python -m obmm.tools.layers`: each layer and what it imports; status 0 (no cycle, no
    upward import)."""
    out = subprocess.run(
        [sys.executable, "-m", "obmm.tools.layers"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PYLIB), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in layers.LAYER_NAMES:
        assert any(line.split()[:1] == [name] for line in lines), name
    assert "python import cycles: ok" in lines
    assert "python layering: ok" in lines


def test_the_layers_command_fails_on_a_failing_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that finds something (the C call graph's, once added to CHECKS, included)
    makes the command's status 1 and prints its lines."""
    monkeypatch.setattr(layers, "CHECKS", [*layers.CHECKS, ("c calls", lambda: ["a.c <-> b.c"])])
    printed: list[str] = []
    assert layers.report(printed.append) == 1
    assert "c calls: 1 FAIL" in printed and "  a.c <-> b.c" in printed


def test_every_module_is_in_a_layer() -> None:
    assert {name: layer_of(name) for name in modules()}  # layer_of raises for a stray module


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layering_check_sees_an_upward_import() -> None:
    graph = {"obmm.testbed.vm.qemu": {"obmm.testbed.cli.run"}, "obmm.testbed.cli.run": set()}
    assert upward_imports(graph) == [
        "obmm.testbed.vm.qemu (testbed.vm) imports obmm.testbed.cli.run (testbed.cli)"
    ]


def _imports_of(prefix: str) -> set[str]:
    graph = import_graph()
    return {dep for mod, deps in graph.items() if mod.startswith(prefix) for dep in deps}


def test_builds_and_vm_never_import_the_suite_stages_or_cli() -> None:
    above = ("obmm.testbed.suite", "obmm.testbed.stages", "obmm.testbed.cli", "obmm.testbed.hw")
    for below in ("obmm.testbed.builds.", "obmm.testbed.vm."):
        assert {d for d in _imports_of(below) if d.startswith(above)} == set(), below


def test_builds_never_import_the_machines() -> None:
    """An image or a module build is made without QEMU: vm/ uses builds/, not the reverse."""
    assert {d for d in _imports_of("obmm.testbed.builds.") if ".vm." in d} == set()


def test_the_spine_imports_no_subpackage_above_it() -> None:
    """The testbed's leaves (paths, errors, settings, topology, ssh, node, ...) import the
    runtime, the tools and each other only."""
    graph = import_graph()
    spine = [f"obmm.testbed.{m}" for m in layers.SPINE]
    subpackages = ("obmm.testbed.", "obmm.bench", "obmm.fuzz")
    wrong = {
        mod: sorted(d for d in graph[mod] if d.startswith(subpackages) and d not in spine)
        for mod in spine
    }
    assert {mod: deps for mod, deps in wrong.items() if deps} == {}


def test_the_tools_import_nothing_of_the_testbed() -> None:
    assert {d for d in _imports_of("obmm.tools") if d.startswith("obmm.testbed")} == set()


def test_the_testbed_top_level_is_small() -> None:
    """The concerns live in subpackages; the top level is the spine, the public names, the
    architecture table both builds/ and vm/ read, and the bring-up steps (issue 33: "no more
    than about 15")."""
    top = sorted(p.stem for p in TESTBED.glob("*.py") if p.stem != "__init__")
    assert len(top) <= 15, top
    for public in ("settings", "session", "node", "pytest_cluster", "usercluster", "topology"):
        assert public in top


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
