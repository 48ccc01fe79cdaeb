"""Build the wheel from a copy of the checkout and install it into a fresh venv outside it.

Shared by tests/host/repo/test_wheel.py (no VM) and tests/testbed/test_run_cli.py (`run` from the
installed wheel).  The checkout stays clean: the build runs in a copy.  The fresh venv gets the
wheel only (``--no-deps``); its dependencies (cffi, paramiko, ...) come from the running
interpreter's site-packages through a ``.pth`` file placed after the venv's own, so nothing is
downloaded and the venv's ``obmm`` is the installed one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "pylib", "kmod", "qemu", "uapi",
           "tests/guest", "tests/c", "examples/c", "ubse")  # fmt: skip
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.o", "*.ko", ".*.cmd")


def build_wheel(work: Path) -> Path:
    src = work / "src"
    for rel in SOURCES:
        path = CHECKOUT / rel
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=IGNORE)
        else:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    out = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = out.glob("obmm_testbed-*.whl")
    return wheel


def install(wheel: Path, venv: Path) -> Path:
    """A fresh venv with the wheel installed; its bin directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    deps = sysconfig.get_paths()["purelib"]
    Path(purelib, "zz_obmm_test_deps.pth").write_text(deps + "\n")
    return venv / "bin"


BLOCKER = """\
import importlib.abc, sys
class _NoPytest(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pytest", "_pytest"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoPytest())
"""


def block_pytest(venv: Path) -> None:
    """Make the venv behave as if pytest were not installed (the deps .pth shares the host's
    site-packages, which has it): a sitecustomize that refuses to import it."""
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "sitecustomize.py").write_text(BLOCKER)
