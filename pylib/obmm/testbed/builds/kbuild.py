"""Debian kernel headers and out-of-tree module builds for the QEMU testbed.

The guest image installs exactly ``linux-image-<release>`` and
``linux-headers-<release>``; this module resolves the same release from the
host's apt lists, unpacks the matching headers into a private cache (never
the host's /usr/src) and builds every module under ``kmod/`` against them
with ``W=1``, so host-built ``.ko`` files load in the guest.

Two drivers can be built (``DRIVERS``): ``emu``, the emulated driver of ``kmod/obmm_emu``
(with every other module of ``kmod/``), and ``real``, upstream's ``drivers/ub/obmm`` built from a
tree given by path (:func:`obmm.testbed.paths.ub_upstream_dir`) over the compat layer
``kmod/ub_compat`` (:func:`build_real_driver`), into a directory of its own.

Debug CLI: ``python -m obmm.testbed.builds.kbuild [--release R] [--arch A] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.errors import TestbedError

log = logging.getLogger(__name__)

DEFAULT_SUITE = "bookworm"
#: Suites whose packages count as "bookworm" (point releases and security fixes).
_SUITE_SUFFIXES = ("", "-updates", "-security")
_MANIFEST = ".obmm-kheaders.json"
#: Only these dependencies of linux-headers-* carry files the build needs;
#: linux-compiler-* is a metapackage naming the gcc version.
_TREE_PACKAGE_PREFIXES = ("linux-headers-", "linux-kbuild-")
#: gcc, modpost and the linker print these; any one fails a W=1 build.
_WARNING_RE = re.compile(r"\bwarning:", re.IGNORECASE)
#: make's bookkeeping lines, dropped from error output to keep it readable.
_MAKE_CHATTER_RE = re.compile(r"^make(\[\d+\])?: (Entering|Leaving) directory")


class KbuildError(TestbedError, RuntimeError):
    """A kernel headers fetch or module build failed; the message says which step and why."""


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


@dataclass(frozen=True)
class DebPackage:
    """One binary package pinned to a version, as ``apt-get download`` takes it."""

    name: str
    version: str
    arch: str  # "all" for architecture-independent packages

    @property
    def spec(self) -> str:
        qualifier = "" if self.arch == "all" else f":{self.arch}"
        return f"{self.name}{qualifier}={self.version}"


def _run(
    argv: Sequence[str],
    *,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, raising KbuildError naming ``what`` with its stderr if it fails."""
    log.debug("run: %s", " ".join(argv))
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise KbuildError(f"{what}: {argv[0]} not found ({exc.strerror})") from exc
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
        raise KbuildError(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: " + " | ".join(detail[-5:])
        )
    return proc


def _apt_env(apt_config: Path | None) -> dict[str, str] | None:
    # APT_CONFIG lets a later matrix lane point at private lists (e.g. trixie)
    # without touching the host's sources.
    if apt_config is None:
        return None
    env = dict(os.environ)
    env["APT_CONFIG"] = str(apt_config)
    return env


def host_arch() -> str:
    """The host's dpkg architecture (``amd64``, ``arm64``...)."""
    return _run(["dpkg", "--print-architecture"], what="host arch").stdout.strip()


# " *** " marks the installed version in place of the 5-space indent.
_POLICY_VERSION_RE = re.compile(r"^(?: {5}| \*\*\* )(\S+) -?\d+$")
_POLICY_SOURCE_RE = re.compile(r"^ {8}-?\d+ \S+ ([^/\s]+)/\S+ \S+ Packages$")


def parse_policy(text: str) -> list[tuple[str, list[str]]]:
    """Parse ``apt-cache policy PKG`` into [(version, [suite, ...])], apt's order (newest first)."""
    table: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        version = _POLICY_VERSION_RE.match(line)
        if version:
            table.append((version.group(1), []))
            continue
        source = _POLICY_SOURCE_RE.match(line)
        if source and table:
            table[-1][1].append(source.group(1))
    return table


