"""The debug guest kernel: Debian's linux-source built with KASAN, lockdep, kmemleak and friends.

The production guests run Debian's kernel, on which a use-after-free in obmm_emu passes
silently.  This module builds a second guest kernel from the *same* source family
(``linux-source-6.1`` from the bookworm lists, Debian's patches applied) with the sanitizers
on, and caches it:

    <cache>/debug-kernel/downloads/linux-source-*.deb     the source package (apt-get download)
    <cache>/debug-kernel/<version>-<config hash>/
        linux-source-6.1/      the build tree (obmm_emu is built against it: ``KDIR``)
        bzImage                the kernel the guests boot (direct kernel boot)
        images/<image>/        an image booting this kernel (obmm.testbed.builds.image, with
                               $OBMM_TESTBED_KERNEL=debug): its disk, this bzImage, its fast
                               initramfs without modules (the kernel has them built in)
        config                 the final .config
        build.log              every make step
        manifest.json          version, release, config hash, build time: written last

The key is the source package version plus the hash of the config fragment
(``qemu/debug-kernel/debug.config``) and of the recipe (``RECIPE``), so a new Debian point
release or a config change builds anew and an unchanged one is reused.

The config is as small as works, to build in tens of minutes on 2 cores: x86_64 defconfig +
kvm_guest.config + the fragment, which builds in everything the guests boot with (virtio,
ext4, hugetlbfs, THP, NUMA, memory hotplug) and turns on the debug options.  Every option the
fragment names is checked in the final .config, so a dependency Kconfig silently dropped is
an error, not a kernel that lacks KASAN.

CLI: ``python -m obmm.testbed.builds.debugkernel build|path|kdir``.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.builds import kbuild, kheaders
from obmm.testbed.builds.filelock import locked
from obmm.testbed.errors import TestbedError
from obmm.testbed.progress import Progress, StepFailed

log = logging.getLogger(__name__)

SOURCE_PACKAGE = "linux-source-6.1"
SUITE = "bookworm"
FRAGMENT = Path("debug-kernel") / "debug.config"  # under qemu_dir()
#: Bumped when the build procedure below changes what it produces.
RECIPE = "1: defconfig + kvm_guest.config + fragment; bzImage modules"
MANIFEST = "manifest.json"
#: How often the build says how far it got on a non-TTY (CI logs).
HEARTBEAT_S = 60.0
_CC_RE = re.compile(rb"^\s+CC(?: \[M\])?\s", re.MULTILINE)
_OPTION_RE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_UNSET_RE = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")


class DebugKernelError(TestbedError, RuntimeError):
    """The debug kernel could not be fetched, configured or built."""


@dataclass(frozen=True)
class DebugKernel:
    """A built debug kernel in the cache."""

    root: Path
    version: str  # the source package's Debian version
    release: str  # `uname -r` of the built kernel
    build_seconds: float

    @property
    def bzimage(self) -> Path:
        return self.root / "bzImage"

    @property
    def kdir(self) -> Path:
        """The build tree external modules are built against (``make -C``)."""
        return self.root / SOURCE_PACKAGE


def fragment_path() -> Path:
    return paths.qemu_dir() / FRAGMENT


def parse_fragment(text: str) -> dict[str, str | None]:
    """{CONFIG_X: value} of a config fragment; None for ``# CONFIG_X is not set``."""
    wanted: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.strip()
        if m := _OPTION_RE.match(line):
            wanted[m.group(1)] = m.group(2)
        elif m := _UNSET_RE.match(line):
            wanted[m.group(1)] = None
    return wanted


def config_mismatches(wanted: dict[str, str | None], final: str) -> list[str]:
    """Options of the fragment the final .config does not have as asked (Kconfig drops silently)."""
    have: dict[str, str] = {}
    for line in final.splitlines():
        if m := _OPTION_RE.match(line.strip()):
            have[m.group(1)] = m.group(2)
    bad = []
    for name, value in wanted.items():
        got = have.get(name)
        if value is None:
            if got not in (None, "n"):
                bad.append(f"{name}: wanted unset, got {got}")
        elif got != value:
            bad.append(f"{name}: wanted {value}, got {got or 'unset'}")
    return bad


