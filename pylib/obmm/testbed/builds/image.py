"""Guest images: built from a recipe under qemu/, cached by the recipe's hash, never mutated.

Layout of the cache (:func:`obmm.testbed.paths.cache_dir`)::

    ssh/id_ed25519[.pub]                 root login key, made once per cache
    images/<name>-<hash16>/disk.qcow2    base image (read-only; nodes boot from overlays)
                          vmlinuz, initrd.img, manifest.json, build.log
    images/.lock                         serialises builds between processes

A build happens in ``images/.tmp-*`` and is renamed into place only when complete, so a killed
build never leaves a half image that looks valid.
Debugging: ``python -m obmm.testbed.builds.image``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obmm import envvars
from obmm.testbed import arch as arch_table
from obmm.testbed.arch import X86_64, Arch
from obmm.testbed.builds import aptlists, debugkernel, initramfs, kheaders
from obmm.testbed.builds.filelock import locked
from obmm.testbed.errors import TestbedError
from obmm.testbed.paths import cache_dir, qemu_dir
from obmm.testbed.progress import Progress, StepFailed
from obmm.testbed.topology import FAST_INIT_MODULES

log = logging.getLogger(__name__)

# Bump when the build procedure (not the recipe) changes in a way that changes the image.
BUILDER_VERSION = 2
DEFAULT_RECIPE = "debian-bookworm"
REPO_PROBE_TIMEOUT_S = 10.0
FAST_INITRD = "initrd-fast.img"
BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")


class ImageError(TestbedError, RuntimeError):
    """The image cannot be built or is unusable; the message says what to do."""


@dataclass(frozen=True)
class Recipe:
    """A guest image recipe (qemu/<distro>/<release>.json plus its hook scripts)."""

    name: str
    distro: str
    suite: str
    path: Path
    packages: tuple[str, ...] = ()
    mirrors: tuple[str, ...] = ()
    variant: str = "minbase"
    kernel_release: str = "auto"
    free_space_mib: int = 1024
    essential_hook: str | None = None
    customize_hook: str | None = None
    repo_url: str | None = None
    # Files beside the recipe that its hooks install (e.g. the fast-boot init): hashed too.
    files: tuple[str, ...] = ()
    # /init of the fast-boot initramfs (obmm.testbed.builds.initramfs); None: no fast boot.
    fast_initramfs: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Recipe:
        data = json.loads(path.read_text())
        known = {
            "name",
            "distro",
            "suite",
            "packages",
            "mirrors",
            "variant",
            "kernel_release",
            "free_space_mib",
            "essential_hook",
            "customize_hook",
            "repo_url",
            "files",
            "fast_initramfs",
        }
        return cls(
            name=data["name"],
            distro=data["distro"],
            suite=data["suite"],
            path=path,
            packages=tuple(data.get("packages", ())),
            mirrors=tuple(data.get("mirrors", ())),
            variant=data.get("variant", "minbase"),
            kernel_release=data.get("kernel_release", "auto"),
            free_space_mib=int(data.get("free_space_mib", 1024)),
            essential_hook=data.get("essential_hook"),
            customize_hook=data.get("customize_hook"),
            repo_url=data.get("repo_url"),
            files=tuple(data.get("files", ())),
            fast_initramfs=data.get("fast_initramfs"),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def hook_path(self, name: str | None) -> Path | None:
        return None if name is None else self.path.parent / name

    def hook_paths(self) -> list[Path]:
        """The hook scripts and the files they install: everything hashed with the recipe."""
        hooks = [
            p
            for p in (self.hook_path(self.essential_hook), self.hook_path(self.customize_hook))
            if p is not None
        ]
        files = [*self.files, *([self.fast_initramfs] if self.fast_initramfs else [])]
        return hooks + [self.path.parent / name for name in files]

    def fingerprint(
        self, *, kernel_release: str, authorized_key: str, arch: str = X86_64.name
    ) -> str:
        """Hash of everything that goes into the image: recipe, hooks, kernel, login key and
        (for another than x86_64, whose images keep their keys) the architecture."""
        h = hashlib.sha256()
        if arch != X86_64.name:
            h.update(f"arch={arch}\n".encode())
        h.update(f"builder={BUILDER_VERSION}\n".encode())
        h.update(self.path.read_bytes())
        for hook in self.hook_paths():
            h.update(f"\nhook {hook.name}\n".encode())
            h.update(hook.read_bytes())
        h.update(f"\nkernel={kernel_release}\nkey={authorized_key.strip()}\n".encode())
        if self.distro == "openeuler":
            h.update(f"repo={openeuler_repo(self)}\n".encode())
        return h.hexdigest()


def find_recipe(name: str = DEFAULT_RECIPE) -> Recipe:
    for path in sorted(qemu_dir().glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("name") == name:
            return Recipe.load(path)
    raise ImageError(f"no recipe named {name!r} under {qemu_dir()}")


def list_recipes() -> list[str]:
    names = []
    for path in sorted(qemu_dir().glob("*/*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "name" in data:
                names.append(str(data["name"]))
    return names


@dataclass(frozen=True)
class Image:
    """A built, cached image."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def disk(self) -> Path:
        return self.directory / "disk.qcow2"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def fast_initrd(self) -> Path | None:
        """The fast-boot initramfs, if the recipe makes one (obmm.testbed.builds.initramfs)."""
        path = self.directory / FAST_INITRD
        return path if path.is_file() else None

    @property
    def kernel_release(self) -> str:
        return str(self.manifest["kernel_release"])

    @property
    def arch(self) -> Arch:
        """The guest architecture (images built before the setting existed: x86_64)."""
        return arch_table.get(self.manifest.get("arch"))

    @property
    def kdir(self) -> Path | None:
        """The kernel build tree modules are built against, when the kernel is not Debian's
        (the debug kernel); None: Debian's headers package for `kernel_release`."""
        value = self.manifest.get("kdir")
        return Path(value) if value else None

    @property
    def fast_init_modules(self) -> tuple[str, ...]:
        """Modules the fast init loads before sshd: none for a kernel with them built in."""
        value = self.manifest.get("fast_init_modules")
        return FAST_INIT_MODULES if value is None else tuple(value)

    @property
    def tcg_cpu(self) -> str:
        """QEMU's -cpu for this image under TCG."""
        return str(self.manifest.get("tcg_cpu", self.arch.tcg_cpu))

    @property
    def extra_cmdline(self) -> tuple[str, ...]:
        """Kernel parameters this image's kernel needs besides qemu.kernel_cmdline's."""
        return tuple(self.manifest.get("extra_cmdline", ()))

    @property
    def host_key(self) -> str | None:
        """The guest's ssh host key line (``ssh-ed25519 AAAA...``) recorded at build."""
        value = self.manifest.get("host_key")
        return str(value) if value else None

    @property
    def ssh_key(self) -> Path:
        return Path(self.manifest["ssh_key"])

    @classmethod
    def open(cls, directory: Path) -> Image:
        manifest = json.loads((directory / "manifest.json").read_text())
        image = cls(directory, manifest)
        for f in (image.disk, image.kernel, image.initrd):
            if not f.is_file():
                raise ImageError(f"image {directory} lacks {f.name}; delete it to rebuild")
        return image


