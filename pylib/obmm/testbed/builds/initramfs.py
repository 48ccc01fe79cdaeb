"""The fast-boot initramfs: busybox, the modules that mount the root disk, and our /init.

Debian's initramfs starts udev and runs its script framework before the root is mounted:
about 2.3 s of a TCG boot.  The fast boot (`init=fast`) uses this one instead, built from the
image's own files at image build time, so the modules always match the image's kernel:

    /init                    the recipe's `fast_initramfs` script (qemu/debian/initramfs-init)
    /bin/busybox             the image's busybox-static (it installs its applets at boot)
    /lib/modules/*.ko        the root disk's drivers and their dependencies, in load order
    /lib/modules/load-order  that order, one file name a line

The archive is an uncompressed newc cpio (`cpio`), so the kernel does not decompress it.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

from obmm.testbed.errors import TestbedError

log = logging.getLogger(__name__)

# What mounting /dev/vda (virtio-blk, ext4) needs; ext4 asks the crypto API for crc32c.
ROOT_MODULES = ("virtio_pci", "virtio_blk", "crc32c_generic", "ext4")
BUSYBOX = "bin/busybox"


class InitramfsError(TestbedError, RuntimeError):
    """The image lacks something the fast-boot initramfs needs."""


def module_load_order(rootfs: Path, release: str, modules: tuple[str, ...]) -> list[Path]:
    """The .ko files (inside `rootfs`) that load `modules`, dependencies first, each once."""
    order: list[Path] = []
    for name in modules:
        out = subprocess.run(
            ["modprobe", "--show-depends", "-d", str(rootfs), "-S", release, name],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise InitramfsError(f"modprobe --show-depends {name}: {out.stderr.strip()}")
        for line in out.stdout.splitlines():
            words = line.split()
            # "builtin NAME" needs nothing; "insmod PATH [params]" is one file to load.
            if len(words) >= 2 and words[0] == "insmod":
                # kmod prints the path under -d already; older versions printed it without.
                ko = Path(words[1])
                if not ko.is_relative_to(rootfs):
                    ko = rootfs / words[1].lstrip("/")
                if ko not in order:
                    order.append(ko)
    return order


def build(rootfs: Path, release: str, init_script: Path, out: Path) -> None:
    """Write the fast-boot initramfs of the image whose root file system is `rootfs`."""
    busybox = rootfs / BUSYBOX
    if not busybox.is_file():
        raise InitramfsError(f"the image has no {BUSYBOX} (the recipe must install busybox-static)")
    kos = module_load_order(rootfs, release, ROOT_MODULES)
    for ko in kos:
        if ko.suffix != ".ko":
            # busybox insmod reads plain modules only (Debian 12's are not compressed).
            raise InitramfsError(f"{ko.name}: compressed modules are not supported")
    with tempfile.TemporaryDirectory(prefix="initramfs-") as tmp:
        stage = Path(tmp)
        (stage / "bin").mkdir()
        (stage / "lib" / "modules").mkdir(parents=True)
        shutil.copy2(busybox, stage / BUSYBOX)
        shutil.copy2(init_script, stage / "init")
        (stage / "init").chmod(0o755)
        names = []
        for ko in kos:
            shutil.copy2(ko, stage / "lib" / "modules" / ko.name)
            names.append(ko.name)
        (stage / "lib" / "modules" / "load-order").write_text("\n".join(names) + "\n")
        _pack(stage, out)
    log.info("initramfs %s: %d modules (%s)", out, len(names), ", ".join(names))


def _pack(stage: Path, out: Path) -> None:
    """`stage` as a newc cpio archive owned by root, in `out`."""
    files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
    with out.open("wb") as fh:
        subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"],
            cwd=stage,
            input="\n".join(files).encode() + b"\n",
            stdout=fh,
            check=True,
        )


def without_modules(src: Path, out: Path) -> None:
    """`src` (a fast-boot initramfs) with no modules to load, for a kernel that has the root
    disk's drivers built in (the debug kernel): Debian's .ko files would not load into it."""
    with tempfile.TemporaryDirectory(prefix="initramfs-") as tmp, src.open("rb") as archive:
        stage = Path(tmp)
        subprocess.run(
            ["cpio", "--quiet", "-i", "-d", "-m", "--no-absolute-filenames"],
            cwd=stage,
            stdin=archive,
            check=True,
        )
        modules = stage / "lib" / "modules"
        if not (stage / "init").is_file() or not (modules / "load-order").is_file():
            raise InitramfsError(f"{src} is not a fast-boot initramfs (no /init or load-order)")
        for ko in modules.glob("*.ko"):
            ko.unlink()
        (modules / "load-order").write_text("")
        _pack(stage, out)