def cache_key(version: str, fragment: str) -> str:
    digest = hashlib.sha256(f"{RECIPE}\n{version}\n{fragment}".encode()).hexdigest()[:12]
    return f"{version}-{digest}"


def base_dir() -> Path:
    return paths.cache_dir() / "debug-kernel"


def source_version() -> str:
    """The linux-source-6.1 version the host's apt lists offer for bookworm (or its security)."""
    try:
        return kheaders.suite_version(SOURCE_PACKAGE, SUITE)
    except kbuild.KbuildError as exc:
        raise DebugKernelError(f"{exc} (the debug kernel is built from {SOURCE_PACKAGE})") from exc


def load(root: Path) -> DebugKernel | None:
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    kernel = DebugKernel(root, data["version"], data["release"], float(data["build_seconds"]))
    if not (kernel.bzimage.is_file() and kernel.kdir.is_dir()):
        return None
    return kernel


def cached(version: str | None = None) -> DebugKernel | None:
    """The built kernel for the current fragment (and `version`, default: apt's candidate)."""
    version = version or source_version()
    return load(base_dir() / cache_key(version, fragment_path().read_text()))


def download_source(version: str, progress: Progress) -> Path:
    """The source .deb, downloaded once per version with apt-get download (atomically: two
    callers at once both end with the whole file)."""
    downloads = base_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    pattern = f"{SOURCE_PACKAGE}_{version.replace(':', '%3a')}_all.deb"
    deb = downloads / pattern
    if deb.is_file():
        return deb
    progress.line(f"downloading {SOURCE_PACKAGE}={version} (about 140 MB) with apt-get download")
    with tempfile.TemporaryDirectory(prefix=".dl-", dir=downloads) as tmp:
        kheaders._download([kheaders.DebPackage(SOURCE_PACKAGE, version, "all")], Path(tmp), None)
        got = list(Path(tmp).glob("*.deb"))
        if len(got) != 1:
            raise DebugKernelError(f"apt-get download {SOURCE_PACKAGE}={version} gave {got}")
        got[0].rename(deb)
    return deb


def _make(jobs: int) -> list[str]:
    # nice: the machine's cores are shared with other sessions' VMs.
    return ["nice", "-n", "19", "make", f"-j{jobs}"]


