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
``ub_upstream_dir()``  ``$OBMM_UB_UPSTREAM``       None: an upstream UB driver tree is an
                                                   input given by path only (what needs it
                                                   skips, saying so in one line)
``libobmm_source_dir()`` ``$OBMM_LIBOBMM_SOURCE``  None (the libobmm source tree, likewise)
=====================  ==========================  =============================================

A step skipped for lack of such an input says so in one line (:func:`input_skip_line`) and
appends it to ``skipped_inputs_file()``; ``make test`` ends by listing that file.

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

#: How a user gives each upstream input (the commits the project was checked against are facts in
#: kmod/patches/urma-seg-mapped/BASE and docs/obmm-driver.md, never places to look).
UB_UPSTREAM_HINT = (
    f"set {envvars.UB_UPSTREAM.name}=/path/to/ub-os-component-dkms or an OLK checkout"
)
LIBOBMM_HINT = f"set {envvars.LIBOBMM_SOURCE.name}=/path/to/libobmm"
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


def ub_upstream_dir() -> Path | None:
    """The upstream UB driver tree builds and checks use (ubcore, uburma, obmm): an input given
    by path (``$OBMM_UB_UPSTREAM``), never part of the project; None when not given.  The path
    is returned even when absent (the caller says so)."""
    return _given(envvars.UB_UPSTREAM.raw())


def libobmm_source_dir() -> Path | None:
    """The libobmm source tree the cluster suite builds (``$OBMM_LIBOBMM_SOURCE``, an input as
    :func:`ub_upstream_dir`); None when not given."""
    return _given(envvars.LIBOBMM_SOURCE.raw())


def _given(value: str | None) -> Path | None:
    return Path(value) if value else None


def skipped_inputs_file() -> Path:
    """One line per step skipped for lack of an input (``make test`` lists it at its end)."""
    return results_dir() / "skipped-inputs.txt"


def input_skip_line(step: str, what: str, given: Path | None, hint: str) -> str:
    """The one line a step says when input `what` is not given (or not at `given`):
    ``<step>: skipped: no <what> (<hint>)``."""
    where = f" at {given}" if given is not None else ""
    return f"{step}: skipped: no {what}{where} ({hint})"


def is_input_skip(reason: str) -> bool:
    """Whether `reason` is a line of :func:`input_skip_line` (a pytest skip reason may be)."""
    return ": skipped: no " in reason and "(set OBMM_" in reason


def ub_upstream_missing(step: str, need: str = "drivers/ub") -> str | None:
    """None when an upstream UB driver tree with `need` in it is given; else `step`'s skip line."""
    tree = ub_upstream_dir()
    if tree is not None and (tree / need).is_dir():
        return None
    return input_skip_line(step, "upstream UB driver tree", tree, UB_UPSTREAM_HINT)


def libobmm_missing(step: str) -> str | None:
    """None when a libobmm source tree is given; else `step`'s skip line."""
    tree = libobmm_source_dir()
    if tree is not None and (tree / "libobmm.c").is_file():
        return None
    return input_skip_line(step, "libobmm source tree", tree, LIBOBMM_HINT)


def note_input_skip(line: str, file: Path | None = None) -> str:
    """Append `line` to `file` (default :func:`skipped_inputs_file`) and return it.  Best
    effort: a results directory that cannot be written loses the list, not the run."""
    try:
        path = skipped_inputs_file() if file is None else file
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line.rstrip("\n") + "\n")
    except OSError:
        pass
    return line
