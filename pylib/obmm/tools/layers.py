"""The package's layers and their import graph: ``python -m obmm.tools.layers``.

Prints each layer (a subpackage, or a named group of the testbed's top-level modules) and the
layers it imports, then the checks: no import cycle between modules (deferred imports count: a
function-level import still ties two modules together) and no module importing a layer above its
own.  Exits 1 if a check fails.  ``tests/host/repo/test_layers.py`` runs the same checks.

Reads the sources with :mod:`ast` and imports none of them (standard library only), so it runs
where the testbed's dependencies are missing.  Other checks (the C call graph of the drivers)
join through :data:`CHECKS`: a function returning its problems, one line each.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from obmm.tools import ccalls
from obmm.tools.graphs import sccs

PYLIB = Path(__file__).resolve().parent.parent.parent
PACKAGE = PYLIB / "obmm"

#: The testbed's top-level modules at the bottom: what everything above may use.
SPINE = (
    "paths", "errors", "settings", "topology", "ssh", "node", "remote", "parallel", "progress",
    "arch",
)  # fmt: skip
#: The testbed's top-level modules that bring nodes up (over builds/ and vm/).
BRING_UP = ("provision", "ubsmem", "session")
#: The public API for other projects' tests (over the bring-up).
USER_API = ("usercluster", "pytest_cluster")

#: Layers bottom to top; a module may import its own layer and the layers below it.  Each entry:
#: (layer name, module-name prefixes or exact names that belong to it).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("runtime", ("obmm",)),
    ("tools", ("obmm.tools",)),
    ("fuzz", ("obmm.fuzz",)),
    ("testbed.spine", ("obmm.testbed", *(f"obmm.testbed.{m}" for m in SPINE))),
    ("testbed.builds", ("obmm.testbed.builds",)),
    ("testbed.vm", ("obmm.testbed.vm",)),
    ("testbed.bring_up", tuple(f"obmm.testbed.{m}" for m in BRING_UP)),
    ("testbed.suite", ("obmm.testbed.suite",)),
    ("testbed.stages", ("obmm.testbed.stages", "obmm.testbed.hw")),
    ("testbed.user_api", tuple(f"obmm.testbed.{m}" for m in USER_API)),
    ("bench", ("obmm.bench",)),
    ("testbed.cli", ("obmm.testbed.cli",)),
)
LAYER_NAMES = tuple(name for name, _ in LAYERS)


def module_name(path: Path, pylib: Path = PYLIB) -> str:
    parts = list(path.relative_to(pylib).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    pylib = package.parent
    return {module_name(p, pylib): p for p in sorted(package.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module of `known` that `path` imports, at module level or inside a function."""
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


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    mods = modules(package)
    known = set(mods)
    return {name: set(imported(name, path, known)) for name, path in mods.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    return [c for c in sccs(graph, graph) if len(c) > 1]


def layer_of(module: str) -> str:
    """The layer a module belongs to: the longest matching prefix (an exact name wins)."""
    best, best_len = "", -1
    for name, members in LAYERS:
        for m in members:
            exact = module == m
            under = module.startswith(m + ".")
            # the bare package "obmm.testbed" claims only itself, not its subpackages
            if (exact or (under and m not in ("obmm", "obmm.testbed"))) and len(m) > best_len:
                best, best_len = name, len(m)
    if best:
        return best
    if module.startswith("obmm.testbed."):
        raise KeyError(f"{module}: in no layer (add it to LAYERS in obmm/tools/layers.py)")
    return "runtime"


def layer_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Layer -> the other layers its modules import."""
    out: dict[str, set[str]] = {name: set() for name in LAYER_NAMES}
    for mod, deps in graph.items():
        src = layer_of(mod)
        out[src] |= {layer_of(d) for d in deps} - {src}
    return out


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a module in a layer above the importer's, one line each."""
    rank = {name: i for i, name in enumerate(LAYER_NAMES)}
    return [
        f"{mod} ({layer_of(mod)}) imports {dep} ({layer_of(dep)})"
        for mod in sorted(graph)
        for dep in sorted(graph[mod])
        if rank[layer_of(dep)] > rank[layer_of(mod)]
    ]


def python_cycles() -> list[str]:
    return ["import cycle: " + " <-> ".join(c) for c in cycles(import_graph())]


def python_layering() -> list[str]:
    return ["upward import: " + line for line in upward_imports(import_graph())]


#: The kernel modules whose C files must not call each other in a ring (obmm.tools.ccalls).
C_MODULES = ("obmm_emu", "ub_compat", "common", "obmm_testhook")


def c_cycles() -> list[str]:
    kmod = PYLIB.parent / "kmod"  # a checkout's; an installed wheel has no sources beside it
    problems = []
    for name in C_MODULES:
        if not (kmod / name).is_dir():
            continue
        g = ccalls.graph([kmod / name])
        problems += [f"kmod/{name}: call cycle: " + " <-> ".join(c) for c in g.cycles()]
    return problems


#: The checks `python -m obmm.tools.layers` runs: (what, function returning problems).
CHECKS: list[tuple[str, Callable[[], list[str]]]] = [
    ("python import cycles", python_cycles),
    ("python layering", python_layering),
    ("C call cycles (kmod/)", c_cycles),
]


def report(out: Callable[[str], None] = print) -> int:
    """Print the layers and run every check; 0 when all pass, else 1."""
    graph = import_graph()
    layers = layer_graph(graph)
    members: dict[str, list[str]] = {name: [] for name in LAYER_NAMES}
    for mod in graph:
        members[layer_of(mod)].append(mod)
    out("layers, bottom to top (-> the layers each imports):")
    for name in LAYER_NAMES:
        deps = ", ".join(d for d in LAYER_NAMES if d in layers[name]) or "-"
        out(f"  {name:18} {len(members[name]):3} modules -> {deps}")
    failed = 0
    for what, check in CHECKS:
        problems = check()
        out(f"{what}: {'ok' if not problems else f'{len(problems)} FAIL'}")
        for line in problems:
            out(f"  {line}")
        failed += bool(problems)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m obmm.tools.layers", description=__doc__.split("\n")[0]
    )
    parser.parse_args(argv)
    return report()


if __name__ == "__main__":
    sys.exit(main())