def _build_with_progress(argv: Sequence[str], cwd: Path, logfile: Path, progress: Progress) -> None:
    """The long make: progress as objects compiled, against the last build's count if known."""
    expected_file = base_dir() / "objects-last-build"
    try:
        expected = int(expected_file.read_text())
    except (OSError, ValueError):
        expected = 0
    progress.line(f"build: {' '.join(argv)} (log {logfile})")
    start = last_beat = time.monotonic()
    with logfile.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        offset = logfile.stat().st_size
        proc = subprocess.Popen(
            list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            while proc.poll() is None:
                time.sleep(2)
                with logfile.open("rb") as fh:
                    fh.seek(offset)
                    count = len(_CC_RE.findall(fh.read()))
                of = f"/~{expected}" if expected else ""
                msg = f"build: {count}{of} objects compiled"
                progress.status(msg)
                now = time.monotonic()
                if not progress.tty and now - last_beat >= HEARTBEAT_S:
                    last_beat = now
                    progress.line(msg)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        raise StepFailed(
            f"kernel build failed (exit {proc.returncode}); log {logfile}, last lines:\n"
            + "\n".join(logfile.read_text(errors="replace").splitlines()[-30:])
        )
    with logfile.open("rb") as fh:
        fh.seek(offset)
        expected_file.write_text(str(len(_CC_RE.findall(fh.read()))))
    progress.line(f"build: done in {time.monotonic() - start:.0f} s")


def _prune(src: Path) -> int:
    """Drop the objects external modules never need (like Debian's headers packages, which
    have none): a tenth of the tree's size remains.  scripts/ and tools/ keep theirs."""
    freed = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        if rel.parts[:1] in (("scripts",), ("tools",)):
            dirnames[:] = []
            continue
        for name in filenames:
            if name.endswith((".o", ".a")) or name.startswith(".tmp_vmlinux"):
                path = Path(dirpath) / name
                freed += path.stat().st_size
                path.unlink()
    return freed


def build(jobs: int = 2, force: bool = False, stream: object = None) -> DebugKernel:
    """Build (or reuse) the debug kernel for the current fragment and apt's source version."""
    progress = Progress("debug-kernel", stream)  # type: ignore[arg-type]
    version = source_version()
    fragment = fragment_path().read_text()
    key = cache_key(version, fragment)
    root = base_dir() / key
    with locked(base_dir() / ".lock"):
        kernel = None if force else load(root)
        if kernel is not None:
            progress.line(
                f"cached: {kernel.release} at {root} (built in {kernel.build_seconds:.0f} s)"
            )
            return kernel
        for stale in base_dir().iterdir():
            # Holding the lock, no build runs: a key dir without a manifest is a failed one.
            if stale.name[0].isdigit() and stale != root and not (stale / MANIFEST).is_file():
                shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        deb = download_source(version, progress)
        if root.exists():
            shutil.rmtree(root)  # a killed build: the manifest is written last
        root.mkdir(parents=True)
        logfile = root / "build.log"
        src = root / SOURCE_PACKAGE
        with tempfile.TemporaryDirectory(prefix=".deb-", dir=root) as tmp:
            progress.run("unpack", ["dpkg-deb", "-x", str(deb), tmp], logfile)
            tarballs = list((Path(tmp) / "usr" / "src").glob(f"{SOURCE_PACKAGE}.tar.*"))
            if len(tarballs) != 1:
                raise DebugKernelError(f"{deb.name}: expected one source tarball, got {tarballs}")
            progress.run("extract", ["tar", "-xf", str(tarballs[0]), "-C", str(root)], logfile)
        if not (src / "Makefile").is_file():
            raise DebugKernelError(f"{deb.name} did not unpack to {src}")
        frag = root / "debug.config"
        frag.write_text(fragment)
        make = ["make", f"-j{jobs}"]
        progress.run("defconfig", [*make, "defconfig"], logfile, cwd=src)
        progress.run("kvm_guest.config", [*make, "kvm_guest.config"], logfile, cwd=src)
        progress.run(
            "merge fragment",
            ["scripts/kconfig/merge_config.sh", "-m", ".config", str(frag)],
            logfile,
            cwd=src,
        )
        progress.run("olddefconfig", [*make, "olddefconfig"], logfile, cwd=src)
        final = (src / ".config").read_text()
        bad = config_mismatches(parse_fragment(fragment), final)
        if bad:
            raise DebugKernelError(
                "the final .config lacks options of the fragment (a dependency is missing):\n  "
                + "\n  ".join(bad)
            )
        shutil.copy2(src / ".config", root / "config")
        build_start = time.monotonic()
        _build_with_progress([*_make(jobs), "bzImage", "modules"], src, logfile, progress)
        build_seconds = time.monotonic() - build_start
        release = subprocess.run(
            ["make", "-s", "kernelrelease"], cwd=src, capture_output=True, text=True, check=True
        ).stdout.strip()
        shutil.copy2(src / "arch" / "x86" / "boot" / "bzImage", root / "bzImage")
        freed = _prune(src)
        progress.line(f"pruned the build tree's objects: {freed >> 20} MiB freed")
        manifest = {
            "version": version,
            "release": release,
            "key": key,
            "recipe": RECIPE,
            "jobs": jobs,
            "build_seconds": round(build_seconds, 1),
            "total_seconds": round(time.monotonic() - started, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        progress.line(
            f"built {release} in {build_seconds:.0f} s (make), {manifest['total_seconds']:.0f} s "
            f"in all: {root}"
        )
        kernel = load(root)
        assert kernel is not None
        return kernel


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m obmm.testbed.builds.debugkernel")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) the debug kernel; prints its directory")
    b.add_argument("-j", "--jobs", type=int, default=envvars.DEBUG_KERNEL_JOBS.get())
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("path", help="print the cached kernel's directory (exit 1 if not built)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.cmd == "build":
            kernel = build(args.jobs, args.force)
        else:
            found = cached()
            if found is None:
                print("debug kernel not built (make debug-kernel)", file=sys.stderr)
                return 1
            kernel = found
    except TestbedError as exc:
        print(f"debug-kernel: {exc}", file=sys.stderr)
        return 1
    print(kernel.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
