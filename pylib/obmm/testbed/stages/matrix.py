"""Kernel build matrix: every module under ``kmod/`` against several Debian kernels.

Cells (``CELLS``):

* ``debian12-amd64``: Debian 12 (bookworm) amd64, the QEMU guests' kernel;
* ``debian13-amd64``: Debian 13 (trixie) amd64;
* ``debian12-arm64``: Debian 12 arm64, cross-compiled with ``aarch64-linux-gnu-gcc`` (real UB
  hosts are arm64).

Each cell resolves the kernel release that ``linux-image-<arch>`` of its suite depends on, fetches
that kernel's headers with :mod:`obmm.testbed.builds.kbuild` (``apt-get download``, unpacked into
``~/.cache/obmm-testbed/kheaders/<release>/``, never over the host's ``/usr/src``), builds every
module with ``W=1`` (any warning fails the cell) and runs the ELF pre-flight
(:mod:`obmm.testbed.builds.elfcheck`) on each ``.ko``.
Cells other than the host's own suite/arch read a
private apt configuration under ``~/.cache/obmm-testbed/apt/<suite>-<arch>/`` (own
``sources.list``, lists, archives and an empty dpkg status), refreshed with ``apt-get update``
when older than a day; the host's apt configuration is never modified.  Only the Debian mirror
(``$OBMM_DEBIAN_MIRROR``, default ``http://deb.debian.org/debian``) and its security archive are
contacted.

CLI: ``python -m obmm.testbed.stages.matrix [--cell NAME ...] [--out DIR] [--json FILE]``;
exit status 1 if any cell fails, with one ``PASS``/``FAIL`` line per cell and the reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.builds import aptlists, kbuild, kheaders

log = logging.getLogger(__name__)

# The private apt lists of a cell moved to builds/aptlists; their names stay here.
DEFAULT_MIRROR = aptlists.DEFAULT_MIRROR
DEFAULT_SECURITY_MIRROR = aptlists.DEFAULT_SECURITY_MIRROR
KEYRING = aptlists.KEYRING
STAMP = aptlists.STAMP
sources_list = aptlists.sources_list
apt_conf = aptlists.apt_conf


@dataclass(frozen=True)
class Cell:
    """One kernel of the matrix."""

    name: str
    suite: str
    arch: str  # Debian arch of the kernel
    kernel_arch: str  # ARCH= for make
    cross_compile: str = ""  # CROSS_COMPILE= prefix ("" = native)
    description: str = ""
    #: CC= when the kernel's own compiler cannot run here (Debian 13 is built with gcc-14,
    #: which bookworm does not have); ``config_off`` names Kconfig options switched off on
    #: make's command line: compiler features that compiler lacks (kbuild then picks the
    #: fallback flags) and BTF for modules (needs pahole and a vmlinux; not a build check).
    cc: str = ""
    config_off: tuple[str, ...] = ()

    @property
    def make_vars(self) -> dict[str, str]:
        mv: dict[str, str] = {}
        if self.cross_compile:
            mv.update(ARCH=self.kernel_arch, CROSS_COMPILE=self.cross_compile)
        if self.cc:
            mv["CC"] = self.cc
        mv.update({name: "" for name in self.config_off})
        return mv


CELLS: tuple[Cell, ...] = (
    Cell("debian12-amd64", "bookworm", "amd64", "x86", description="Debian 12, the QEMU guests"),
    Cell(
        "debian13-amd64",
        "trixie",
        "amd64",
        "x86",
        description="Debian 13 (kernel built by gcc-14; built here with gcc-12)",
        cc="gcc-12",
        config_off=("CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT", "CONFIG_DEBUG_INFO_BTF_MODULES"),
    ),
    Cell(
        "debian12-arm64",
        "bookworm",
        "arm64",
        "arm64",
        cross_compile="aarch64-linux-gnu-",
        description="Debian 12 arm64, cross-compiled (UB hosts are arm64)",
    ),
)


class MatrixError(kbuild.KbuildError):
    """A matrix cell could not be set up (apt, compiler, unknown cell)."""


@dataclass
class CellResult:
    cell: str
    ok: bool
    release: str = ""
    modules: list[str] = field(default_factory=list)
    error: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        took = ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())
        if self.ok:
            return f"PASS {self.cell}: {self.release}: {', '.join(self.modules)} ({took})"
        first = self.error.strip().splitlines()[0] if self.error.strip() else "failed"
        return f"FAIL {self.cell}: {self.release or '?'}: {first} ({took})"


def cell_by_name(name: str) -> Cell:
    for cell in CELLS:
        if cell.name == name:
            return cell
    known = ", ".join(c.name for c in CELLS)
    raise MatrixError(f"unknown matrix cell {name!r}; known: {known}")


def apt_root(cell: Cell, cache: Path | None = None) -> Path:
    return aptlists.apt_root(cell.suite, cell.arch, cache)


def private_apt_config(
    cell: Cell,
    *,
    cache: Path | None = None,
    mirror: str | None = None,
    security: str | None = None,
    max_age: float = aptlists.LISTS_MAX_AGE_S,
    native: str | None = None,
) -> Path:
    """The cell's private apt tree (:func:`obmm.testbed.builds.aptlists.apt_config`)."""
    try:
        return aptlists.apt_config(
            cell.suite,
            cell.arch,
            what=cell.name,
            cache=cache,
            mirror=mirror,
            security=security,
            max_age=max_age,
            native=native,
        )
    except kbuild.KbuildError as exc:
        raise MatrixError(str(exc)) from exc


