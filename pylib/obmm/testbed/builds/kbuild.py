"""Out-of-tree module builds for the QEMU testbed: every module under ``kmod/`` built with ``W=1``
against the guest kernel's headers (:mod:`obmm.testbed.builds.kheaders`).

Two drivers can be built (``DRIVERS``): ``emu``, the emulated driver of ``kmod/obmm_emu``
(with every other module of ``kmod/``), and ``real``, upstream's ``drivers/ub/obmm`` built from a
tree given by path (:func:`obmm.testbed.paths.ub_upstream_dir`) over the compat layer
``kmod/ub_compat`` (:func:`build_real_driver`), into a directory of its own.  The ``kmod``
command over both: :mod:`obmm.testbed.cli.kmod`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.builds.kheaders import KbuildError as KbuildError  # the builds raise it too

log = logging.getLogger(__name__)

#: gcc, modpost and the linker print these; any one fails a W=1 build.
_WARNING_RE = re.compile(r"\bwarning:", re.IGNORECASE)
#: make's bookkeeping lines, dropped from error output to keep it readable.
_MAKE_CHATTER_RE = re.compile(r"^make(\[\d+\])?: (Entering|Leaving) directory")


class UpstreamMissing(KbuildError):
    """The upstream driver tree is not where the setting points; callers skip in one line."""


class BuildWarningsError(KbuildError):
    """A module built, but the compiler, modpost or linker printed warnings."""

    def __init__(self, module: str, warnings: Sequence[str], output: str) -> None:
        self.module = module
        self.warnings = list(warnings)
        self.output = output
        super().__init__(
            f"{module}: build printed {len(self.warnings)} warning(s) (W=1, warnings are errors):\n"
            + output
        )


def module_dirs(kmod_dir: Path) -> list[Path]:
    """Subdirectories of kmod/ that are modules (have a Kbuild or Makefile)."""
    return sorted(
        d
        for d in kmod_dir.iterdir()
        if d.is_dir() and ((d / "Kbuild").is_file() or (d / "Makefile").is_file())
    )


def _build_ignore(_dir: str, names: list[str]) -> list[str]:
    # Stale objects from an in-tree build must not leak into the clean copy.
    suffixes = (".o", ".ko", ".mod", ".mod.c", ".cmd", ".symvers", ".order")
    return [n for n in names if n.endswith(suffixes) or n == ".tmp_versions"]


def _is_build_output(name: str) -> bool:
    return bool(_build_ignore("", [name]))


def sync_sources(src: Path, copy: Path) -> int:
    """Make `copy` hold `src`'s sources, keeping its build output, so make rebuilds only what
    changed (the edit-one-file loop: one object and the link instead of the whole module).
    A changed file is written anew (its mtime now, newer than any object built from the old
    one); a source that went away goes.  Returns how many files were written."""
    copy.mkdir(parents=True, exist_ok=True)
    written = 0
    wanted: set[Path] = set()
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(_is_build_output(part) for part in rel.parts):
            continue
        wanted.add(rel)
        dest = copy / rel
        if path.is_dir():
            dest.mkdir(exist_ok=True)
        elif not dest.is_file() or dest.read_bytes() != path.read_bytes():
            shutil.copyfile(path, dest)
            shutil.copymode(path, dest)
            written += 1
    for path in sorted(copy.rglob("*"), reverse=True):
        rel = path.relative_to(copy)
        if rel in wanted or any(_is_build_output(part) for part in rel.parts):
            continue
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        elif not _is_build_output(path.name):
            path.unlink()
    return written


def _mirror_siblings(kmod_dir: Path, work: Path) -> None:
    """Link kmod/'s siblings (uapi/ ...) next to the copies, so ``$(src)/../../uapi`` resolves."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in kmod_dir.parent.iterdir():
        link = work / entry.name
        if entry.name == kmod_dir.name or entry.name.startswith(".") or not entry.is_dir():
            continue
        if link.is_symlink() or work.resolve().is_relative_to(entry.resolve()):
            continue  # already linked, or results/, which holds the build dir itself
        link.symlink_to(entry.resolve())


#: kmod/'s directories of sources built into several modules (not modules themselves).
SHARED_SOURCE_DIRS = ("common",)


def _copy_shared(kmod_dir: Path, work: Path) -> None:
    """Copy the shared source directories beside the module copies, so ``$(src)/../common``
    resolves in each module's build."""
    for name in SHARED_SOURCE_DIRS:
        entry = kmod_dir / name
        if not entry.is_dir():
            continue
        copy = work / kmod_dir.name / name
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(entry, copy, ignore=_build_ignore)


def find_warnings(output: str) -> list[str]:
    """Lines of a kbuild log that are compiler, modpost or linker warnings."""
    return [line for line in output.splitlines() if _WARNING_RE.search(line)]


