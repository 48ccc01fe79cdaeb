"""The kernel modules' C files call each other in layers: no call cycle between files.

The checker is :mod:`obmm.tools.ccalls` (``python -m obmm.tools.ccalls kmod/obmm_emu`` prints
the layers); the synthetic trees below prove it finds what it must and ignores what is not a call.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from obmm.testbed import paths
from obmm.tools import ccalls

#: Every module of kmod/ whose files must not call each other around a ring.
MODULES = ("obmm_emu", "ub_compat", "common", "obmm_testhook")


@pytest.mark.parametrize("module", MODULES)
def test_no_call_cycle_between_files(module: str) -> None:
    g = ccalls.graph([paths.kmod_dir() / module])
    assert g.files, f"no C file found for {module}"
    assert not g.cycles(), ccalls.report(g)


def test_obmm_emu_layers() -> None:
    """The direction issue 33 set: the emulated UMMU (access.c) is a leaf over the fabric, and
    core.c is the composition root that nothing calls."""
    g = ccalls.graph([paths.kmod_dir() / "obmm_emu"])
    assert "testbed_fabric.c" in g.files  # the Kbuild's ../common object is part of the module
    assert set(g.calls["access.c"]) == {"fabric.c"}, ccalls.report(g)
    assert not any("core.c" in out for out in g.calls.values())
    assert g.layers()[-1] == ["core.c"]


def test_obmm_emu_includes_show_the_layers() -> None:
    """Each file of obmm_emu includes the headers of exactly the files it calls, and its own:
    its includes are its place in the layers, and a new call across files shows in them."""
    root = paths.kmod_dir() / "obmm_emu"
    g = ccalls.graph([root])
    shared = {"obmm_emu", "obmm_emu_ctl", "testbed_fabric"}
    wrong = {}
    for c in sorted(root.glob("*.c")):
        included = set(re.findall(r'^#include "(\w+)\.h"', c.read_text(), re.M)) - shared
        wanted = {Path(f).stem for f in g.calls.get(c.name, {})} - shared
        if (root / f"{c.stem}.h").is_file():
            wanted.add(c.stem)
        if included != wanted:
            wrong[c.name] = (sorted(included - wanted), sorted(wanted - included))
    assert not wrong, f"file: (included but not called, called but not included): {wrong}"


def test_ub_compat_core_is_the_root() -> None:
    g = ccalls.graph([paths.kmod_dir() / "ub_compat"])
    assert not any("core.c" in out for out in g.calls.values()), ccalls.report(g)
    assert g.layers()[-1] == ["core.c"]


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_finds_a_two_file_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = write(
        tmp_path / "m",
        {
            "a.c": "int a_fn(void) { return b_fn(); }\n",
            "b.c": "int b_fn(void)\n{\n\treturn a_fn() + 1;\n}\n",
        },
    )
    g = ccalls.graph([tree])
    assert g.cycles() == [["a.c", "b.c"]]
    assert ccalls.main([str(tree)]) == 1
    out = capsys.readouterr().out
    assert "cycle: a.c b.c" in out
    assert "a.c -> b.c (a_fn -> b_fn)" in out


def test_finds_a_ring_and_leaves_its_callers_outside(tmp_path: Path) -> None:
    tree = write(
        tmp_path / "m",
        {
            "x.c": "void x(void) { y(); }\n",
            "y.c": "void y(void) { z(); }\n",
            "z.c": "static void helper(void) { x(); }\nvoid z(void) { helper(); }\n",
            "top.c": "static int __init top_init(void) { x(); return 0; }\n",
        },
    )
    g = ccalls.graph([tree])
    assert g.cycles() == [["x.c", "y.c", "z.c"]]
    assert g.layers() == [["x.c", "y.c", "z.c"], ["top.c"]]


def test_what_is_not_a_call(tmp_path: Path) -> None:
    """Ops tables, callbacks, calls through pointers, comments, strings, macros and another
    file's static function of the same name make no edge back."""
    tree = write(
        tmp_path / "m",
        {
            "low.c": (
                "struct ops { int (*open)(void); };\n"
                "static const struct ops *hooks;\n"
                "static const struct ops table = { .open = high_open };\n"
                "/* high_open() is reached through hooks */\n"
                "#define CALL_HIGH() high_open()\n"
                "static int helper(void) { return 0; }\n"
                "int low(void)\n"
                "{\n"
                '\tpr_info("high_open(%d)\\n", 1);\n'
                "\tINIT_WORK(&w, high_open);\n"
                "\treturn hooks->high_open() + table.high_open() + helper();\n"
                "}\n"
            ),
            "high.c": (
                "static int helper(void) { return 1; }\n"
                "int high_open(void) { return low() + helper(); }\n"
            ),
        },
    )
    g = ccalls.graph([tree])
    assert g.edges() == {("high.c", "low.c")}
    assert not g.cycles()
    assert g.layers() == [["low.c"], ["high.c"]]
    assert ccalls.main([str(tree)]) == 0


def test_file_scope_calls_and_variables_count(tmp_path: Path) -> None:
    """A macro invocation at file scope that calls another file's function, and the use of a
    variable another file defines (declared extern in a header), are edges: here they close a
    ring that no function body shows."""
    tree = write(
        tmp_path / "m",
        {
            "m.h": "extern int node_id;\nextern const struct group *groups[];\n",
            "fab.c": (
                "int node_id;\n"
                "module_param_named(node_id, node_id, int, 0444);\n"
                "int fab(void) { return 0; }\n"
            ),
            "attrs.c": (
                'ATTR(pool, "%d", upper());\nconst struct group *groups[] = { &a, NULL };\n'
            ),
            "dev.c": "int publish(void) { return groups[0] != 0; }\n",
            "upper.c": "int upper(void) { return publish() + node_id; }\n",
        },
    )
    g = ccalls.graph([tree])
    assert g.calls["attrs.c"] == {"upper.c": "<file scope> -> upper"}
    assert g.calls["dev.c"] == {"attrs.c": "publish uses groups"}
    assert g.calls["upper.c"] == {"dev.c": "upper -> publish", "fab.c": "upper uses node_id"}
    assert g.cycles() == [["attrs.c", "dev.c", "upper.c"]]


def test_kbuild_says_which_files(tmp_path: Path) -> None:
    """A module's files are its Kbuild's objects, a shared directory's and one a configuration
    option adds included; a C file the Kbuild does not link is not part of it."""
    write(tmp_path / "common", {"fab.c": "int fab(void) { return 0; }\n"})
    mod = write(
        tmp_path / "mod",
        {
            "Kbuild": "obj-m := m.o\nm-y := core.o \\\n\t../common/fab.o\n"
            "m-$(CONFIG_ARM64) += arch.o\n",
            "core.c": "int core(void) { return fab(); }\n",
            "arch.c": "int arch(void) { return core(); }\n",
            "stale.c": "int stale(void) { return core(); }\n",
        },
    )
    g = ccalls.graph([mod])
    assert g.files == ["arch.c", "core.c", "fab.c"]
    assert g.edges() == {("core.c", "fab.c"), ("arch.c", "core.c")}
