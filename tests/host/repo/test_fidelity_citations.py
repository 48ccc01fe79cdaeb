"""Every behaviour kmod/obmm_emu/FIDELITY.md calls ``same`` names where in the real driver it was
checked: a ``file.c:function`` citation (the house rule), and each citation points at a function
the pinned upstream tree defines.

The upstream tree is an input given by path (:func:`obmm.testbed.paths.ub_upstream_dir`); without
it the second check skips with one line.  A citation is ``name.c:function``, optionally followed
by further functions of the same file (`` `a.c:f`, `g` ``, up to the next ``;`` or ``)``); the
file is looked up under ``drivers/ub/obmm``, ``drivers/ub``, ``include`` or the tree's root, or,
for a bare name, as the one file of that name under ``drivers/ub`` or ``include``.
Citations of other trees (``file.c@commit`` of openeuler-mirror/kernel) are not checked here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from upstream_inputs import ub_upstream_tree

FIDELITY = Path(__file__).resolve().parents[3] / "kmod" / "obmm_emu" / "FIDELITY.md"
HEADER = re.compile(r"^\|\s*behaviour\s*\|\s*status\s*\|\s*notes\s*\|\s*tested\s*\|$")
#: A remark in parentheses after a cited function (one level of nesting).
REMARK = r"\s*\((?:[^()]|\([^()]*\))*\)"
#: `` `obmm_core.c:obmm_init` `` (a path allowed), then `` , `fn` `` continuations of that file,
#: each function perhaps followed by a remark.
CITATION = re.compile(
    rf"`((?:[\w.-]+/)*[\w-]+\.[ch]):(\w+)`((?:(?:{REMARK})?\s*,\s*`\w+(?:\(\))?`)*)"
)
CONTINUED = re.compile(r"`(\w+)(?:\(\))?`")
SEARCH_DIRS = ("drivers/ub/obmm", "drivers/ub", "include", ".")


@dataclass(frozen=True)
class Row:
    line: int
    behaviour: str
    status: str
    notes: str


def fidelity_rows(text: str) -> list[Row]:
    """The rows of the behaviour table (not the measurement tables after it)."""
    rows: list[Row] = []
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if HEADER.match(line.strip()):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        if set(line.strip()) <= set("|- "):
            continue
        # cells split at unescaped pipes (`a \\| b` is one cell)
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        assert len(cells) == 4, f"FIDELITY.md:{number}: {len(cells)} cells, expected 4"
        rows.append(Row(number, cells[0], cells[1], cells[2]))
    return rows


def citations(text: str) -> list[tuple[str, str]]:
    """(file, function) pairs a cell cites."""
    found: list[tuple[str, str]] = []
    for match in CITATION.finditer(text):
        found.append((match[1], match[2]))
        rest = re.sub(REMARK, "", match[3])
        found.extend((match[1], fn) for fn in CONTINUED.findall(rest))
    return found


def resolve(tree: Path, name: str) -> Path | None:
    for base in SEARCH_DIRS:
        candidate = tree / base / name
        if candidate.is_file():
            return candidate
    if "/" not in name:
        hits = [p for d in ("drivers/ub", "include") for p in (tree / d).rglob(name)]
        if len(hits) == 1:
            return hits[0]
    return None


def defines(source: str, function: str) -> bool:
    """A definition (return type and name at a line's start, a body after the parameters), not a
    call or a prototype."""
    head = rf"^(?:[A-Za-z_][\w \t*]*[ \t*])?{re.escape(function)}\s*\([^;{{}}]*\)\s*\{{"
    return re.search(head, source, re.M) is not None


SAMPLE = """\
| behaviour | status | notes | tested |
|---|---|---|---|
| a | same | (`obmm_core.c:obmm_init` (`misc_register`, `X`), `obmm_exit`; `ubus/sysfs.c:f`) | t |
| d `a \\| b` | same | | t |
| b `x.c:f` in the behaviour | same | | t |
| c | emulator-specific | | t |

| event | bound | measured |
|---|---|---|
| e | same | 1 ms |
"""


def test_rows_and_citations_are_parsed() -> None:
    rows = fidelity_rows(SAMPLE)
    assert [(r.behaviour[0], r.status) for r in rows] == [
        ("a", "same"),
        ("d", "same"),
        ("b", "same"),
        ("c", "emulator-specific"),
    ]
    assert citations(rows[0].notes) == [
        ("obmm_core.c", "obmm_init"),
        ("obmm_core.c", "obmm_exit"),
        ("ubus/sysfs.c", "f"),
    ]
    assert citations(rows[2].behaviour) == [("x.c", "f")]
    assert citations("`obmm_import.c@bf00953` `teardown_remote_numa()`") == []


def test_a_definition_is_told_from_a_call_and_a_prototype() -> None:
    src = "static int f(int a);\nstatic int\nf(int a,\n  int b)\n{\n\treturn g(a);\n}\n"
    assert defines(src, "f")
    assert not defines(src, "g")
    assert not defines("int f(int a);\n", "f")
    assert defines("static int __init f(void)\n{\n}\n", "f")


def test_every_same_row_cites_upstream_file_and_function() -> None:
    rows = [r for r in fidelity_rows(FIDELITY.read_text()) if r.status == "same"]
    assert len(rows) > 30, "the behaviour table was not found"
    uncited = [
        f"FIDELITY.md:{r.line}: {r.behaviour[:60]}"
        for r in rows
        if not citations(r.behaviour + " " + r.notes)
    ]
    assert not uncited, "'same' rows without a `file.c:function` citation:\n" + "\n".join(uncited)


def upstream_tree() -> Path:
    return ub_upstream_tree("test_fidelity_citations (citations against the tree)")


def test_every_citation_names_a_function_the_pinned_tree_defines() -> None:
    tree = upstream_tree()
    wrong: list[str] = []
    for row in fidelity_rows(FIDELITY.read_text()):
        for name, function in citations(row.behaviour + " " + row.notes):
            source = resolve(tree, name)
            if source is None:
                wrong.append(f"FIDELITY.md:{row.line}: no file {name} in {tree}")
            elif not defines(source.read_text(errors="replace"), function):
                wrong.append(f"FIDELITY.md:{row.line}: {name} defines no {function}()")
    assert not wrong, "\n".join(dict.fromkeys(wrong))
