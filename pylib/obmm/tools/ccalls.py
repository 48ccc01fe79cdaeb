"""The call graph between the C files of a kernel module's sources, its layers and its cycles.

``python -m obmm.tools.ccalls kmod/obmm_emu`` reads the C files of one module: those its
``Kbuild`` links (``../common/testbed_fabric.o`` included), or every ``*.c`` of a directory
without one (several directories may be given).  It prints the files as layers, bottom first:
a file of layer 0 calls no function of another file; a file of layer *n* calls files of layers
below *n* only.  Files that call each other, directly or around a ring, form a cycle (a
strongly connected component): they are printed with the calls that close the ring, and the
exit status is 1.
``tests/host/repo/test_c_layers.py`` holds the project's modules to no cycle.

How (no C parser: pycparser cannot read kernel sources, which need the kernel's headers and
GNU extensions): comments, string and char literals and preprocessor lines are blanked
(:func:`obmm.tools.csource.blank`), function definitions are found by brace matching at
file level (:func:`obmm.tools.csource.functions`), and a call is a name followed by
``(``, in a body or at file scope (a macro that expands to a function).  A call from file A to
a name that A does not define, and that another file defines without ``static``, is an edge
A -> that file; so is a use of a variable that another file defines and a header declares
``extern``.

Limits:

* A function pointer is not a call: a handler named in an ops table (``.open = f``), a work
  or timer callback (``INIT_WORK(&w, f)``) or a callback registered through an ops struct
  makes no edge; this is how a lower layer reaches a higher one without a cycle.  Calls
  through a pointer (``ops->f(x)``, ``s.f(x)``) make none either.
* Of the variables, only those a header of the module's directories declares ``extern``
  count (a use is any mention of the name, outside comments and strings).
* Preprocessor lines are blanked, so calls inside a macro's body make no edge, and both
  sides of an ``#if`` are read (a function defined under both is one name).
* ``static inline`` helpers of headers are not in the graph (each file gets its own copy).
* A call must look like one in kernel style: ``a>f(x)`` without spaces reads as a member call.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from obmm.tools.csource import KEYWORDS, Function, blank, functions
from obmm.tools.graphs import sccs

#: A name followed by ``(``, not a member (``->f(``, ``.f(``).
CALL = re.compile(r"(?<![.>\w])([A-Za-z_]\w*)\s*\(")
NOT_CALLS = KEYWORDS | {"typeof", "__typeof__", "defined", "case"}


@dataclass
class Graph:
    """Files (names), and for each, the files it calls with one example call per edge."""

    files: list[str]
    #: caller file -> callee file -> "caller_fn -> callee_fn" (the first seen)
    calls: dict[str, dict[str, str]] = field(default_factory=dict)

    def edges(self) -> set[tuple[str, str]]:
        return {(a, b) for a, out in self.calls.items() for b in out}

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one file, each sorted."""
        return [c for c in sccs(self.files, self.calls) if len(c) > 1]

    def layers(self) -> list[list[str]]:
        """Files by layer, bottom first; a cycle's files share the layer of the ring."""
        comps = sccs(self.files, self.calls)
        comp_of = {f: i for i, c in enumerate(comps) for f in c}
        level: dict[int, int] = {}
        # Tarjan yields components callees first: each one's callees are already levelled.
        for i, comp in enumerate(comps):
            below = [
                level[comp_of[b]] for a in comp for b in self.calls.get(a, {}) if comp_of[b] != i
            ]
            level[i] = 1 + max(below) if below else 0
        out: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
        for i, comp in enumerate(comps):
            out[level[i]].extend(comp)
        return [sorted(layer) for layer in out]


#: An object a Kbuild line lists, after ``:=`` or ``+=``.
OBJECT = re.compile(r"[\w./-]+\.o\b")
#: A Kbuild assignment: its variable and its value (continuations joined).
ASSIGN = re.compile(r"^([\w$()-]+)\s*[:+]?=(.*)$", re.M)


def sources(directory: Path) -> list[Path]:
    """The C files of the module built in `directory`: the objects of its ``Kbuild``'s
    ``<module>-y`` / ``<module>-objs`` lines, and of its ``<module>-$(CONFIG_...)`` ones
    whatever the configuration (or its ``obj-m`` objects, for a one-file module), or, without
    a Kbuild, every ``*.c`` there."""
    kbuild = directory / "Kbuild"
    if not kbuild.is_file():
        return sorted(directory.glob("*.c"))
    text = kbuild.read_text().replace("\\\n", " ")
    parts: list[str] = []
    single: list[str] = []
    for m in ASSIGN.finditer(text):
        var, value = m.group(1), m.group(2)
        linked = var.endswith(("-y", "-objs")) or re.search(r"-\$\(CONFIG_\w+\)$", var)
        if linked and not var.startswith(("ccflags", "obj")):
            parts += OBJECT.findall(value)
        elif var == "obj-m":
            single += OBJECT.findall(value)
    objects = parts or single
    return sorted((directory / o).with_suffix(".c").resolve() for o in objects)


