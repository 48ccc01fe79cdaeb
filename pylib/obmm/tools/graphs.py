"""Strongly connected components of a directed graph (a leaf: stdlib only), for the layer
checks of Python imports (:mod:`obmm.tools.layers`) and of C calls (:mod:`obmm.tools.ccalls`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def sccs(nodes: Iterable[str], succ: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, callees before callers, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out