def ensure_ssh_key(cache: Path) -> Path:
    """The private key for root logins, made once per cache (so every image of it shares it)."""
    key = cache / "ssh" / "id_ed25519"
    if key.is_file() and key.with_suffix(".pub").is_file():
        return key
    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = key.parent / f".tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "obmm-testbed", "-f", str(tmp)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    os.replace(tmp.with_name(tmp.name + ".pub"), key.with_suffix(".pub"))
    os.replace(tmp, key)
    return key


def resolve_kernel_release(recipe: Recipe, arch: Arch = X86_64) -> str:
    """The exact kernel ABI release the guest gets, pinned so host-built modules match it."""
    if recipe.kernel_release != "auto":
        return recipe.kernel_release
    if recipe.distro != "debian":
        raise ImageError(f"recipe {recipe.name}: kernel_release must be set explicitly")
    if arch.debian != kheaders.host_arch():
        # A foreign architecture's kernel: the Debian archive's lists for it, kept private.
        conf = foreign_apt_config(recipe, arch)
        return kheaders.debian_kernel_release(arch.debian, recipe.suite, apt_config=conf)
    return kheaders.debian_kernel_release()


def foreign_apt_config(recipe: Recipe, arch: Arch) -> Path:
    """The private apt lists of `recipe`'s suite for `arch` (its kernel and headers)."""
    return aptlists.apt_config(recipe.suite, arch.debian, what=f"image {recipe.name} {arch.name}")


