"""Nothing of the upstream UB driver tree, or of upstream libobmm, is in the project.

The upstream tree (``obmm.testbed.paths.ub_upstream_dir()``) is an input the real-driver build reads
by path, never a source of ours; so is libobmm (``paths.libobmm_source_dir()``), which the cluster
suite builds in the nodes and whose lines count as upstream's when it is given.  Without a tree
these checks skip with one line.
Under kmod/, pylib/ and tests/ (and examples/) no file may carry an upstream copyright header,
be a copy of an upstream file, or hold a block of upstream lines (four non-trivial lines in a
row that are, whitespace aside, lines of a tree).  Single lines may
match: format strings the driver prints that ours must match, the UAPI's names; and the lines
that name an interface we implement (a function's head or prototype, its EXPORT_SYMBOL) are not
counted at all, since they must be the same.  Patches count only the lines they add (their
context is upstream's by nature).  The compat layer must say it is ours: an SPDX line and no
other copyright.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from upstream_inputs import ub_upstream_tree

from obmm.testbed import paths

ROOT = Path(__file__).resolve().parents[3]
OURS = ("kmod", "pylib", "tests", "examples")
UPSTREAM_SUFFIXES = {".c", ".h", ".py", ".mk", ".sh", ".md", ".txt", ""}
TEXT_SUFFIXES = {".c", ".h", ".py", ".mk", ".sh", ".md", ".txt", ".patch", ".json", ".toml", ""}
#: Lines shorter than this (normalised) say too little to be a copy: braces, returns, labels.
MIN_LINE = 30
#: This many non-trivial lines in a row, all upstream's, are a copied block.
BLOCK = 4
#: A file with at least this many non-trivial lines, most of them upstream's, is a copied file.
FILE_MIN_LINES = 10
UPSTREAM_COPYRIGHT = re.compile(r"Copyright \(c\).*(Huawei|HiSilicon) Technologies", re.IGNORECASE)
#: A C function's head or prototype, or its export: an interface's name, the same by necessity.
INTERFACE = re.compile(r"^(EXPORT_SYMBOL(_GPL)?\(\w+\);|[\w\s\*]+\b\w+\([^;{}=]*\);?)$")


def normalise(line: str) -> str:
    return " ".join(line.split())


def trivial(line: str) -> bool:
    return (
        len(line) < MIN_LINE
        or line.startswith(("#include", "*", "/*", "//", "# SPDX"))
        or INTERFACE.match(line) is not None
    )


def upstream_tree() -> Path:
    return ub_upstream_tree("test_no_upstream_code (no upstream code copied)")


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="ignore").splitlines()
    except OSError:
        return []


@pytest.fixture(scope="module")
def upstream_lines() -> set[str]:
    found: set[str] = set()
    for tree in (upstream_tree(), paths.libobmm_source_dir()):
        if tree is None:
            continue
        for path in tree.rglob("*"):
            if (
                path.is_file()
                and path.suffix in UPSTREAM_SUFFIXES
                and path.stat().st_size < 2 << 20
            ):
                found.update(n for n in map(normalise, read_lines(path)) if not trivial(n))
    return found


def our_files() -> Iterator[Path]:
    for top in OURS:
        for path in (ROOT / top).rglob("*"):
            skip = {"__pycache__", ".pytest_cache", ".mypy_cache"}
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not skip & set(path.parts):
                yield path


def our_lines(path: Path) -> list[str]:
    lines = read_lines(path)
    if path.suffix == ".patch":  # only what the patch adds
        lines = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return [normalise(ln) for ln in lines]


def test_no_file_carries_an_upstream_copyright() -> None:
    upstream_tree()
    found = [
        f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}"
        for path in our_files()
        for i, line in enumerate(read_lines(path))
        if UPSTREAM_COPYRIGHT.search(line)
    ]
    assert not found, "upstream copyright lines:\n" + "\n".join(found)


def copied_blocks(lines: list[str], upstream: set[str]) -> list[int]:
    """First line numbers of runs of BLOCK non-trivial lines that are all upstream's."""
    starts, run, first = [], 0, 0
    for i, line in enumerate(lines):
        if trivial(line):
            continue
        if line in upstream:
            run += 1
            first = first if run > 1 else i + 1
            if run == BLOCK:
                starts.append(first)
        else:
            run = 0
    return starts


def test_no_block_or_file_of_upstream_lines(upstream_lines: set[str]) -> None:
    problems = []
    for path in our_files():
        lines = our_lines(path)
        rel = path.relative_to(ROOT)
        for start in copied_blocks(lines, upstream_lines):
            problems.append(f"{rel}:{start}: {BLOCK} lines in a row are upstream's")
        real = [ln for ln in lines if not trivial(ln)]
        shared = sum(ln in upstream_lines for ln in real)
        if len(real) >= FILE_MIN_LINES and shared * 2 > len(real):
            problems.append(f"{rel}: {shared} of {len(real)} lines are upstream's")
    assert not problems, "\n".join(problems)


def test_the_checks_see_a_copy(upstream_lines: set[str], tmp_path: Path) -> None:
    """A block taken from the tree is found (the check can fail)."""
    tree = upstream_tree()
    source = tree / "drivers" / "ub" / "obmm" / "obmm_core.c"
    lines = [normalise(ln) for ln in read_lines(source)]
    assert copied_blocks(lines[100:200], upstream_lines)
    assert any(UPSTREAM_COPYRIGHT.search(ln) for ln in read_lines(source))


def test_the_checks_see_a_copy_of_libobmm(upstream_lines: set[str]) -> None:
    missing = paths.libobmm_missing("test_no_upstream_code (a copy of libobmm is seen)")
    tree = paths.libobmm_source_dir()
    if missing is not None or tree is None:
        pytest.skip(missing)
    source = tree / "libobmm.c"
    lines = [normalise(ln) for ln in read_lines(source)]
    assert copied_blocks(lines, upstream_lines)
    assert any(UPSTREAM_COPYRIGHT.search(ln) for ln in read_lines(source))


def test_the_compat_layer_is_ours() -> None:
    compat = ROOT / "kmod" / "ub_compat"
    sources = [
        p for p in compat.rglob("*") if p.suffix in {".c", ".h", ".mk"} or p.name == "Kbuild"
    ]
    assert sources
    for path in sources:
        head = "\n".join(read_lines(path)[:3])
        assert "SPDX-License-Identifier: GPL-2.0" in head, f"{path}: no SPDX line"
        assert "Copyright" not in path.read_text(), f"{path}: a copyright line not ours"
