"""KUnit for a guest kernel built without it: kunit.ko out of tree, and kunit_run.ko.

Debian's 6.1 kernel has ``# CONFIG_KUNIT is not set``, so a module with KUnit suites neither
links (no ``kunit_*`` exports) nor runs them.  This module builds what the guests lack from the
kernel's own source, against the production guest headers, in about ten seconds:

* ``kunit.ko``: ``lib/kunit/`` of Debian's ``linux-source-<x.y>`` at the version of the
  guest's headers package (``apt-get download``, the .deb shared with the debug kernel's
  downloads; the directory extracted once into ``<cache>/kunit/<version>/``), built with that
  directory's own Makefile and ``CONFIG_KUNIT=m`` given to make only.  The C macro stays
  undefined, so every structure keeps the running kernel's layout; two places of ``test.c``
  use the members such a kernel lacks and are adapted in the build copy (:data:`ADAPTATIONS`,
  each required to match exactly as often as expected, so a new Debian version that changes
  them stops the build with a line saying so).  Debian's code: warnings reported, not fatal.
* ``kunit_run.ko`` (``kmod/kunit_compat/kunit_run``, ours): runs the suites of a loaded module
  given the address and size of its ``.kunit_test_suites`` section, which the 6.1 loader only
  collects with CONFIG_KUNIT set.  W=1, warnings fatal.  So is ``kunit_selftest.ko`` on request:
  suites that pass, fail and skip, for the testbed's own test of the whole path.

CLI for debugging: ``python -m obmm.testbed.builds.kunitbuild [--release R] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.builds import debugkernel, kbuild, kheaders
from obmm.testbed.builds.filelock import locked
from obmm.testbed.errors import TestbedError
from obmm.testbed.progress import Progress

log = logging.getLogger(__name__)

#: Where the harness's sources live, under kmod/ (no Kbuild at its top: not a guest module).
COMPAT_DIR = "kunit_compat"
RUNNER = "kunit_run"
SELFTEST = "kunit_selftest"  # suites with known results, for tests/testbed
SOURCE_DIR = "lib/kunit"
_MANIFEST = "manifest.json"


class KunitBuildError(TestbedError, RuntimeError):
    """kunit.ko or kunit_run.ko could not be fetched, adapted or built."""


@dataclass(frozen=True)
class Adaptation:
    """One edit of a lib/kunit file for a kernel whose structures lack the KUnit members."""

    file: str
    why: str
    pattern: str  # a regular expression (multiline)
    replacement: str
    count: int  # how many matches the pinned Debian version has


ADAPTATIONS = (
    Adaptation(
        "test.c",
        "task_struct has no kunit_test member without CONFIG_KUNIT; it only feeds "
        "kunit_fail_current_test(), which a modular KUnit does not provide anyway",
        r"^[ \t]*current->kunit_test = [^;\n]+;\n",
        "",
        2,
    ),
    Adaptation(
        "test.c",
        "struct module has no kunit_suites without CONFIG_KUNIT: no module notifier; "
        "kunit_run.ko runs a module's suites",
        r"^#ifdef CONFIG_MODULES$",
        "#if 0 /* obmm-testbed: no kunit_suites in struct module; see kunit_run.ko */",
        3,
    ),
)


@dataclass(frozen=True)
class KunitModules:
    kunit: Path  # kunit.ko
    runner: Path  # kunit_run.ko
    symvers: Path  # Module.symvers of both, for the test modules' builds
    source: str  # "linux-source-6.1 6.1.192-3"
    warnings: tuple[str, ...]  # Debian's lib/kunit warnings (W=1)
    selftest: Path | None = None  # kunit_selftest.ko, when asked for


def source_package(release: str) -> str:
    """``linux-source-6.1`` for ``6.1.0-57-amd64``."""
    m = re.match(r"^(\d+)\.(\d+)", release)
    if not m:
        raise KunitBuildError(f"cannot tell the kernel version of release {release!r}")
    return f"linux-source-{m.group(1)}.{m.group(2)}"


def kunit_sources(release: str, version: str, progress: Progress) -> Path:
    """``lib/kunit`` of ``linux-source-<x.y>=version``, extracted once into the cache."""
    package = source_package(release)
    if package != debugkernel.SOURCE_PACKAGE:
        raise KunitBuildError(
            f"KUnit out of tree is made for {debugkernel.SOURCE_PACKAGE} guests; "
            f"kernel {release} would need {package}"
        )
    root = paths.cache_dir() / "kunit" / version
    dest = root / SOURCE_DIR
    with locked(root.parent / ".lock"):
        if (root / _MANIFEST).is_file() and dest.is_dir():
            return dest
        deb = debugkernel.download_source(version, progress)
        progress.line(f"extracting {SOURCE_DIR} from {deb.name} (once per version)")
        with tempfile.TemporaryDirectory(prefix=".kunit-", dir=root.parent) as tmp:
            tarball = f"./usr/src/{package}.tar.xz"
            _check(
                ["sh", "-c", 'dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" "$3"', "sh",
                 str(deb), tmp, tarball],
                f"unpack {deb.name}",
            )  # fmt: skip
            _check(
                ["tar", "-xJf", str(Path(tmp) / tarball), "-C", tmp, f"{package}/{SOURCE_DIR}"],
                f"extract {SOURCE_DIR} from {tarball}",
            )
            if root.exists():
                shutil.rmtree(root)
            dest.parent.mkdir(parents=True)
            (Path(tmp) / package / SOURCE_DIR).rename(dest)
        (root / _MANIFEST).write_text(json.dumps({"package": package, "version": version}) + "\n")
    return dest


def _check(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise KunitBuildError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def adapt(directory: Path, origin: str) -> None:
    """Apply :data:`ADAPTATIONS` to the copy in `directory`; `origin` names it in errors."""
    for a in ADAPTATIONS:
        path = directory / a.file
        text, n = re.subn(a.pattern, a.replacement, path.read_text(), flags=re.M)
        if n != a.count:
            raise KunitBuildError(
                f"{origin} {SOURCE_DIR}/{a.file}: {a.pattern!r} matched {n} times, not "
                f"{a.count}: the source changed; check obmm.testbed.builds.kunitbuild.ADAPTATIONS "
                f"({a.why})"
            )
        path.write_text(text)


def kernel_has_kunit(headers: Path) -> bool:
    config = (headers / ".config").read_text(errors="replace")
    return re.search(r"^CONFIG_KUNIT=[ym]$", config, re.M) is not None


def _ours(headers: Path, name: str, work: Path, symvers: Path) -> Path:
    """kmod/kunit_compat/<name> built in `work` against `symvers`, W=1, no warning allowed."""
    directory = work / name
    shutil.copytree(paths.kmod_dir() / COMPAT_DIR / name, directory)
    output = kbuild.make_modules(
        headers, directory, what=f"{name}.ko", make_vars={"KBUILD_EXTRA_SYMBOLS": str(symvers)}
    )
    warnings = kbuild.find_warnings(output)
    if warnings:
        raise kbuild.BuildWarningsError(f"{name}.ko", warnings, output)
    return directory / f"{name}.ko"


def build(
    headers: Path, release: str, out: Path, progress: Progress, *, selftest: bool = False
) -> KunitModules:
    """kunit.ko and kunit_run.ko (and kunit_selftest.ko) for the kernel whose headers are
    `headers`, into `out`."""
    if kernel_has_kunit(headers):
        raise KunitBuildError(
            f"kernel {release} has CONFIG_KUNIT: its own kunit.ko runs module suites; "
            "the out-of-tree KUnit is for kernels without it"
        )
    version = kheaders.headers_version(release)
    package = source_package(release)
    sources = kunit_sources(release, version, progress)
    work = out / "kunit-build"
    if work.exists():
        shutil.rmtree(work)
    kunit_dir = work / "kunit"
    shutil.copytree(sources, kunit_dir)
    adapt(kunit_dir, f"{package} {version}")
    output = kbuild.make_modules(
        headers, kunit_dir, what="kunit.ko", make_vars={"CONFIG_KUNIT": "m"}
    )
    warnings = tuple(kbuild.find_warnings(output))
    kunit_symvers = kunit_dir / "Module.symvers"
    runner = _ours(headers, RUNNER, work, kunit_symvers)
    extra = _ours(headers, SELFTEST, work, kunit_symvers) if selftest else None
    symvers = work / "Module.symvers"
    symvers.write_text(kunit_symvers.read_text() + (runner.parent / "Module.symvers").read_text())
    return KunitModules(
        kunit_dir / "kunit.ko", runner, symvers, f"{package} {version}", warnings, extra
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m obmm.testbed.builds.kunitbuild")
    parser.add_argument("--release", help="kernel release (default: the guests')")
    parser.add_argument("--out", type=Path, default=None, help="default results/kunit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    progress = Progress("kunit")
    try:
        release = args.release or kheaders.debian_kernel_release()
        headers = kheaders.fetch_headers(release)
        mods = build(headers, release, args.out or paths.results_dir() / "kunit", progress)
    except TestbedError as exc:
        print(f"kunitbuild: {exc}", file=sys.stderr)
        return 1
    for w in mods.warnings:
        print(f"warning ({mods.source}): {w}")
    print(f"{mods.kunit}\n{mods.runner}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
