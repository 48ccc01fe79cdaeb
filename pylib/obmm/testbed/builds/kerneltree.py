"""A guest kernel from a tree given by path (``OBMM_TESTBED_KERNEL=/path/to/linux``): the user's
own build, an OLK checkout say, booted by the nodes on the image's disk; the modules build
against that tree.

The tree must be built (``make bzImage modules``: the image, ``Module.symvers``,
``include/config/kernel.release``) with everything the guests boot with built in, since the
image's ``/lib/modules`` are Debian's kernel's: :data:`NEEDED` is that list, checked in the
tree's ``.config`` before anything boots (the debug kernel's fragment builds the same ones in;
a host test holds the two together).  Nothing is copied out of the tree: its image variant
links to the tree's bzImage and is keyed by the tree's path, release and bzImage.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.arch import X86_64, Arch
from obmm.testbed.builds import debugkernel
from obmm.testbed.builds.image import BootKernel, ImageError

#: What a guest needs built in (``=y``): the root disk, the hub's network, the entropy source,
#: the fast init's filesystems, and what the emulator and the suites use (hugetlbfs, THP,
#: NUMA with memory hot-add and hot-remove for borrowing, debugfs, the serial console).
NEEDED = (
    "CONFIG_MODULES",
    "CONFIG_MODULE_UNLOAD",
    "CONFIG_PCI",
    "CONFIG_VIRTIO_PCI",
    "CONFIG_VIRTIO_BLK",
    "CONFIG_VIRTIO_NET",
    "CONFIG_HW_RANDOM_VIRTIO",
    "CONFIG_EXT4_FS",
    "CONFIG_BLK_DEV_INITRD",
    "CONFIG_DEVTMPFS",
    "CONFIG_TMPFS",
    "CONFIG_HUGETLBFS",
    "CONFIG_TRANSPARENT_HUGEPAGE",
    "CONFIG_NUMA",
    "CONFIG_MEMORY_HOTPLUG",
    "CONFIG_MEMORY_HOTREMOVE",
    "CONFIG_UNIX",
    "CONFIG_INET",
    "CONFIG_DEBUG_FS",
    "CONFIG_SERIAL_8250_CONSOLE",
)


class KernelTreeError(ImageError):
    """The tree given by path cannot be booted; the message says what is missing."""


def _config(tree: Path) -> dict[str, str]:
    have: dict[str, str] = {}
    for name, value in debugkernel.parse_fragment((tree / ".config").read_text()).items():
        if value is not None:
            have[name] = value
    return have


def load(path: Path, arch: Arch = X86_64) -> BootKernel:
    """The kernel of the built tree at `path`, checked; KernelTreeError names what is not
    there (one line, with what to do)."""
    tree = path.expanduser()
    where = f"kernel tree {tree}"
    if arch.name != X86_64.name:
        raise KernelTreeError(f"{where}: a kernel tree boots x86_64 nodes only, not {arch.name}")
    if not tree.is_dir():
        raise KernelTreeError(f"{where}: no such directory")
    if not (tree / ".config").is_file():
        raise KernelTreeError(f"{where}: no .config (configure and build it first)")
    bzimage = tree / "arch" / "x86" / "boot" / "bzImage"
    release_file = tree / "include" / "config" / "kernel.release"
    for need in (bzimage, release_file, tree / "Module.symvers"):
        if not need.is_file():
            raise KernelTreeError(
                f"{where}: no {need.relative_to(tree)} (run `make bzImage modules` in it)"
            )
    have = _config(tree)
    missing = [name for name in NEEDED if have.get(name) != "y"]
    if missing:
        raise KernelTreeError(
            f"{where}: the guests need these built in (=y), its .config has not: "
            + ", ".join(missing)
        )
    release = release_file.read_text().strip()
    stat = bzimage.stat()
    key = f"{tree.resolve()}\n{release}\n{stat.st_size}\n{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return BootKernel(
        release=release,
        bzimage=bzimage,
        kdir=tree,
        home=paths.cache_dir() / "kernel-trees" / digest,
        tag=f"tree-{digest}",
    )