def image_dir_for(
    recipe: Recipe, cache: Path, kernel_release: str, authorized_key: str, arch: Arch = X86_64
) -> Path:
    digest = recipe.fingerprint(
        kernel_release=kernel_release, authorized_key=authorized_key, arch=arch.name
    )
    label = recipe.name if arch.name == X86_64.name else f"{recipe.name}-{arch.name}"
    return cache / "images" / f"{label}-{digest[:16]}"


def ensure_image(
    recipe: Recipe | None = None,
    *,
    cache: Path | None = None,
    rebuild: bool = False,
    progress: Progress | None = None,
    arch: str = X86_64.name,
) -> Image:
    """Return the cached image for `recipe` and `arch`, building it first if nothing matches
    its hash (booting Debian's kernel: :func:`obmm.testbed.builds.kernels.guest_image` boots
    the kernel the setting names)."""
    recipe = recipe or find_recipe()
    cache = cache or cache_dir()
    guest = arch_table.get(arch)
    key = ensure_ssh_key(cache)
    authorized_key = key.with_suffix(".pub").read_text().strip()
    release = resolve_kernel_release(recipe, guest)
    final = image_dir_for(recipe, cache, release, authorized_key, guest)
    images = final.parent
    with locked(images / ".lock"):
        if final.is_dir() and not rebuild:
            log.info("image %s: cached at %s", recipe.name, final)
            return Image.open(final)
        # Holding the lock, no other build is running: leftovers are from killed builds.
        for stale in images.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        progress = progress or Progress(f"image {recipe.name}")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=images))
        try:
            _build(
                recipe,
                tmp,
                release=release,
                key=key,
                authorized_key=authorized_key,
                progress=progress,
                arch=guest,
            )
            if final.exists():
                old = images / f".tmp-old-{final.name}-{os.getpid()}"
                final.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
        except (ImageError, StepFailed) as exc:
            # The build directory goes; its log stays where the message says.
            kept = _keep_failed_log(tmp / "build.log", cache, final.name)
            shutil.rmtree(tmp, ignore_errors=True)
            if kept is None:
                raise
            # The step's own line names the log inside the removed directory: name the copy.
            what = exc.summary.split("; log ", 1)[0]
            raise ImageError(f"{what}; build log kept at {kept}\n{exc}") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        progress.line(f"image ready at {final} ({progress.elapsed():.0f} s)")
        return Image.open(final)


def kernel_tree(image: Image) -> Path:
    """The kernel build tree `image`'s modules are built against: the debug kernel's own tree,
    else Debian's headers for its release and architecture (a foreign architecture's from
    the Debian archive's lists for it, :func:`foreign_apt_config`)."""
    if image.kdir is not None:
        return image.kdir
    guest = image.arch
    if guest.debian == kheaders.host_arch():
        return kheaders.fetch_headers(image.kernel_release)
    recipe = find_recipe(str(image.manifest.get("recipe", DEFAULT_RECIPE)))
    conf = foreign_apt_config(recipe, guest)
    return kheaders.fetch_headers(
        image.kernel_release, guest.debian, suite=recipe.suite, apt_config=conf
    )


def _keep_failed_log(log: Path, cache: Path, name: str) -> Path | None:
    """Copy a failed build's log to <cache>/logs/ (the build directory is removed)."""
    if not log.is_file():
        return None
    dest = cache / "logs" / f"image-{name}-failed-{time.strftime('%Y%m%dT%H%M%S')}.log"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, dest)
    except OSError:
        return None
    return dest


@dataclass(frozen=True)
class BootKernel:
    """A kernel the nodes boot instead of the image's own: built with every driver the guests
    boot with built in (the image's /lib/modules are Debian's), so no module is loaded before
    ours, which build against its tree."""

    release: str
    bzimage: Path
    #: The build tree external modules are built against (``make -C``).
    kdir: Path
    #: Where its image variants are kept (``<home>/images/<image>``).
    home: Path
    #: Added to the image's fingerprint, so boot snapshots of two kernels never mix.
    tag: str
    #: Manifest keys of its own (the debug kernel's marks its clusters for the kmemleak scan).
    extra: dict[str, str] = field(default_factory=dict)


def debug_variant(image: Image) -> Image:
    """`image` booting the debug kernel (`make debug-kernel`)."""
    kernel = debugkernel.cached()
    if kernel is None:
        raise debugkernel.DebugKernelError(
            f"the debug kernel for {debugkernel.SOURCE_PACKAGE}={debugkernel.source_version()} "
            f"and {debugkernel.FRAGMENT} is not "
            "built: run `make debug-kernel` first"
        )
    boot = BootKernel(
        release=kernel.release,
        bzimage=kernel.bzimage,
        kdir=kernel.kdir,
        home=kernel.root,
        tag=f"debug-{kernel.root.name}",
        extra={"debug_kernel": str(kernel.root)},
    )
    return kernel_variant(image, boot)