#: ``extern <type> name;`` (or ``name[]``) in a header: a variable some file defines.
EXTERN = re.compile(r"\bextern\b[^;(){}]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*;")


def _file_scope(text: str, fns: Iterable[Function]) -> str:
    """`text` (blanked) without its function bodies: declarations, tables, macro invocations."""
    for fn in fns:
        text = text.replace(fn.body, "", 1)
    return text


def _variables(headers: Iterable[Path], scopes: Mapping[str, str]) -> dict[str, str]:
    """Each variable the headers declare ``extern``, and the file that defines it: the one
    whose file scope declares it (a type before it, ``=`` or ``;`` after) without ``extern``."""
    owner: dict[str, str] = {}
    for header in headers:
        for name in EXTERN.findall(blank(header.read_text(errors="replace"))):
            definition = re.compile(rf"\b{name}\s*(?:\[[^\]]*\])?\s*[=;]")
            for file, scope in scopes.items():
                for m in definition.finditer(scope):
                    start = max(scope.rfind(";", 0, m.start()), scope.rfind("}", 0, m.start()))
                    statement = scope[start + 1 : m.start()]
                    if re.search(r"[\w*]\s*$", statement) and not re.search(
                        r"\bextern\b|[(),]", statement
                    ):
                        owner.setdefault(name, file)
    return owner


def graph(dirs: Iterable[Path]) -> Graph:
    """The file call graph of the C files of `dirs` (:func:`sources`; names must be distinct).

    A call counts wherever it is written: in a function body, or at file scope (a macro
    invocation that expands to a function, ``OBMM_EMU_ATTR(x, "%d", f())``).  A variable a
    header declares ``extern`` counts as a call of the file that defines it, by every other
    file that names it."""
    paths = sorted({p for d in dirs for p in sources(Path(d))})
    defs = {p.name: functions(p) for p in paths}
    if len(defs) != len(paths):
        raise ValueError("two directories hold a C file of the same name")
    scopes = {
        p.name: _file_scope(blank(p.read_text(errors="replace")), defs[p.name]) for p in paths
    }
    headers = sorted({h for p in paths for h in p.parent.glob("*.h")})
    owner: dict[str, str] = {}
    for name, fns in defs.items():
        for fn in fns:
            if not fn.static:
                owner.setdefault(fn.name, name)
    variables = _variables(headers, scopes)
    g = Graph(files=sorted(defs))
    for name, fns in defs.items():
        local = {fn.name for fn in fns}
        out = g.calls.setdefault(name, {})
        bodies = [(fn.name, fn.body) for fn in fns] + [("<file scope>", scopes[name])]
        for where, text in bodies:
            for m in CALL.finditer(text):
                callee = m.group(1)
                if callee in NOT_CALLS or callee in local or callee not in owner:
                    continue
                out.setdefault(owner[callee], f"{where} -> {callee}")
            for var, file in variables.items():
                if file != name and re.search(rf"\b{var}\b", text):
                    out.setdefault(file, f"{where} uses {var}")
    return g


def report(g: Graph) -> str:
    lines = []
    for n, layer in enumerate(g.layers()):
        lines.append(f"layer {n}: {' '.join(layer)}")
    for comp in g.cycles():
        lines.append(f"cycle: {' '.join(comp)}")
        members = set(comp)
        for a in comp:
            for b, example in sorted(g.calls.get(a, {}).items()):
                if b in members:
                    lines.append(f"  {a} -> {b} ({example})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m obmm.tools.ccalls",
        description="Layers and call cycles between the C files of a module's sources.",
    )
    parser.add_argument(
        "dirs", nargs="+", type=Path, help="a module's directory (its Kbuild says its files)"
    )
    parser.add_argument("--edges", action="store_true", help="also print every file edge")
    args = parser.parse_args(argv)
    g = graph(args.dirs)
    print(report(g))
    if args.edges:
        for a in g.files:
            for b, example in sorted(g.calls.get(a, {}).items()):
                print(f"{a} -> {b} ({example})")
    return 1 if g.cycles() else 0


if __name__ == "__main__":
    sys.exit(main())
