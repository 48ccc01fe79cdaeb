"""The fast-boot initramfs: module order from kmod, the archive's contents, clear failures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from obmm.testbed.builds import initramfs
from obmm.testbed.builds.image import find_recipe

# A stand-in for kmod's modprobe: prints what --show-depends would for three modules.
FAKE_MODPROBE = """#!/bin/sh
m=$3/lib/modules/r
case "$6" in
virtio_blk) echo "insmod $m/virtio.ko"; echo "insmod $m/virtio_blk.ko" ;;
virtio_pci) echo "insmod $m/virtio.ko"; echo "insmod $m/virtio_pci.ko" ;;
crc32c_generic) echo "builtin crc32c_generic" ;;
ext4) echo "insmod /lib/modules/r/jbd2.ko"; echo "insmod /lib/modules/r/ext4.ko " ;;
*) echo "modprobe: FATAL: Module $6 not found" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def rootfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "modprobe").write_text(FAKE_MODPROBE)
    (bindir / "modprobe").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    root = tmp_path / "root"
    mods = root / "lib" / "modules" / "r"
    mods.mkdir(parents=True)
    for name in ("virtio", "virtio_blk", "virtio_pci", "jbd2", "ext4"):
        (mods / f"{name}.ko").write_bytes(name.encode())
    (root / "bin").mkdir()
    (root / "bin" / "busybox").write_bytes(b"busybox")
    return root


def test_load_order_puts_dependencies_first_once_and_inside_the_image(rootfs: Path) -> None:
    order = initramfs.module_load_order(rootfs, "r", initramfs.ROOT_MODULES)
    names = [ko.name for ko in order]
    assert names == ["virtio.ko", "virtio_pci.ko", "virtio_blk.ko", "jbd2.ko", "ext4.ko"]
    assert all(ko.is_relative_to(rootfs) for ko in order)


def test_unknown_module_fails_with_kmods_reason(rootfs: Path) -> None:
    with pytest.raises(initramfs.InitramfsError, match=r"nosuch.*not found"):
        initramfs.module_load_order(rootfs, "r", ("nosuch",))


def test_archive_holds_init_busybox_and_the_modules_in_order(rootfs: Path, tmp_path: Path) -> None:
    out = tmp_path / "initrd-fast.img"
    init = find_recipe().path.parent / "initramfs-init"
    initramfs.build(rootfs, "r", init, out)
    listing = subprocess.run(
        ["cpio", "-t", "--quiet"], input=out.read_bytes(), capture_output=True, check=True
    ).stdout.decode()
    assert set(listing.split()) >= {"init", "bin/busybox", "lib/modules/ext4.ko"}
    extract = tmp_path / "x"
    extract.mkdir()
    subprocess.run(["cpio", "-id", "--quiet"], cwd=extract, input=out.read_bytes(), check=True)
    assert (extract / "init").read_bytes() == init.read_bytes()
    assert (extract / "init").stat().st_mode & 0o111
    order = (extract / "lib" / "modules" / "load-order").read_text().split()
    assert order == ["virtio.ko", "virtio_pci.ko", "virtio_blk.ko", "jbd2.ko", "ext4.ko"]


def test_image_without_busybox_is_refused_with_the_package_to_add(
    rootfs: Path, tmp_path: Path
) -> None:
    (rootfs / "bin" / "busybox").unlink()
    with pytest.raises(initramfs.InitramfsError, match="busybox-static"):
        initramfs.build(rootfs, "r", tmp_path / "init", tmp_path / "out.img")


def test_compressed_modules_are_refused(rootfs: Path, tmp_path: Path) -> None:
    ext4 = rootfs / "lib" / "modules" / "r" / "ext4.ko"
    ext4.rename(ext4.with_suffix(".ko.xz"))
    (rootfs.parent / "bin" / "modprobe").write_text(FAKE_MODPROBE.replace("ext4.ko ", "ext4.ko.xz"))
    with pytest.raises(initramfs.InitramfsError, match="compressed"):
        initramfs.build(rootfs, "r", tmp_path / "init", tmp_path / "out.img")