def make_modules(
    headers_dir: Path,
    module_dir: Path,
    *,
    what: str,
    extra_cflags: Sequence[str] = (),
    jobs: int | None = None,
    make_vars: Mapping[str, str] | None = None,
) -> str:
    """``make -C headers_dir M=module_dir W=1 modules`` in the C locale: its output without
    make's directory chatter.  A failed make is a KbuildError naming ``what``; warnings are the
    caller's to judge (:func:`find_warnings`)."""
    argv = ["make", f"-j{jobs or os.cpu_count() or 1}", "-C", str(headers_dir), f"M={module_dir}"]
    argv.append("W=1")
    if extra_cflags:
        argv.append("KCFLAGS=" + " ".join(extra_cflags))
    argv += [f"{key}={value}" for key, value in (make_vars or {}).items()]
    argv.append("modules")
    # C locale: ASCII quotes in gcc's messages.  Kbuild unexports LC_ALL,
    # so the per-category variables are what reach gcc.
    env = {**os.environ, "LANG": "C", "LC_CTYPE": "C", "LC_MESSAGES": "C"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    output = "\n".join(
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if not _MAKE_CHATTER_RE.match(line)
    )
    if proc.returncode != 0:
        cause = first_error(output)
        raise KbuildError(f"{what}: make exited {proc.returncode}: {cause}\n{output}")
    return output


def first_error(output: str) -> str:
    """The line of a failed build a user needs first (gcc's ``error:``, modpost's ``ERROR:``),
    for the one-line summary; the whole output stays in the detail."""
    lines = output.splitlines()
    for line in lines:
        if re.search(r"\berror\b", line, re.IGNORECASE) and not line.startswith("make"):
            return line.strip()
    return lines[-1].strip() if lines else "no output"


def build_modules(
    headers_dir: Path,
    kmod_dir: Path,
    out_dir: Path,
    *,
    extra_cflags: Sequence[str] = (),
    warnings_as_errors: bool = True,
    build_dir: Path | None = None,
    jobs: int | None = None,
    modules: Sequence[str] | None = None,
    make_vars: Mapping[str, str] | None = None,
) -> list[Path]:
    """Build every module under ``kmod_dir`` with W=1 and copy the .ko files to ``out_dir``.

    Each module is built in a copy under ``<build_dir>/kmod/`` (default build_dir
    ``<out_dir>/.build``), so the source tree stays free of build output; the copy keeps
    its objects between builds (:func:`sync_sources`), so an edit rebuilds what it touches;
    kmod/'s siblings are linked beside the copy so relative paths in a Kbuild file keep
    working.  ``modules`` limits the build to those names;
    ``make_vars`` adds make variables (e.g. ARCH/CROSS_COMPILE for a cross build).
    """
    headers_dir = Path(headers_dir).resolve()
    out_dir = Path(out_dir).resolve()
    work = Path(build_dir).resolve() if build_dir else out_dir / ".build"
    if not (headers_dir / "Makefile").is_file():
        raise KbuildError(f"{headers_dir} is not a kernel build dir (no Makefile)")
    kmod_dir = Path(kmod_dir).resolve()
    dirs = module_dirs(kmod_dir)
    if modules is not None:
        unknown = sorted(set(modules) - {d.name for d in dirs})
        if unknown:
            raise KbuildError(f"no such module dir under {kmod_dir}: {', '.join(unknown)}")
        dirs = [d for d in dirs if d.name in modules]
    if not dirs:
        raise KbuildError(f"no module directories (with Kbuild or Makefile) under {kmod_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    # Two runs building into one out_dir (make test beside make bench) take turns: the build
    # copies under `work` are shared.
    with open(work.with_name(work.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(
            headers_dir, kmod_dir, dirs, out_dir, work, extra_cflags, jobs, make_vars,
            warnings_as_errors,
        )  # fmt: skip


def _build_locked(
    headers_dir: Path,
    kmod_dir: Path,
    dirs: Sequence[Path],
    out_dir: Path,
    work: Path,
    extra_cflags: Sequence[str],
    jobs: int | None,
    make_vars: Mapping[str, str] | None,
    warnings_as_errors: bool,
) -> list[Path]:
    _mirror_siblings(kmod_dir, work)
    _copy_shared(kmod_dir, work)
    built: list[Path] = []
    for src in dirs:
        copy = work / kmod_dir.name / src.name
        sync_sources(src, copy)
        started = time.monotonic()
        try:
            output = make_modules(
                headers_dir, copy, what=src.name, extra_cflags=extra_cflags, jobs=jobs,
                make_vars=make_vars,
            )  # fmt: skip
        except KbuildError:
            # The next build starts clean: objects kept from a failed build would not be
            # compiled (nor warn) again.
            shutil.rmtree(copy, ignore_errors=True)
            raise
        warnings = find_warnings(output)
        if warnings and warnings_as_errors:
            shutil.rmtree(copy, ignore_errors=True)
        if warnings and warnings_as_errors:
            raise BuildWarningsError(src.name, warnings, output)
        for line in warnings:
            log.warning("%s: %s", src.name, line)
        kos = built_modules(copy)
        if not kos:
            raise KbuildError(f"{src.name}: make succeeded but produced no .ko:\n{output}")
        for ko in kos:
            # Atomic: a cluster loading the previous .ko never reads a half-copied file.
            dest = out_dir / ko.name
            tmp = dest.with_name(f".{ko.name}.{os.getpid()}")
            shutil.copy2(ko, tmp)
            os.replace(tmp, dest)
            built.append(dest)
        log.info(
            "%s: built %s in %.1fs",
            src.name,
            ", ".join(k.name for k in kos),
            time.monotonic() - started,
        )
    return built


#: The drivers a node can run: the emulator, or upstream's obmm.ko over the compat layer.
DRIVER_EMU = "emu"
DRIVER_REAL = "real"
#: The setting's choices (envvars.DRIVER, the settings' ``driver`` knob).
DRIVERS = envvars.DRIVER.choices
#: kmod/'s compat layer (loaded with the real driver only) and the log-scanner testhook (both).
COMPAT_MODULE = "ub_compat"
TESTHOOK_MODULE = "obmm_testhook"
#: The upstream driver directory built as the real obmm.ko, and what marks a tree as one.
UPSTREAM_DRIVER_SUBDIR = "drivers/ub/obmm"
UPSTREAM_MARKERS = (f"{UPSTREAM_DRIVER_SUBDIR}/Makefile", "include/uapi/ub/obmm.h")
#: The upstream headers the driver includes (hashed with its sources).
UPSTREAM_HEADER_DIRS = ("include/uapi/ub", "include/ub")
#: Written into the build copy of the upstream driver: our flags, then its own object list.
UPSTREAM_KBUILD = "include $(UB_COMPAT_DIR)/upstream.mk\ninclude $(src)/Makefile\n"
#: Beside the real driver's .ko files: the warnings upstream's sources printed (not fatal).
UPSTREAM_WARNINGS = "upstream-warnings.txt"


def emu_modules(kmod: Path) -> list[str]:
    """The module directories the emulated driver's nodes load: every one but the compat layer."""
    return [d.name for d in module_dirs(kmod) if d.name != COMPAT_MODULE]


def check_upstream(tree: Path | None) -> Path:
    """``tree`` resolved, if it is an upstream UB driver tree; else UpstreamMissing, whose text
    ends a :func:`obmm.testbed.paths.input_skip_line` (``<step>: skipped: <it>``).  None: not
    given (there is no default place to look)."""
    hint = f"{paths.UB_UPSTREAM_HINT}, or --upstream"
    if tree is None:
        raise UpstreamMissing(f"no upstream UB driver tree ({hint})")
    for marker in UPSTREAM_MARKERS:
        if not (tree / marker).is_file():
            raise UpstreamMissing(f"no upstream UB driver tree at {tree} (no {marker}) ({hint})")
    return tree.resolve()


def _build_upstream(
    headers_dir: Path,
    upstream: Path,
    compat: Path,
    out_dir: Path,
    work: Path,
    jobs: int | None,
    make_vars: Mapping[str, str] | None,
) -> Path:
    """Build a copy of upstream's driver directory over the compat build in ``compat``: our
    warnings (from the forced compat header) fail it, upstream's are written beside it."""
    copy = work / "upstream" / Path(UPSTREAM_DRIVER_SUBDIR).name
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(upstream / UPSTREAM_DRIVER_SUBDIR, copy, ignore=_build_ignore)
    (copy / "Kbuild").write_text(UPSTREAM_KBUILD)
    argv = [
        "make",
        f"-j{jobs or os.cpu_count() or 1}",
        "-C",
        str(headers_dir),
        f"M={copy}",
        "W=1",
        "CONFIG_OBMM=m",
        f"UB_COMPAT_DIR={compat}",
        f"UB_UPSTREAM_DIR={upstream}",
        f"KBUILD_EXTRA_SYMBOLS={compat / 'Module.symvers'}",
        *(f"{key}={value}" for key, value in (make_vars or {}).items()),
        "modules",
    ]
    env = {**os.environ, "LANG": "C", "LC_CTYPE": "C", "LC_MESSAGES": "C"}
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    output = "\n".join(
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if not _MAKE_CHATTER_RE.match(line)
    )
    if proc.returncode != 0:
        raise KbuildError(
            f"upstream {UPSTREAM_DRIVER_SUBDIR}: make exited {proc.returncode}:\n{output}"
        )
    warnings = find_warnings(output)
    ours = [w for w in warnings if str(compat) in w or f"/{paths.kmod_dir().name}/" in w]
    if ours:
        raise BuildWarningsError(f"{COMPAT_MODULE} (forced into upstream obmm)", ours, output)
    theirs = [w for w in warnings if w not in ours]
    (out_dir / UPSTREAM_WARNINGS).write_text("".join(f"{w}\n" for w in theirs))
    for line in theirs:
        log.debug("upstream obmm: %s", line)
    ko = copy / "obmm.ko"
    if not ko.is_file():
        raise KbuildError(f"upstream {UPSTREAM_DRIVER_SUBDIR}: make succeeded but made no obmm.ko")
    dest = out_dir / ko.name
    tmp = dest.with_name(f".{ko.name}.{os.getpid()}")
    shutil.copy2(ko, tmp)
    os.replace(tmp, dest)
    log.info(
        "upstream obmm: built %s in %.1fs (%d upstream warning(s))",
        dest,
        time.monotonic() - started,
        len(theirs),
    )
    return dest


def build_real_driver(
    headers_dir: Path,
    kmod_dir: Path,
    upstream: Path,
    out_dir: Path,
    *,
    jobs: int | None = None,
    make_vars: Mapping[str, str] | None = None,
) -> list[Path]:
    """The real driver's modules in ``out_dir``: the testhook and ``ub_compat.ko`` (ours, W=1:
    a warning fails), then upstream's ``obmm.ko`` built over them (its warnings are reported
    in ``upstream-warnings.txt``, not fatal).  UpstreamMissing when ``upstream`` is no tree."""
    upstream = check_upstream(upstream)
    headers_dir = Path(headers_dir).resolve()
    out_dir = Path(out_dir).resolve()
    kmod_dir = Path(kmod_dir).resolve()
    work = out_dir / ".build"
    dirs = [d for d in module_dirs(kmod_dir) if d.name in (TESTHOOK_MODULE, COMPAT_MODULE)]
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    with open(work.with_name(work.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kos = _build_locked(headers_dir, kmod_dir, dirs, out_dir, work, (), jobs, make_vars, True)
        compat = work / kmod_dir.name / COMPAT_MODULE
        kos.append(_build_upstream(headers_dir, upstream, compat, out_dir, work, jobs, make_vars))
    return kos


def real_sources_digest(release: str, kmod: Path, upstream: Path) -> str:
    """sources_digest() of kmod/ plus the upstream driver's sources and headers."""
    h = hashlib.sha256(sources_digest(release, kmod).encode())
    for rel in (UPSTREAM_DRIVER_SUBDIR, *UPSTREAM_HEADER_DIRS):
        for path in sorted(p for p in (upstream / rel).rglob("*") if p.is_file()):
            h.update(f"\n{path.relative_to(upstream)}\n".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def built_modules(build_dir: Path) -> list[Path]:
    """The .ko files the last make in `build_dir` built, as Kbuild lists them in modules.order
    (absolute .ko paths before 6.2, .o names relative to the directory after).  Not a glob:
    an incremental build directory keeps the .ko of a module the sources no longer make
    (obmm_emu.ko after the rename to obmm.ko), which must not be loaded beside its successor."""
    order = build_dir / "modules.order"
    if not order.is_file():
        return sorted(build_dir.rglob("*.ko"))
    kos = []
    for line in order.read_text().split():
        path = Path(line) if Path(line).is_absolute() else build_dir / line
        ko = path.with_suffix(".ko")
        if ko.is_file():
            kos.append(ko)
    return sorted(kos)


#: Beside the built .ko files: the digest of the sources they were built from.
BUILD_STAMP = "build-stamp.json"


def sources_digest(release: str, kmod: Path) -> str:
    """What a module build depends on: the kernel release, every file under `kmod` (build
    output never lands there) and the build procedure itself (this file)."""
    h = hashlib.sha256(f"release={release}\n".encode())
    h.update(Path(__file__).read_bytes())
    for path in sorted(p for p in kmod.rglob("*") if p.is_file()):
        h.update(f"\n{path.relative_to(kmod)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def reusable_build(out: Path, digest: str) -> list[Path] | None:
    """The .ko files in `out` if the last build there was of the sources `digest` names."""
    try:
        recorded = json.loads((out / BUILD_STAMP).read_text())
    except (OSError, ValueError):
        return None
    kos = [out / name for name in recorded.get("modules", [])]
    if recorded.get("digest") != digest or not kos or not all(k.is_file() for k in kos):
        return None
    return kos


def record_build(out: Path, digest: str, kos: Sequence[Path]) -> None:
    stamp = out / BUILD_STAMP
    tmp = stamp.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"digest": digest, "modules": [k.name for k in kos]}))
    os.replace(tmp, stamp)
