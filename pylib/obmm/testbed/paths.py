"""Where the testbed finds its sources and puts what it makes: one function and one variable each.

=====================  ==========================  =============================================
function               environment variable        default
=====================  ==========================  =============================================
``repo_root()``        ``$OBMM_TESTBED_ROOT``      the checkout this package was imported from,
                                                   else the installed package data (below)
``qemu_dir()``         (follows the root)          ``<root>/qemu`` (image recipes, topologies)
``kmod_dir()``         (follows the root)          ``<root>/kmod`` (module sources, patches)
``package_dir()``      (none)                      the ``obmm`` package that is running
``cache_dir()``        ``$OBMM_TESTBED_CACHE``     ``$XDG_CACHE_HOME/obmm-testbed``, else
                                                   ``~/.cache/obmm-testbed``
``results_dir()``      ``$OBMM_TESTBED_RESULTS``   ``<root>/results`` in a checkout, else
                                                   ``$XDG_DATA_HOME/obmm-testbed/results``, else
                                                   ``~/.local/share/obmm-testbed/results``
``run_root()``         ``$OBMM_TESTBED_RUN_ROOT``  ``/dev/shm`` (per-cluster run dirs, on tmpfs)
``ub_upstream_dir()``  ``$OBMM_UB_UPSTREAM``       the pinned upstream UB driver tree, the
                                                   nearest ``shared/upstream/<UB_UPSTREAM_PIN>``
                                                   beside the root or above it (an input: it may
                                                   be absent, and what uses it then skips)
=====================  ==========================  =============================================

Installed from the wheel (``make dist``), the package carries what a checkout has beside it:
``obmm/_data/`` holds ``kmod/`` (sources), ``qemu/`` (recipes, topologies), ``uapi/``, the guest
suite and ``examples/c`` in the checkout's layout (setup.py copies them in), so the root is that
directory and nothing is written there: cache and results go to the user's directories.

Every function reads the environment when called, so a test can point one at a temporary
directory with ``monkeypatch.setenv``.  The variables are defined in :mod:`obmm.envvars`; no
other module reads them.  (The cluster's knobs are :mod:`obmm.testbed.settings`.)
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from obmm import envvars

KERNEL_DEBIAN = "debian"
KERNEL_DEBUG = "debug"
#: The pinned copy of kunpengcompute/ub-os-component-dkms (GPL-2.0), kept outside the project.
UB_UPSTREAM_PIN = "ub-os-component-dkms-65ba333"
DATA_DIR = "_data"  # under the installed package: the checkout's files the testbed needs
#: What a root has: the checkout and the package data alike.
ROOT_MARKERS = ("qemu/topologies", "kmod", "uapi/ub/obmm.h")


def _is_root(path: Path) -> bool:
    return all((path / marker).exists() for marker in ROOT_MARKERS)


def checkout_root() -> Path | None:
    """The checkout this package was imported from, or None when it was installed."""
    # pylib/obmm/testbed/paths.py -> the checkout
    candidate = Path(__file__).resolve().parents[3]
    if (candidate / "pylib" / "obmm").is_dir() and _is_root(candidate):
        return candidate
    return None


def package_dir() -> Path:
    """The running ``obmm`` package (what goes to a guest as ``pylib/obmm``)."""
    return Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The package data of an installed wheel (``obmm/_data``); may not exist in a checkout."""
    return Path(str(resources.files("obmm") / DATA_DIR))


def repo_root() -> Path:
    """The source tree: recipes in qemu/, module sources in kmod/, tests in tests/."""
    override = envvars.ROOT.raw()
    if override:
        return Path(override)
    return checkout_root() or data_root()


def qemu_dir() -> Path:
    return repo_root() / "qemu"


def kmod_dir() -> Path:
    return repo_root() / "kmod"


def cache_dir() -> Path:
    """Images, kernel headers, apt lists, console logs, checkpatch: kept between runs."""
    override = envvars.CACHE.raw()
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "obmm-testbed"


def results_dir() -> Path:
    """Built modules, junit files and other outputs of one run (CI uploads it)."""
    override = envvars.RESULTS.raw()
    if override:
        return Path(override)
    if envvars.ROOT.raw() or checkout_root() is not None:
        return repo_root() / "results"
    # Installed: never into site-packages.
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "obmm-testbed" / "results"


def run_root() -> Path:
    """Parent of the per-cluster run dirs (RAM files, sockets): tmpfs, so RAM stays RAM."""
    return Path(envvars.RUN_ROOT.get())


def ub_upstream_dir() -> Path:
    """The upstream UB driver tree builds and checks use (ubcore, uburma, obmm): an input
    given by path, never part of the project.  Default: the pinned copy in the nearest
    ``shared/upstream/`` beside the root or above it; the path is returned even when absent."""
    override = envvars.UB_UPSTREAM.raw()
    if override:
        return Path(override)
    root = repo_root().resolve()
    for parent in (root, *root.parents):
        candidate = parent / "shared" / "upstream" / UB_UPSTREAM_PIN
        if candidate.is_dir():
            return candidate
    return root.parent / "shared" / "upstream" / UB_UPSTREAM_PIN