def kernel_variant(image: Image, kernel: BootKernel) -> Image:
    """`image` booting `kernel`: a directory beside the kernel that Image.open reads like any
    image (so a cluster's saved state reopens it), sharing the image's disk.

    Its fingerprint differs from the image's, so boot snapshots of the two never mix; its
    fast initramfs loads no modules (the root disk's drivers are built in) and neither does
    the fast init (``fast_init_modules``); modules are built against the kernel's own tree."""
    manifest = dict(image.manifest)
    manifest.update(
        {
            "kernel_release": kernel.release,
            "fingerprint": f"{image.manifest.get('fingerprint', image.directory.name)}"
            f"+{kernel.tag}",
            "kdir": str(kernel.kdir),
            "fast_init_modules": [],
            # QEMU's "max" CPU under TCG is an AMD family 0xf part, so the kernel picks the
            # AMD E400 idle routine; on the debug kernel the guest then halts in early boot
            # for good (reproduced: RIP in amd_e400_idle after "Running RCU-tasks wait API
            # self tests", 3 of 3 full-device boots; with idle=halt 2 of 2 reach sshd).
            # log_buf_len: a fuzz campaign on it logs a few MB of refusal lines per node; the
            # default 128 KiB ring lost its marker and its one WARN before the host's kernel-log
            # guard read it (obmm.testbed.vm.kguard), leaving a W taint it could not explain.
            "extra_cmdline": ["idle=halt", "log_buf_len=16M"],
            # No LA57: identify_cpu() clears the boot CPU's capability words (LA57 with them)
            # before it reads them again, and KASAN, asked in that window by an interrupt,
            # takes the 5-level direct map for a wild address (seen: "BUG: KASAN:
            # wild-memory-access in do_raw_spin_lock" from handle_edge_irq in identify_cpu,
            # at 0.8 s, in 1 of 8 cold boots).  4-level paging has no such window.  (Not the
            # kernel's no5lvl: a bare word it does not know goes to init's argv.)
            "tcg_cpu": "max,la57=off",
            "base_image": str(image.directory),
            **kernel.extra,
        }
    )
    final = kernel.home / "images" / image.directory.name
    if final.is_dir():
        try:
            if json.loads((final / "manifest.json").read_text()) == manifest:
                return Image.open(final)
        except (OSError, json.JSONDecodeError):
            pass
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        (tmp / "disk.qcow2").symlink_to(image.disk)
        (tmp / "vmlinuz").symlink_to(kernel.bzimage)
        (tmp / "initrd.img").symlink_to(image.initrd)
        if image.fast_initrd is not None:
            initramfs.without_modules(image.fast_initrd, tmp / FAST_INITRD)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "image %s on kernel %s (%s): %s", image.directory.name, kernel.release, kernel.tag, final
    )
    return Image.open(final)


