"""Run Python code with only an unpacked archive on its path and see where its imports came
from (``python -v``): the tests of the payload's and the shipped pytest's bytecode share it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Imports:
    loaded: list[str]  # "# code object from ..." lines under the root
    compiled: list[str]  # of those, the ones not from a __pycache__ (compiled from source)
    stale: list[str]  # lines about a stale or mismatched .pyc under the root
    stderr: str


def bytecode_imports(root: Path, pythonpath: Path, code: str, *flags: str) -> Imports:
    """`code` run with PYTHONDONTWRITEBYTECODE and PYTHONPATH=`pythonpath` (under `root`)."""
    proc = subprocess.run(
        [sys.executable, *flags, "-v", "-c", code],
        cwd=root,
        env={"PYTHONPATH": str(pythonpath), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ours = [ln for ln in proc.stderr.splitlines() if str(root) in ln]
    loaded = [ln for ln in ours if ln.startswith("# code object from")]
    return Imports(
        loaded=loaded,
        compiled=[ln for ln in loaded if "__pycache__" not in ln],
        stale=[ln for ln in ours if "stale" in ln or "bad mtime" in ln],
        stderr=proc.stderr,
    )