def require_compiler(cell: Cell) -> None:
    cc = cell.cc or f"{cell.cross_compile}gcc"
    if shutil.which(cc) is None:
        pkg = "gcc-aarch64-linux-gnu" if cell.cross_compile.startswith("aarch64") else "gcc"
        raise MatrixError(f"{cell.name}: compiler {cc} not found (apt-get install {pkg})")


#: Runtime libraries a newer suite's kbuild tools (modpost, objtool) load.
TOOL_RUNTIME_PACKAGES = ("libc6", "libelf1t64", "zlib1g", "libzstd1")
SHIM_SUFFIX = ".newer-glibc"
RUNTIME_DIR = ".tool-runtime"


def host_glibc() -> tuple[int, int]:
    text = os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0"
    major, minor = text.split()[-1].split(".")[:2]
    return int(major), int(minor)


def needed_glibc(path: Path) -> tuple[int, int] | None:
    """The newest GLIBC_2.x symbol version an ELF file needs (None if not ELF or none)."""
    with path.open("rb") as fh:
        if fh.read(4) != b"\x7fELF":
            return None
    proc = subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True)
    found = [tuple(int(x) for x in m.split(".")[:2]) for m in _GLIBC_RE.findall(proc.stdout)]
    return max(found) if found else None  # type: ignore[return-value]


_GLIBC_RE = re.compile(r"GLIBC_(\d+\.\d+)")


def shim_newer_glibc_tools(root: Path, conf: Path | None, *, name: str) -> list[Path]:
    """Make kbuild tools linked against a newer glibc than the host's runnable.

    Debian 13's ``modpost`` and ``objtool`` need glibc 2.38; bookworm has 2.36.  The suite's own
    ``libc6`` (and the libraries the tools load) is unpacked into ``<root>/.tool-runtime`` and
    each such tool is replaced by a two-line wrapper that runs it under that runtime's dynamic
    loader.  Idempotent; returns the tools wrapped by this call.
    """
    host = host_glibc()
    needy = []
    for path in sorted((root / "usr" / "lib").rglob("*")):
        if RUNTIME_DIR in path.parts or path.is_symlink() or not path.is_file():
            continue
        if path.name.endswith(SHIM_SUFFIX) or not os.access(path, os.X_OK):
            continue
        need = needed_glibc(path)
        if need is not None and need > host:
            needy.append(path)
    if not needy:
        return []
    runtime = root / RUNTIME_DIR
    if not (runtime / ".complete").is_file():
        if conf is None:
            raise MatrixError(f"{name}: tools need glibc > {host}, and no suite apt config")
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            argv = ["apt-get", "download", "-q"]
            if os.geteuid() == 0:
                argv += ["-o", "APT::Sandbox::User=root"]
            env = {**os.environ, "APT_CONFIG": str(conf)}
            proc = subprocess.run(
                [*argv, *TOOL_RUNTIME_PACKAGES], cwd=tmp, env=env, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise MatrixError(
                    f"{name}: cannot download the tools' runtime {TOOL_RUNTIME_PACKAGES}: "
                    + proc.stderr.strip()[-500:]
                )
            if runtime.exists():
                shutil.rmtree(runtime)
            for deb in sorted(Path(tmp).glob("*.deb")):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(runtime)], check=True)
        (runtime / ".complete").touch()
    loaders = sorted(p for p in runtime.rglob("ld-linux*.so.*") if p.is_file())
    if not loaders:
        raise MatrixError(f"{name}: no dynamic loader in {runtime}")
    libdirs = sorted({str(p.parent) for p in runtime.rglob("*.so.*")})
    for path in needy:
        real = path.with_name(path.name + SHIM_SUFFIX)
        path.rename(real)
        path.write_text(
            "#!/bin/sh\n# obmm matrix: run under the suite's own glibc (host's is older)\n"
            f'exec "{loaders[0]}" --library-path "{":".join(libdirs)}" "{real}" "$@"\n'
        )
        path.chmod(0o755)
    log.info("%s: %d tool(s) run under the suite's glibc", name, len(needy))
    return needy


