"""`import obmm` takes the precompiled declarations only when they are these very ones.

The testbed's payload carries `obmm/_abi_ffi.py` (abi.emit_precompiled, made on the host) so
that guest processes skip pycparser; a module made from other declarations, or one this cffi
cannot load, must be passed over for parsing, never used.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from obmm import abi
from obmm.testbed.paths import package_dir


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the obmm package (its importable parent dir), with no precompiled module."""
    shutil.copytree(package_dir(), tmp_path / "obmm", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "obmm" / f"{abi.PRECOMPILED_MODULE}.py").unlink(missing_ok=True)
    return tmp_path


def _origin(parent: Path) -> str:
    probe = (
        "import obmm.abi as a\n"
        "assert a.sizeof('struct obmm_cmd_import') == 96\n"
        "print(a.FFI_ORIGIN)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(parent), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_without_a_precompiled_module_the_declarations_are_parsed(package_copy: Path) -> None:
    assert _origin(package_copy) == "parsed"


def test_a_precompiled_module_of_these_declarations_is_used(package_copy: Path) -> None:
    abi.emit_precompiled(package_copy / "obmm" / f"{abi.PRECOMPILED_MODULE}.py")
    assert _origin(package_copy) == "precompiled"


def test_a_module_made_from_other_declarations_is_not_used(package_copy: Path) -> None:
    path = package_copy / "obmm" / f"{abi.PRECOMPILED_MODULE}.py"
    abi.emit_precompiled(path)
    text = path.read_text()
    other = abi.declarations_text().replace("__u64 mem_id;", "__u32 mem_id;", 1)
    assert repr(abi.declarations_text()) in text and other != abi.declarations_text()
    path.write_text(text.replace(repr(abi.declarations_text()), repr(other)))
    assert _origin(package_copy) == "parsed"


def test_a_module_this_cffi_cannot_load_is_not_used(package_copy: Path) -> None:
    path = package_copy / "obmm" / f"{abi.PRECOMPILED_MODULE}.py"
    abi.emit_precompiled(path)
    # A format version no _cffi_backend accepts stands for one made by a far newer cffi.
    text = re.sub(r"_version = 0x[0-9a-fA-F]+", "_version = 0x7fff", path.read_text())
    path.write_text(text)
    assert _origin(package_copy) == "parsed"
    path.write_text(text[: len(text) // 2])  # truncated: a SyntaxError on import
    assert _origin(package_copy) == "parsed"