def _suite_version(package: str, suite: str, env: Mapping[str, str] | None) -> str:
    """Newest version of ``package`` available from ``suite`` (or its -updates/-security)."""
    proc = _run(["apt-cache", "policy", package], what=f"apt-cache policy {package}", env=env)
    table = parse_policy(proc.stdout)
    if not table:
        raise KbuildError(
            f"package {package} is not in the host's apt lists "
            "(wrong release or arch? run `apt-get update`)"
        )
    wanted = {suite + suffix for suffix in _SUITE_SUFFIXES}
    for version, suites in table:
        if wanted.intersection(suites):
            return version
    seen = sorted({s for _, suites in table for s in suites})
    raise KbuildError(
        f"package {package}: no version from suite {suite} in the host's apt lists "
        f"(lists have: {', '.join(seen) or 'none'}); add that suite via APT_CONFIG"
    )


def parse_depends(field: str) -> list[tuple[str, str | None]]:
    """Split a Depends field into [(package, version-constraint or None)], first alternatives."""
    deps: list[tuple[str, str | None]] = []
    for clause in field.split(","):
        first = clause.split("|")[0].strip()
        if not first:
            continue
        m = re.match(r"^([^\s(:]+)(?::\S+)?\s*(?:\(([^)]*)\))?", first)
        if m:
            deps.append((m.group(1), m.group(2).strip() if m.group(2) else None))
    return deps


def _show(specs: Sequence[str], env: Mapping[str, str] | None) -> list[dict[str, str]]:
    """``apt-cache show`` stanzas of pinned package specs, in one call (each costs ~1 s)."""
    proc = _run(
        ["apt-cache", "show", "--no-all-versions", *specs],
        what=f"apt-cache show {' '.join(specs)}",
        env=env,
    )
    stanzas: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    key = ""
    for line in [*proc.stdout.splitlines(), ""]:
        if not line.strip():
            if fields:
                stanzas.append(fields)
                fields = {}
            continue
        if line[0].isspace() and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return stanzas


#: What `apt-get update` and the host's apt configuration change.
APT_STATE_GLOBS = (
    "/var/lib/apt/lists/*Packages*",
    "/var/lib/apt/lists/*Release",
    "/etc/apt/sources.list*",
    "/etc/apt/sources.list.d/*",
    "/etc/apt/preferences*",
    "/etc/apt/preferences.d/*",
)


def _apt_state() -> str:
    """A digest of the host's package lists and apt configuration (names, sizes, mtimes)."""
    digest = hashlib.sha256()
    for pattern in APT_STATE_GLOBS:
        folder, glob = pattern.rsplit("/", 1)
        for path in sorted(Path(folder).glob(glob)):
            st = path.stat()
            digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def apt_answer(name: str, ask: Callable[[], str]) -> str:
    """`ask()` (apt-cache calls: about a second of CPU each, paid by every test session that
    boots a node), kept in the cache under `name` until the host's package lists or apt
    configuration change."""
    memo = paths.cache_dir() / "apt" / "answers" / f"{name}-{_apt_state()}"
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    answer = ask()
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
    tmp.write_text(answer + "\n")
    tmp.replace(memo)
    return answer


def suite_version(package: str, suite: str = DEFAULT_SUITE) -> str:
    """Newest version of ``package`` the host's lists offer from ``suite`` (apt_answer)."""
    return apt_answer(f"version-{package}-{suite}", lambda: _suite_version(package, suite, None))


def debian_kernel_release(
    arch: str = "amd64", suite: str = DEFAULT_SUITE, *, apt_config: Path | None = None
) -> str:
    """The release (``6.1.0-57-amd64``) that ``linux-image-<arch>`` from ``suite`` depends on
    (for the host's own lists, an apt_answer)."""
    if apt_config is not None:
        return _debian_kernel_release(arch, suite, apt_config)
    return apt_answer(
        f"kernel-release-{arch}-{suite}", lambda: _debian_kernel_release(arch, suite, None)
    )


def _debian_kernel_release(arch: str, suite: str, apt_config: Path | None) -> str:
    env = _apt_env(apt_config)
    meta = f"linux-image-{arch}" if arch == host_arch() else f"linux-image-{arch}:{arch}"
    version = _suite_version(meta, suite, env)
    fields = _show([f"{meta}={version}"], env)[0]
    for name, _constraint in parse_depends(fields.get("Depends", "")):
        m = re.fullmatch(r"linux-image-(\d+\.\d+\S*)", name)
        if m:
            release = m.group(1).removesuffix("-unsigned")
            log.info("%s %s (%s) -> kernel release %s", meta, version, suite, release)
            return release
    raise KbuildError(
        f"{meta}={version} does not depend on a linux-image-<release> package "
        f"(Depends: {fields.get('Depends', '')!r})"
    )


