#!/usr/bin/env python3
"""Refresh the generated tables of the documentation: the cause table (obmm.causes) and the
ubs-mem/UBSE code table (obmm.ubsm_causes) in docs/causes.md, the variable table (obmm.envvars) in docs/settings.md and the fidelity table
(kmod/obmm_emu/FIDELITY.md) in docs/emulated-driver.md.  `--check` exits 1 when a page is stale,
lacks its markers, or another document carries a copy of a table."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pylib"))

from obmm import envvars, ubsm_causes  # noqa: E402
from obmm.causes import render_markdown  # noqa: E402

FIDELITY_BEGIN = "<!-- fidelity table: generated from kmod/obmm_emu/FIDELITY.md -->"
FIDELITY_END = "<!-- end of fidelity table -->"
CAUSES_BEGIN = "<!-- cause table: generated from pylib/obmm/causes.py -->"
CAUSES_END = "<!-- end of cause table -->"
UBSM_BEGIN = "<!-- ubsm code table: generated from pylib/obmm/ubsm_causes.py -->"
UBSM_END = "<!-- end of ubsm code table -->"
VARS_BEGIN = "<!-- variable table: generated from pylib/obmm/envvars.py -->"
VARS_END = "<!-- end of variable table -->"

# Where each generated table lives (the README links these pages).
CAUSES_PAGE = Path("docs/causes.md")
SETTINGS_PAGE = Path("docs/settings.md")
FIDELITY_PAGE = Path("docs/emulated-driver.md")


def fidelity_table() -> str:
    lines = (REPO / "kmod" / "obmm_emu" / "FIDELITY.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("|")]
    return "\n".join(table) + "\n"


TABLES: tuple[tuple[Path, str, str, Callable[[], str]], ...] = (
    (CAUSES_PAGE, CAUSES_BEGIN, CAUSES_END, render_markdown),
    (CAUSES_PAGE, UBSM_BEGIN, UBSM_END, ubsm_causes.render_markdown),
    (SETTINGS_PAGE, VARS_BEGIN, VARS_END, envvars.render_markdown),
    (FIDELITY_PAGE, FIDELITY_BEGIN, FIDELITY_END, fidelity_table),
)


class Stale(Exception):
    pass


def _replace(text: str, where: Path, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    found = len(pattern.findall(text))
    if found != 1:
        raise Stale(f"{where} has the markers {begin!r} ... {end!r} {found} times, not once")
    return pattern.sub(lambda _m: f"{begin}\n\n{body}\n{end}", text)


def rendered(repo: Path = REPO) -> dict[Path, str]:
    """Each page with its tables as the generators make them now."""
    pages: dict[Path, str] = {}
    for page, begin, end, make in TABLES:
        text = pages.get(page) or (repo / page).read_text()
        pages[page] = _replace(text, page, begin, end, make())
    return pages


def stray_copies(repo: Path = REPO) -> list[str]:
    """Documents other than a table's page that carry its markers (a copy nobody refreshes)."""
    documents = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    found = []
    for doc in documents:
        text = doc.read_text()
        for page, begin, _end, _make in TABLES:
            if doc != repo / page and begin in text:
                found.append(f"{doc.relative_to(repo)} carries a copy of the table of {page}")
    return found


def main() -> int:
    check = "--check" in sys.argv[1:]
    try:
        pages = rendered()
    except Stale as exc:
        print(f"sync_docs: {exc}", file=sys.stderr)
        return 1
    stale = [page for page, text in pages.items() if (REPO / page).read_text() != text]
    strays = stray_copies()
    for line in strays:
        print(f"sync_docs: {line}", file=sys.stderr)
    if check:
        for page in stale:
            print(f"{page} is stale: run `python3 ci/sync_docs.py`", file=sys.stderr)
        return 1 if stale or strays else 0
    for page in stale:
        (REPO / page).write_text(pages[page])
    return 1 if strays else 0


if __name__ == "__main__":
    sys.exit(main())