def uses_host_lists(cell: Cell, native: str | None = None) -> bool:
    """The cell the host's own apt lists serve (the guests' kernel): no private config."""
    return cell.suite == kheaders.DEFAULT_SUITE and cell.arch == (native or kheaders.host_arch())


def run_cell(
    cell: Cell,
    *,
    kmod_dir: Path,
    out: Path,
    cache: Path | None = None,
    modules: Sequence[str] | None = None,
) -> CellResult:
    """Build every module against the cell's kernel; never raises for a failing build."""
    from obmm.testbed.builds import elfcheck

    result = CellResult(cell.name, ok=False)
    t = time.monotonic()
    try:
        require_compiler(cell)
        conf = None if uses_host_lists(cell) else private_apt_config(cell, cache=cache)
        result.seconds["apt"] = time.monotonic() - t
        t = time.monotonic()
        release = kheaders.debian_kernel_release(cell.arch, cell.suite, apt_config=conf)
        result.release = release
        headers = kheaders.fetch_headers(
            release,
            cell.arch,
            (cache / "kheaders") if cache else None,
            suite=cell.suite,
            apt_config=conf,
        )
        shim_newer_glibc_tools(headers.parents[2], conf, name=cell.name)
        result.seconds["headers"] = time.monotonic() - t
        t = time.monotonic()
        kos = kbuild.build_modules(
            headers,
            kmod_dir,
            out / cell.name,
            build_dir=out / cell.name / ".build",
            modules=modules,
            make_vars=cell.make_vars,
        )
        result.seconds["build"] = time.monotonic() - t
        symvers = elfcheck.Symvers.load(headers / "Module.symvers")
        exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
        problems = []
        for ko in kos:
            for problem in elfcheck.check_module(
                ko,
                kernel_release=release,
                arch=cell.arch,
                symvers_path=symvers,
                extra_exports=exports,
            ):
                problems.append(f"{ko.name}: {problem}")
        if problems:
            raise MatrixError("ELF pre-flight failed:\n" + "\n".join(problems))
        result.modules = [ko.name for ko in kos]
        result.ok = True
    except kbuild.KbuildError as exc:
        result.error = str(exc)
    return result


DESCRIPTION = "Build kmod/* W=1 against each kernel of the matrix; one line per cell."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `obmm-testbed kmod-matrix` (and of
    ``python -m obmm.testbed.stages.matrix``)."""
    parser.add_argument(
        "--cell",
        action="append",
        dest="cells",
        metavar="NAME",
        help="run only this cell (repeatable): " + ", ".join(c.name for c in CELLS),
    )
    parser.add_argument("--module", action="append", dest="modules", help="only this module dir")
    parser.add_argument("--kmod", type=Path, default=paths.kmod_dir(), help="module sources")
    parser.add_argument(
        "--out", type=Path, default=paths.results_dir() / "kmod-matrix", help="build output"
    )
    parser.add_argument("--cache", type=Path, help="cache root (default ~/.cache/obmm-testbed)")
    parser.add_argument("--json", type=Path, help="write the per-cell results here")
    parser.add_argument("--list", action="store_true", help="print the cells and exit")


def command(args: argparse.Namespace) -> int:
    """Every selected cell, one line each; 1 if a cell failed.  An unknown cell is a
    MatrixError (nothing is built)."""
    if args.list:
        for cell in CELLS:
            print(f"{cell.name}: {cell.suite} {cell.arch} ({cell.description})")
        return 0
    cells = [cell_by_name(n) for n in args.cells] if args.cells else list(CELLS)
    results = []
    for cell in cells:
        print(f"matrix: {cell.name}: building ...", flush=True)
        res = run_cell(
            cell, kmod_dir=args.kmod, out=args.out, cache=args.cache, modules=args.modules
        )
        results.append(res)
        print(res.line(), flush=True)
        if not res.ok:
            print(res.error, file=sys.stderr, flush=True)
    failed = [r.cell for r in results if not r.ok]
    print(
        f"matrix: {len(results) - len(failed)}/{len(results)} cell(s) passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m obmm.testbed.stages.matrix", description=DESCRIPTION
    )
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="matrix: %(message)s"
    )
    try:
        return command(args)
    except MatrixError as exc:
        print(f"matrix: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
