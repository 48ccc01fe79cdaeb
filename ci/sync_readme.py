#!/usr/bin/env python3
"""Refresh the README's generated tables: the cause table (obmm.causes), the ubs-mem/UBSE code
table (obmm.ubsm_causes), the variable table (obmm.envvars) and the fidelity table
(kmod/obmm_emu/FIDELITY.md).  `--check` exits 1 when the
README is stale."""

from __future__ import annotations

import re
import sys
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


def fidelity_table() -> str:
    lines = (REPO / "kmod" / "obmm_emu" / "FIDELITY.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("|")]
    return "\n".join(table) + "\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md lacks the markers {begin!r} ... {end!r}")
    return pattern.sub(lambda _m: f"{begin}\n\n{body}\n{end}", text)


def render(readme: str) -> str:
    readme = _replace(readme, CAUSES_BEGIN, CAUSES_END, render_markdown())
    readme = _replace(readme, UBSM_BEGIN, UBSM_END, ubsm_causes.render_markdown())
    readme = _replace(readme, VARS_BEGIN, VARS_END, envvars.render_markdown())
    return _replace(readme, FIDELITY_BEGIN, FIDELITY_END, fidelity_table())


def main() -> int:
    path = REPO / "README.md"
    current = path.read_text()
    wanted = render(current)
    if "--check" in sys.argv[1:]:
        if current != wanted:
            print("README.md is stale: run `python3 ci/sync_readme.py`", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