def headers_packages(
    release: str,
    arch: str = "amd64",
    suite: str = DEFAULT_SUITE,
    *,
    apt_config: Path | None = None,
) -> list[DebPackage]:
    """linux-headers-<release> and the packages its tree needs, pinned to one source version.

    linux-kbuild-* holds host executables (fixdep, modpost), so it is taken for
    the host's arch even when the headers are for another one (cross builds).
    """
    env = _apt_env(apt_config)
    build_arch = host_arch()

    def qualified(name: str, pkg_arch: str) -> str:
        return name if pkg_arch == build_arch else f"{name}:{pkg_arch}"

    top = f"linux-headers-{release}"
    try:
        version = _suite_version(qualified(top, arch), suite, env)
    except KbuildError as exc:
        raise KbuildError(f"cannot find headers for kernel {release} ({arch}): {exc}") from exc
    packages: list[DebPackage] = []
    seen = {top}
    level = [qualified(top, arch) + f"={version}"]
    while level:
        wanted: list[str] = []
        for fields in _show(level, env):
            packages.append(DebPackage(fields["Package"], version, fields["Architecture"]))
            for name, _constraint in parse_depends(fields.get("Depends", "")):
                if name in seen or not name.startswith(_TREE_PACKAGE_PREFIXES):
                    continue
                seen.add(name)
                # The whole tree comes from one source package, hence one version.
                if name.startswith("linux-kbuild-"):
                    dep_arch = build_arch  # host tools, even for a cross build
                elif name.endswith("-common"):
                    dep_arch = build_arch  # Architecture: all, no qualifier
                else:
                    dep_arch = arch
                wanted.append(qualified(name, dep_arch) + f"={version}")
        level = wanted
    return packages


def _download(packages: Iterable[DebPackage], dest: Path, env: Mapping[str, str] | None) -> None:
    argv = ["apt-get", "download", "-q"]
    if os.geteuid() == 0:
        # apt's _apt sandbox user cannot write into root's private temp dir.
        argv += ["-o", "APT::Sandbox::User=root"]
    for pkg in packages:
        try:
            _run([*argv, pkg.spec], what=f"download {pkg.spec}", cwd=dest, env=env)
        except KbuildError as exc:
            raise KbuildError(
                f"cannot download {pkg.spec} from the Debian mirror: {exc}. "
                "Check network access to deb.debian.org and run `apt-get update`."
            ) from exc


def _relink_absolute(root: Path) -> int:
    """Point absolute symlinks inside the unpacked tree at the tree, not the host's /."""
    fixed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = Path(dirpath) / name
            if not link.is_symlink():
                continue
            target = os.readlink(link)
            if not target.startswith("/"):
                continue
            inside = root / target.lstrip("/")
            link.unlink()
            link.symlink_to(os.path.relpath(inside, link.parent))
            fixed += 1
    return fixed


_ABS_INCLUDE_RE = re.compile(r"^(-?include)\s+/(\S+)\s*$", re.MULTILINE)


def _relocate_makefile(headers: Path, root: Path) -> None:
    """Debian's arch Makefile includes the -common tree by absolute path; make it relative."""
    makefile = headers / "Makefile"
    text = makefile.read_text()

    def repl(m: re.Match[str]) -> str:
        target = root / m.group(2)
        if not target.exists():
            raise KbuildError(
                f"{makefile} includes /{m.group(2)}, which no downloaded package provides"
            )
        rel = os.path.relpath(target, headers)
        # make -C <headers> reads this Makefile by a path relative to itself.
        return f"{m.group(1)} $(dir $(lastword $(MAKEFILE_LIST))){rel}"

    makefile.write_text(_ABS_INCLUDE_RE.sub(repl, text))


def headers_dir_for(release: str, cache_dir: Path | None = None) -> Path:
    """Where fetch_headers() puts the headers tree for ``release``."""
    base = (cache_dir or paths.cache_dir() / "kheaders") / release
    return base / "usr" / "src" / f"linux-headers-{release}"