def _build(
    recipe: Recipe,
    out: Path,
    *,
    release: str,
    key: Path,
    authorized_key: str,
    progress: Progress,
    arch: Arch = X86_64,
) -> None:
    start = time.monotonic()
    logfile = out / "build.log"
    rootfs = out / "rootfs"
    env = {
        **os.environ,
        envvars.AUTHORIZED_KEY.name: authorized_key,
        envvars.KERNEL_RELEASE.name: release,
    }
    try:
        if recipe.distro == "debian":
            _bootstrap_debian(recipe, rootfs, release, logfile, env, progress, arch)
        elif recipe.distro == "openeuler" and arch.name == X86_64.name:
            _bootstrap_openeuler(recipe, rootfs, release, logfile, env, progress)
        else:
            raise ImageError(f"recipe {recipe.name}: unknown distro {recipe.distro!r}")
    finally:
        # mmdebstrap only warns when it cannot unmount the chroot's /sys, /proc or /dev ("target
        # is busy"): mke2fs -d would then copy a live sysfs (and fail on it), and the clean-up's
        # rmtree would walk into the host's /dev.  Detach what is left first.
        for point in _detach_mounts_under(rootfs):
            progress.line(f"detached {point} left mounted by the bootstrap")

    boot = rootfs / "boot"
    kernel = boot / f"vmlinuz-{release}"
    initrd = boot / f"initrd.img-{release}"
    if recipe.distro == "openeuler":
        initrd = boot / f"initramfs-{release}.img"
    for f in (kernel, initrd):
        if not f.is_file():
            raise ImageError(f"the recipe did not produce {f.relative_to(rootfs)}")
    shutil.copy2(kernel, out / "vmlinuz")
    shutil.copy2(initrd, out / "initrd.img")
    if recipe.fast_initramfs:
        initramfs.build(
            rootfs, release, recipe.path.parent / recipe.fast_initramfs, out / FAST_INITRD
        )
    host_key_file = rootfs / "etc/ssh/ssh_host_ed25519_key.pub"
    host_key = " ".join(host_key_file.read_text().split()[:2]) if host_key_file.is_file() else ""

    used_mib = _tree_size(rootfs) >> 20
    # ext4 metadata and a few percent slack on top of the files, plus room for the guest.
    size_mib = int(used_mib * 1.15) + 64 + recipe.free_space_mib
    raw = out / "disk.raw"
    progress.run(
        "mke2fs",
        [
            "mke2fs",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-L",
            "obmm-root",
            "-d",
            str(rootfs),
            str(raw),
            f"{size_mib}M",
        ],
        logfile,
    )
    shutil.rmtree(rootfs)
    progress.run(
        "qemu-img convert",
        ["qemu-img", "convert", "-O", "qcow2", str(raw), str(out / "disk.qcow2")],
        logfile,
    )
    raw.unlink()
    manifest = {
        "recipe": recipe.name,
        "recipe_path": str(recipe.path),
        "fingerprint": recipe.fingerprint(
            kernel_release=release, authorized_key=authorized_key, arch=arch.name
        ),
        "kernel_release": release,
        "arch": arch.name,
        "host_key": host_key,
        "ssh_key": str(key),
        "disk_size_mib": size_mib,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.monotonic() - start, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def mmdebstrap_argv(recipe: Recipe, rootfs: Path, release: str, arch: Arch = X86_64) -> list[str]:
    """The mmdebstrap command for a Debian recipe (pure; unit-tested)."""
    packages = [f"linux-image-{release}", f"linux-headers-{release}", *recipe.packages]
    argv = [
        "mmdebstrap",
        f"--variant={recipe.variant}",
        "--mode=auto",
        # A foreign architecture's maintainer scripts run under qemu-user (binfmt_misc).
        *([] if arch.name == X86_64.name else [f"--architectures={arch.debian}"]),
        "--include=" + ",".join(packages),
        '--aptopt=Acquire::Retries "3"',
    ]
    ess = recipe.hook_path(recipe.essential_hook)
    if ess is not None:
        argv.append(f'--essential-hook=sh {ess} "$1"')
    cust = recipe.hook_path(recipe.customize_hook)
    if cust is not None:
        argv.append(f'--customize-hook=sh {cust} "$1"')
    mirrors = list(recipe.mirrors)
    override = envvars.DEBIAN_MIRROR.raw()
    if override:
        # Same suites and components, another mirror (e.g. a local apt cache).
        mirrors = [_swap_mirror(line, override) for line in mirrors]
    argv += [recipe.suite, str(rootfs), *mirrors]
    return argv


def _swap_mirror(line: str, mirror: str) -> str:
    parts = line.split()
    if len(parts) >= 2 and parts[0] == "deb" and "security" not in parts[1]:
        parts[1] = mirror
    return " ".join(parts)


def mounts_under(root: Path, mountinfo: str) -> list[Path]:
    """The mount points at or below `root` in a /proc/self/mountinfo text, deepest first (pure)."""
    prefix = str(root).rstrip("/")
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        # Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
        point = fields[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def _detach_mounts_under(root: Path) -> list[Path]:
    """Lazily unmount everything mounted at or below `root`; returns what it detached."""
    points = mounts_under(root.resolve(), Path("/proc/self/mountinfo").read_text())
    for point in points:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
    return points


def _bootstrap_debian(
    recipe: Recipe,
    rootfs: Path,
    release: str,
    logfile: Path,
    env: dict[str, str],
    progress: Progress,
    arch: Arch = X86_64,
) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed (run `make setup` as root)")
    if arch.binfmt and not binfmt_enabled(arch.binfmt):
        raise ImageError(
            f"an {arch.name} image runs its packages' scripts under qemu-user, but binfmt_misc "
            f"has no enabled {arch.binfmt} entry (run `make setup` as root: qemu-user-static, "
            f"binfmt-support, update-binfmts --enable {arch.binfmt})"
        )
    argv = mmdebstrap_argv(recipe, rootfs, release, arch)
    try:
        progress.run("mmdebstrap", argv, logfile, env=env)
    except StepFailed:
        # Most failures of a recipe that built before are the mirror's (a fetch cut short);
        # one more try, into an empty target, before giving up.
        progress.line("mmdebstrap failed; retrying once (see the log for the first attempt)")
        shutil.rmtree(rootfs, ignore_errors=True)
        progress.run("mmdebstrap", argv, logfile, env=env)


def binfmt_enabled(entry: str, root: Path = BINFMT_MISC) -> bool:
    """True when binfmt_misc runs `entry`'s binaries (through qemu-user)."""
    try:
        return (root / entry).read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False


def openeuler_repo(recipe: Recipe) -> str:
    url = envvars.OPENEULER_REPO.raw() or recipe.repo_url
    if not url:
        # No default on purpose: this machine (and CI) may only talk to its own
        # guests and loopback, so contacting a repository is always the user's choice.
        raise ImageError(
            f"recipe {recipe.name}: no repository URL; set {envvars.OPENEULER_REPO.name} to a "
            "mirror of openEuler 24.03 LTS (e.g. https://repo.openeuler.org/openEuler-24.03-LTS)"
        )
    return url.rstrip("/")


def probe_repository(url: str, timeout: float = REPO_PROBE_TIMEOUT_S) -> None:
    """Fail fast (seconds, not a dnf retry loop) when an rpm repository is unreachable."""
    probe = f"{url}/repodata/repomd.xml"
    try:
        with urllib.request.urlopen(probe, timeout=timeout) as resp:
            resp.read(1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ImageError(
            f"openEuler repository unreachable: {probe}: {exc}.\n"
            f"Set {envvars.OPENEULER_REPO.name} to a reachable mirror of openEuler 24.03 LTS "
            "(the directory holding OS/ and everything/), or use the Debian image "
            "(the default). See docs/testbed.md, 'openEuler 24.03 LTS'."
        ) from exc


def _bootstrap_openeuler(
    recipe: Recipe,
    rootfs: Path,
    release: str,
    logfile: Path,
    env: dict[str, str],
    progress: Progress,
) -> None:
    base = openeuler_repo(recipe)
    arch = os.uname().machine
    repos = {
        "oe-os": f"{base}/OS/{arch}",
        "oe-everything": f"{base}/everything/{arch}",
        "oe-update": f"{base}/update/{arch}",
    }
    probe_repository(repos["oe-os"])
    if shutil.which("dnf") is None:
        raise ImageError(
            "dnf is not installed on this host; the openEuler recipe needs it "
            "(`apt-get install dnf` on Debian; see docs/testbed.md)"
        )
    version = str(recipe.extra.get("kernel_version", release))
    packages = [f"kernel-{version}", f"kernel-devel-{version}", *recipe.packages]
    argv = [
        "dnf",
        "-y",
        f"--installroot={rootfs}",
        f"--releasever={recipe.suite}",
        "--setopt=install_weak_deps=False",
        "--disablerepo=*",
        "--nogpgcheck",
    ]
    for rid, url in repos.items():
        argv += [f"--repofrompath={rid},{url}", f"--enablerepo={rid}"]
    argv += ["install", *packages]
    rootfs.mkdir(parents=True)
    progress.run("dnf --installroot", argv, logfile, env=env)
    cust = recipe.hook_path(recipe.customize_hook)
    if cust is not None:
        progress.run("customize", ["sh", str(cust), str(rootfs)], logfile, env=env)


def create_overlay(image: Image, path: Path) -> None:
    """A copy-on-write qcow2 on top of the base image: nodes write there, never to the base."""
    subprocess.run(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            str(image.disk),
            str(path),
        ],
        check=True,
        capture_output=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Debug entry point: ``python -m obmm.testbed.builds.image [--recipe NAME] [--rebuild]``."""
    parser = argparse.ArgumentParser(prog="python -m obmm.testbed.builds.image")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=list_recipes())
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        image = ensure_image(find_recipe(args.recipe), rebuild=args.rebuild)
    except (ImageError, StepFailed) as exc:
        log.error("%s", exc)
        return 1
    print(image.directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
