"""Bytecode for a tarball bound for a guest: this interpreter's .pyc beside each source.

Under TCG a guest Python compiles a few hundred lines per ten milliseconds, so importing an
uncompiled package costs seconds of CPU every time a fresh node (or a process run with
PYTHONDONTWRITEBYTECODE) imports it.  The .pyc is checked against the source's mtime and size,
which the archive keeps; an interpreter of another version looks for its own cache tag and
ignores these files, so they never make a guest run other code than the source.
"""

from __future__ import annotations

import importlib.util
import py_compile
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path


def add_compiled(tar: tarfile.TarFile, sources: Iterable[tuple[Path, str]]) -> None:
    """Add the bytecode of each (source file, its name in `tar`) under `__pycache__/`."""
    with tempfile.TemporaryDirectory(prefix="obmm-pyc-") as tmp:
        cfile = Path(tmp) / "module.pyc"
        for src, arc in sources:
            if not arc.endswith(".py"):
                continue
            py_compile.compile(str(src), cfile=str(cfile), dfile=arc, doraise=True)
            tar.add(cfile, arcname=importlib.util.cache_from_source(arc))
