"""ubcore.ko and uburma.ko from an upstream UB tree, built out of tree against the guest kernel.

The tree (a scratch copy with the URMA_SEG_MAPPED series applied,
:mod:`obmm.testbed.stages.patchcheck`) is built the way its own top-level Makefile builds it
(kunpengcompute/ub-os-component-dkms: ``-I<tree>/include``, ``CONFIG_UB_URMA=m`` given to make and
``-DCONFIG_UB_URMA_MODULE=1``), one directory at a time (``drivers/ub/urma/ubcore``, then ``uburma``
against ubcore's Module.symvers), with ``CONFIG_UB_URMA_SEG_MAP_KUNIT_TEST=y`` so the series' KUnit
suite is linked into ubcore against kunit.ko (:mod:`obmm.testbed.builds.kunitbuild`), and ``W=1``.

The tree is written for OLK-6.6.  On an older guest kernel (Debian 6.1) it also gets:

* ``kmod/urma_compat/urma_compat.h``, force-included: the 6.2/6.3 interfaces it uses;
* ``-Wno-error=incompatible-pointer-types``: 6.2 made ``struct class``'s ``devnode`` and
  ``namespace`` callbacks take a ``const struct device *``; ubcore and uburma define theirs
  that way, which 6.1 calls through the non-const type: the same code, so a warning, not an
  error (and counted with upstream's).

Every warning is sorted by where it points (:func:`classify`): a line the series added
(:data:`SERIES`, fatal: the series' code is W=1 clean), our compat header (:data:`COMPAT`,
fatal), anything else (:data:`UPSTREAM`: the tree's own, reported and counted, not fatal).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.builds import kbuild
from obmm.testbed.errors import TestbedError

MODULES = ("ubcore", "uburma")
MODULE_DIR = "drivers/ub/urma"
COMPAT_HEADER = Path("urma_compat") / "urma_compat.h"  # under kmod/
#: The interfaces the compat header stands in for came with these kernels; the tree targets 6.6.
TARGET_VERSION = (6, 6)
SERIES = "series"
COMPAT = "compat"
UPSTREAM = "upstream"

_GCC_WARNING = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? warning: (?P<msg>.*?)"
    r"(?: \[(?P<flag>-W[^\]]+)\])?$"
)


class UrmaBuildError(TestbedError, RuntimeError):
    """ubcore or uburma did not build, or the series' or our code warned."""


@dataclass(frozen=True)
class BuildWarning:
    module: str
    origin: str  # SERIES, COMPAT or UPSTREAM
    file: str  # relative to the tree (or kmod/... for ours); "" for modpost and friends
    line: int
    flag: str  # "-Wmissing-prototypes", or "" when gcc names none
    text: str  # the whole warning line

    @property
    def message(self) -> str:
        """What gcc said, without the place."""
        m = _GCC_WARNING.match(self.text)
        if not m:
            return self.text
        return f"warning: {m.group('msg')}" + (f" [{self.flag}]" if self.flag else "")

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else self.text


@dataclass(frozen=True)
class UrmaModules:
    kos: dict[str, Path]  # module name -> .ko (with debug info)
    warnings: tuple[BuildWarning, ...]
    log: Path

    def count(self, origin: str, module: str | None = None) -> int:
        return sum(1 for w in self.warnings if w.origin == origin and module in (None, w.module))

    def by_flag(self, origin: str, module: str | None = None) -> dict[str, int]:
        """{gcc flag: count} of one origin's warnings, most frequent first."""
        return dict(
            Counter(
                w.flag or "other"
                for w in self.warnings
                if w.origin == origin and module in (None, w.module)
            ).most_common()
        )


