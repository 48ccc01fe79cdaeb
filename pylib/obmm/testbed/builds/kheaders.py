"""Debian kernel headers for out-of-tree module builds, from apt, cached.

The guest image installs exactly ``linux-image-<release>`` and ``linux-headers-<release>``; this
module resolves the same release from the host's apt lists (or a private ``APT_CONFIG`` for
another suite or architecture) and unpacks the matching headers into a private cache (never the
host's /usr/src), so host-built ``.ko`` files load in the guest.  The builds over them:
:mod:`obmm.testbed.builds.kbuild`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


class KbuildError(TestbedError, RuntimeError):
    """A kernel headers fetch or module build failed; the message says which step and why."""


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
