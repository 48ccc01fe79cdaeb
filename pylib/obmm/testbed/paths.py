"""Where the testbed finds its sources and puts what it makes: one function and one variable each.

=====================  ==========================  =============================================
function               environment variable        default
=====================  ==========================  =============================================
``repo_root()``        ``$OBMM_TESTBED_ROOT``      the checkout this package was imported from
``qemu_dir()``         (follows the root)          ``<root>/qemu`` (image recipes, topologies)
``kmod_dir()``         (follows the root)          ``<root>/kmod`` (module sources, patches)
``cache_dir()``        ``$OBMM_TESTBED_CACHE``     ``$XDG_CACHE_HOME/obmm-testbed``, else
                                                   ``~/.cache/obmm-testbed``
``results_dir()``      ``$OBMM_TESTBED_RESULTS``   ``<root>/results``
``run_root()``         ``$OBMM_TESTBED_RUN_ROOT``  ``/dev/shm`` (per-cluster run dirs, on tmpfs)
=====================  ==========================  =============================================

Every function reads the environment when called, so a test can point one at a temporary
directory with ``monkeypatch.setenv``.  No other module reads these variables.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_ROOT = "OBMM_TESTBED_ROOT"
ENV_CACHE = "OBMM_TESTBED_CACHE"
ENV_RESULTS = "OBMM_TESTBED_RESULTS"
ENV_RUN_ROOT = "OBMM_TESTBED_RUN_ROOT"
DEFAULT_RUN_ROOT = "/dev/shm"


def repo_root() -> Path:
    """The source tree: recipes in qemu/, module sources in kmod/, tests in tests/."""
    override = os.environ.get(ENV_ROOT)
    if override:
        return Path(override)
    # pylib/obmm/testbed/paths.py -> the checkout
    return Path(__file__).resolve().parents[3]


def qemu_dir() -> Path:
    return repo_root() / "qemu"


def kmod_dir() -> Path:
    return repo_root() / "kmod"


def cache_dir() -> Path:
    """Images, kernel headers, apt lists, console logs, checkpatch: kept between runs."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "obmm-testbed"


def results_dir() -> Path:
    """Built modules, junit files and other outputs of one run (CI uploads it)."""
    return Path(os.environ.get(ENV_RESULTS) or str(repo_root() / "results"))


def run_root() -> Path:
    """Parent of the per-cluster run dirs (RAM files, sockets): tmpfs, so RAM stays RAM."""
    return Path(os.environ.get(ENV_RUN_ROOT) or DEFAULT_RUN_ROOT)