def kernel_version(release: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", release)
    if not m:
        raise UrmaBuildError(f"cannot tell the kernel version of release {release!r}")
    return int(m.group(1)), int(m.group(2))


def compat_flags(release: str) -> list[str]:
    """What the tree needs on top of its own flags on kernel `release` (none on 6.6+)."""
    if kernel_version(release) >= TARGET_VERSION:
        return []
    header = paths.kmod_dir() / COMPAT_HEADER
    return ["-include", str(header), "-Wno-error=incompatible-pointer-types"]


def classify(
    output: str,
    module: str,
    tree: Path,
    series_lines: Mapping[str, set[int]],
    ours: Iterable[Path] = (),
) -> list[BuildWarning]:
    """The warnings of one module's build log, each with its origin."""
    roots = [Path(p).resolve() for p in ours]
    tree = tree.resolve()
    found: list[BuildWarning] = []
    for line in kbuild.find_warnings(output):
        m = _GCC_WARNING.match(line.strip())
        if not m:
            found.append(BuildWarning(module, UPSTREAM, "", 0, "", line.strip()))
            continue
        path = Path(m.group("file"))
        if not path.is_absolute():
            path = tree / MODULE_DIR / module / path
        resolved = path.resolve()
        number, flag = int(m.group("line")), m.group("flag") or ""
        if not flag and "kernel-doc" in m.group("msg"):
            flag = "kernel-doc"  # W=1 runs scripts/kernel-doc on every .c file
        if any(resolved.is_relative_to(r) for r in roots):
            rel = resolved.relative_to(paths.kmod_dir().resolve().parent)
            found.append(BuildWarning(module, COMPAT, str(rel), number, flag, line.strip()))
            continue
        rel_text = str(resolved.relative_to(tree)) if resolved.is_relative_to(tree) else str(path)
        origin = SERIES if number in series_lines.get(rel_text, ()) else UPSTREAM
        found.append(BuildWarning(module, origin, rel_text, number, flag, line.strip()))
    return found


def build(
    tree: Path,
    headers: Path,
    release: str,
    kunit_symvers: Path,
    series_lines: Mapping[str, set[int]],
    out: Path,
) -> UrmaModules:
    """Build ubcore then uburma in `tree` (which the build writes into); .ko files and the
    whole log into `out`.  Raises UrmaBuildError for a failed make or a warning in the series'
    lines or our compat header; upstream's warnings are in the result."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    include = tree / "include"
    cflags = [f"-I{include}", "-DCONFIG_UB_URMA_MODULE=1", "-DCONFIG_UB_URMA_SEG_MAP_KUNIT_TEST=1"]
    cflags += compat_flags(release)
    ours = [paths.kmod_dir() / COMPAT_HEADER.parent]
    symvers = [kunit_symvers]
    kos: dict[str, Path] = {}
    warnings: list[BuildWarning] = []
    with log.open("w") as fh:
        for module in MODULES:
            directory = tree / MODULE_DIR / module
            make_vars = {
                "CONFIG_UB_URMA": "m",
                "CONFIG_UB_URMA_SEG_MAP_KUNIT_TEST": "y",
                "KBUILD_EXTRA_SYMBOLS": " ".join(str(s) for s in symvers),
                "EXTRA_CFLAGS": " ".join(cflags),
            }
            try:
                output = kbuild.make_modules(headers, directory, what=module, make_vars=make_vars)
            except kbuild.KbuildError as exc:
                fh.write(str(exc) + "\n")
                errors = [ln.strip() for ln in str(exc).splitlines() if " error: " in ln]
                raise UrmaBuildError(
                    f"{module}.ko did not build: {' | '.join(errors[:3]) or exc.summary}; "
                    f"log {log}\n{exc}"
                ) from exc
            fh.write(f"== {module}\n{output}\n")
            warnings += classify(output, module, tree, series_lines, ours)
            ko = directory / f"{module}.ko"
            if not ko.is_file():
                raise UrmaBuildError(f"{module}: make succeeded but made no {ko.name}; log {log}")
            kos[module] = Path(shutil.copy2(ko, out / ko.name))
            symvers.append(directory / "Module.symvers")
    bad = [w for w in warnings if w.origin != UPSTREAM]
    if bad:
        named = "; ".join(f"{w.where()}: {w.message}" for w in bad[:3])
        raise UrmaBuildError(
            f"{len(bad)} warning(s) in the series' lines or our compat header (W=1): {named}"
            f"{'; ...' if len(bad) > 3 else ''} (log {log})\n" + "\n".join(w.text for w in bad)
        )
    return UrmaModules(kos, tuple(warnings), log)


def stripped(kos: Sequence[Path], dest: Path) -> list[Path]:
    """Copies of `kos` without debug info (what the guest loads: a tenth of the size)."""
    dest.mkdir(parents=True, exist_ok=True)
    copies = []
    for ko in kos:
        copy = dest / ko.name
        subprocess.run(
            ["strip", "--strip-debug", "-o", str(copy), str(ko)], check=True, capture_output=True
        )
        copies.append(copy)
    return copies