def fetch_headers(
    release: str,
    arch: str = "amd64",
    cache_dir: Path | None = None,
    *,
    suite: str = DEFAULT_SUITE,
    apt_config: Path | None = None,
) -> Path:
    """Download and unpack the headers for ``release``; return the dir for ``make -C``.

    The tree lands in ``<cache_dir>/<release>/`` (default
    ``~/.cache/obmm-testbed/kheaders``), built in a temp dir and renamed into
    place, so a crash never leaves a half tree that looks complete.
    """
    cache = cache_dir or paths.cache_dir() / "kheaders"
    final = cache / release
    headers = headers_dir_for(release, cache)
    if (final / _MANIFEST).is_file() and headers.is_dir():
        log.info("kernel headers %s: cached at %s", release, headers)
        return headers

    env = _apt_env(apt_config)
    packages = headers_packages(release, arch, suite, apt_config=apt_config)
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{release}.", dir=cache) as tmp:
        debs = Path(tmp) / "debs"
        root = Path(tmp) / "root"
        debs.mkdir()
        root.mkdir()
        _download(packages, debs, env)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)], what=f"unpack {deb.name}")
        tmp_headers = root / "usr" / "src" / f"linux-headers-{release}"
        if not (tmp_headers / "Makefile").is_file():
            raise KbuildError(f"linux-headers-{release} did not provide {tmp_headers}/Makefile")
        _relink_absolute(root)
        _relocate_makefile(tmp_headers, root)
        manifest = {
            "release": release,
            "arch": arch,
            "suite": suite,
            "packages": [p.spec for p in packages],
        }
        (root / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if final.exists() and not (final / _MANIFEST).is_file():
            shutil.rmtree(final)  # left by an older layout or a hand edit, never complete
        try:
            root.rename(final)
        except OSError:
            # Another process finished first; its tree is as good as ours.
            if not (final / _MANIFEST).is_file():
                raise
    log.info(
        "kernel headers %s: fetched in %.1fs to %s", release, time.monotonic() - started, headers
    )
    return headers


def headers_version(release: str, cache_dir: Path | None = None) -> str:
    """The Debian version of the headers fetch_headers() unpacked for ``release`` (that of
    their source package, ``linux``; ``linux-source-<x.y>`` of the same version matches)."""
    manifest = (cache_dir or paths.cache_dir() / "kheaders") / release / _MANIFEST
    try:
        specs: list[str] = json.loads(manifest.read_text())["packages"]
    except (OSError, ValueError, KeyError) as exc:
        raise KbuildError(f"headers for {release} not fetched ({manifest}: {exc})") from exc
    for spec in specs:
        name, _, version = spec.partition("=")
        if name.split(":")[0] == f"linux-headers-{release}" and version:
            return version
    raise KbuildError(f"{manifest} names no linux-headers-{release} package")


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
        raise KbuildError(f"{what}: make exited {proc.returncode}:\n{output}")
    return output


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


def check_upstream(tree: Path) -> Path:
    """``tree`` resolved, if it is an upstream UB driver tree; else UpstreamMissing (one line)."""
    for marker in UPSTREAM_MARKERS:
        if not (tree / marker).is_file():
            raise UpstreamMissing(
                f"no upstream UB driver tree at {tree} (no {marker}): set "
                f"${envvars.UB_UPSTREAM.name} or --upstream to an OLK kernel or "
                "ub-os-component-dkms checkout"
            )
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
    upstream = check_upstream(Path(upstream))
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


DESCRIPTION = "Build kmod/* against Debian kernel headers and pre-flight the .ko files."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `obmm-testbed kmod` (and of ``python -m obmm.testbed.builds.kbuild``)."""
    parser.add_argument(
        "--release", help="kernel release (default: what linux-image-ARCH depends on)"
    )
    parser.add_argument("--arch", default="amd64", help="Debian arch of the guest (default amd64)")
    parser.add_argument(
        "--suite", default=DEFAULT_SUITE, help=f"Debian suite (default {DEFAULT_SUITE})"
    )
    parser.add_argument(
        "--out", type=Path, help="where the .ko files go (default results/kmod/RELEASE)"
    )
    parser.add_argument("--kmod", type=Path, default=paths.kmod_dir(), help="module sources")
    parser.add_argument(
        "--cache", type=Path, help="headers cache (default ~/.cache/obmm-testbed/kheaders)"
    )
    parser.add_argument(
        "--module", action="append", dest="modules", help="build only this module dir (repeatable)"
    )
    parser.add_argument("--no-werror", action="store_true", help="report warnings but do not fail")
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        help="emu: kmod/*; real: upstream's obmm.ko over kmod/ub_compat, into "
        f"results/kmod-real/RELEASE (default ${envvars.DRIVER.name}, else emu)",
    )
    parser.add_argument(
        "--upstream",
        type=Path,
        help="upstream UB driver tree for --driver real (default "
        f"${envvars.UB_UPSTREAM.name}, else the pinned copy)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="skip the build when the .ko files in the output are of these very sources",
    )


def command(args: argparse.Namespace) -> int:
    """Resolve the release, fetch headers, build all modules, pre-flight each .ko.

    Raises KbuildError when a step cannot be done; returns 1 when a .ko fails the pre-flight.
    """
    from obmm.testbed.builds import elfcheck  # deferred: the library part must not need pyelftools

    t0 = time.monotonic()
    real = (getattr(args, "driver", None) or envvars.DRIVER.get()) == DRIVER_REAL
    upstream = args.upstream or paths.ub_upstream_dir() if real else None
    if upstream is not None:
        try:
            upstream = check_upstream(upstream)
        except UpstreamMissing as exc:
            print(f"kbuild: real driver skipped: {exc}")
            return 0
    release = args.release or debian_kernel_release(args.arch, args.suite)
    headers = fetch_headers(release, args.arch, args.cache, suite=args.suite)
    t1 = time.monotonic()
    out = args.out or paths.results_dir() / ("kmod-real" if real else "kmod") / release
    # Only a whole build that allows no warning is what the testbed's own builds would make.
    full = not args.modules and not args.no_werror
    if upstream is not None:
        digest = real_sources_digest(release, args.kmod, upstream) if full else ""
    else:
        digest = sources_digest(release, args.kmod) if full else ""
    reused = reusable_build(out, digest) if full and args.reuse else None
    print(f"kbuild: headers {release} ready in {t1 - t0:.1f}s: {headers}")
    if reused is not None:
        kos = reused
        print(f"kbuild: modules unchanged since their last build, reusing {out}")
    else:
        try:
            if upstream is not None:
                kos = build_real_driver(headers, args.kmod, upstream, out)
                warned = (out / UPSTREAM_WARNINGS).read_text().splitlines()
                print(
                    f"kbuild: upstream obmm.ko from {upstream}: {len(warned)} upstream warning(s)"
                )
                for line in warned:
                    print(f"  {line}")
            else:
                kos = build_modules(
                    headers,
                    args.kmod,
                    out,
                    warnings_as_errors=not args.no_werror,
                    modules=args.modules,
                )
        except BuildWarningsError as exc:
            # The warnings are the command's output; the error after them is their count.
            print(exc.output, file=sys.stderr)
            raise KbuildError(exc.summary) from exc
        if full:
            record_build(out, digest, kos)
        print(f"kbuild: built {len(kos)} module(s) in {time.monotonic() - t1:.1f}s into {out}")

    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    failed = 0
    for ko in kos:
        t = time.monotonic()
        problems = elfcheck.check_module(
            ko, kernel_release=release, arch=args.arch, symvers_path=symvers, extra_exports=exports
        )
        ms = (time.monotonic() - t) * 1000
        if problems:
            failed += 1
            print(f"elfcheck: {ko.name}: FAIL ({ms:.0f} ms)")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(f"elfcheck: {ko.name}: ok ({ms:.0f} ms)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m obmm.testbed.builds.kbuild``: `obmm-testbed kmod` with its own error printing."""
    parser = argparse.ArgumentParser(
        prog="python -m obmm.testbed.builds.kbuild", description=DESCRIPTION
    )
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="kbuild: %(message)s"
    )
    try:
        return command(args)
    except KbuildError as exc:
        print(f"kbuild: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
