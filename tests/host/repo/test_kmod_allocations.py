"""The emulator's allocations sized by a request never warn when they fail.

A region's page list, cache lines and owner table are as large as the caller asks.  Under the
debug kernel's fault injection such an allocation fails by design, and ``kvmalloc``'s vmalloc
fallback then prints ``vmalloc error: ... vm_struct allocation failed`` with a call trace: a
kernel report that failed the debug-kernel fuzz campaign (seed 1, op 3658, EXPORT_PID's page
list), although the driver refuses the call with its own line.  So each such allocation passes
``OBMM_GFP_SIZED`` (``GFP_KERNEL | __GFP_NOWARN``), or ``__GFP_NOWARN`` itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from obmm.testbed import paths

#: Allocators whose size is a variable; the plain-vmalloc family takes no gfp flags at all.
#: (kmalloc-based ones fail silently under failslab and are not the concern here.)
SIZED = re.compile(r"\b(kvmalloc|kvzalloc|kvcalloc|kvmalloc_array|kvmalloc_node)\s*\(")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
NO_FLAGS = re.compile(r"\b(vmalloc|vzalloc|vmalloc_array|vcalloc)\s*\(")


def _call(text: str, start: int) -> str:
    """The call's text from its name to its closing parenthesis."""
    depth = 0
    for i in range(text.index("(", start), len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    return text[start:]


def _sources() -> list[Path]:
    return sorted((paths.kmod_dir() / "obmm_emu").glob("*.c")) + sorted(
        (paths.kmod_dir() / "common").glob("*.c")
    )


def test_sized_allocations_pass_nowarn() -> None:
    bad = []
    for src in _sources():
        # Comments blanked, newlines kept, so line numbers stay true.
        text = COMMENT.sub(lambda c: re.sub(r"[^\n]", " ", c.group()), src.read_text())
        for m in SIZED.finditer(text):
            call = _call(text, m.start())
            if "OBMM_GFP_SIZED" not in call and "__GFP_NOWARN" not in call:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{src.name}:{line}: {' '.join(call.split())}")
        for m in NO_FLAGS.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{src.name}:{line}: {m.group(1)} cannot take __GFP_NOWARN; use kvmalloc")
    assert not bad, "allocations sized by a request that warn on failure:\n" + "\n".join(bad)


def test_the_check_sees_the_allocations() -> None:
    """The rule above is not vacuous: the emulator has sized allocations, and they are found."""
    found = [m for src in _sources() for m in SIZED.finditer(src.read_text())]
    assert len(found) >= 4, found
