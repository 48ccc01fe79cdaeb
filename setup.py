"""Build hook: the wheel carries the checkout's files the testbed needs as package data.

``obmm/_data/`` gets ``pyproject.toml``, ``kmod/`` (module sources, never build output),
``qemu/`` (image recipes, hooks, topologies), ``uapi/``, the guest suite (``tests/guest``,
``tests/c``) and ``examples/c`` (the handle helpers), in the checkout's layout, so
``obmm.testbed.paths`` finds them in an installed package exactly as in a checkout.  An editable
install (``make setup-python``) skips the copy: it runs from the checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Keep in step with obmm.testbed.provision.payload_tar and obmm.testbed.paths.ROOT_MARKERS.
DATA = ("pyproject.toml", "kmod", "qemu", "uapi", "tests/guest", "tests/c", "examples/c", "ubse")
SKIP = (
    "__pycache__", ".pytest_cache", ".mypy_cache", "*.pyc", "*.o", "*.ko", "*.mod", "*.mod.c",
    "*.cmd", ".*.cmd", "Module.symvers", "modules.order", ".tmp_versions", "exporter", "client",
)  # fmt: skip


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "obmm" / "_data"
        shutil.rmtree(dest, ignore_errors=True)
        for rel in DATA:
            src = ROOT / rel
            if src.is_dir():
                shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns(*SKIP))
            else:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)


setup(cmdclass={"build_py": BuildPyWithData})
