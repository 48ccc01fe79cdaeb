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
``guest_kernel()``     ``$OBMM_TESTBED_KERNEL``    ``debian`` (the image's own kernel); ``debug``:
                                                   the debug kernel (obmm.testbed.debugkernel)
``timeout_scale()``    ``$OBMM_TESTBED_TIMEOUT_    ``1``: the factor on the harness's boot and
                       SCALE``                     per-test timeouts (slower debug kernels)
``upstream_dir()``     ``$OBMM_UPSTREAM_DIR``      the pinned upstream UB driver tree
                                                   (``shared/upstream/ub-os-component-dkms-
                                                   65ba333`` beside the checkout or one of its
                                                   parents); a user's OLK checkout otherwise
=====================  ==========================  =============================================

Installed from the wheel (``make dist``), the package carries what a checkout has beside it:
``obmm/_data/`` holds ``kmod/`` (sources), ``qemu/`` (recipes, topologies), ``uapi/``, the guest
suite and ``examples/c`` in the checkout's layout (setup.py copies them in), so the root is that
directory and nothing is written there: cache and results go to the user's directories.

Every function reads the environment when called, so a test can point one at a temporary
directory with ``monkeypatch.setenv``.  No other module reads these variables.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

ENV_ROOT = "OBMM_TESTBED_ROOT"
ENV_CACHE = "OBMM_TESTBED_CACHE"
ENV_RESULTS = "OBMM_TESTBED_RESULTS"
ENV_RUN_ROOT = "OBMM_TESTBED_RUN_ROOT"
ENV_KERNEL = "OBMM_TESTBED_KERNEL"
KERNEL_DEBIAN = "debian"
KERNEL_DEBUG = "debug"
ENV_TIMEOUT_SCALE = "OBMM_TESTBED_TIMEOUT_SCALE"
ENV_UPSTREAM = "OBMM_UPSTREAM_DIR"
#: The pinned copy of upstream's UB driver tree (GPL-2.0, an input never copied into the project).
UPSTREAM_PINNED = Path("shared/upstream/ub-os-component-dkms-65ba333")
DEFAULT_RUN_ROOT = "/dev/shm"
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
    override = os.environ.get(ENV_ROOT)
    if override:
        return Path(override)
    return checkout_root() or data_root()


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
    override = os.environ.get(ENV_RESULTS)
    if override:
        return Path(override)
    if os.environ.get(ENV_ROOT) or checkout_root() is not None:
        return repo_root() / "results"
    # Installed: never into site-packages.
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "obmm-testbed" / "results"


def run_root() -> Path:
    """Parent of the per-cluster run dirs (RAM files, sockets): tmpfs, so RAM stays RAM."""
    return Path(os.environ.get(ENV_RUN_ROOT) or DEFAULT_RUN_ROOT)


def guest_kernel() -> str:
    """Which kernel the guests boot: the image's (``debian``) or the debug build (``debug``)."""
    return os.environ.get(ENV_KERNEL) or KERNEL_DEBIAN


def timeout_scale() -> float:
    """The factor on the harness's boot and per-test timeouts (>= 1; a KASAN guest is slower)."""
    raw = os.environ.get(ENV_TIMEOUT_SCALE) or "1"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT_SCALE}={raw!r} is not a number") from None
    return max(1.0, value)


def upstream_dir() -> Path:
    """The upstream UB driver tree the real driver is built from (it may not exist: callers
    say so in one line and skip)."""
    override = os.environ.get(ENV_UPSTREAM)
    if override:
        return Path(override)
    root = repo_root().resolve()
    for parent in root.parents:
        if (parent / UPSTREAM_PINNED).is_dir():
            return parent / UPSTREAM_PINNED
    return root.parent / UPSTREAM_PINNED
