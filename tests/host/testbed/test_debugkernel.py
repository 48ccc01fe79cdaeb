"""The guest kernel providers' host side: the debug kernel (config checks, cache key, the image
variant, kmemleak) and a kernel tree given by path."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from obmm.bench.local import LocalNode
from obmm.testbed import paths
from obmm.testbed.arch import ARM64
from obmm.testbed.builds import debugkernel, image, initramfs, kbuild, kernels, kerneltree
from obmm.testbed.settings import Settings, SettingsError
from obmm.testbed.ssh import Result
from obmm.testbed.topology import Topology
from obmm.testbed.vm import kmemleak, qemu
from obmm.testbed.vm.cluster import boot_timeout

FRAGMENT = paths.qemu_dir() / debugkernel.FRAGMENT


def test_fragment_asks_for_every_debug_option_of_the_issue() -> None:
    wanted = debugkernel.parse_fragment(FRAGMENT.read_text())
    for name in (
        "KASAN",
        "KASAN_INLINE",
        "KASAN_VMALLOC",
        "KFENCE",
        "PROVE_LOCKING",
        "DEBUG_ATOMIC_SLEEP",
        "DEBUG_OBJECTS",
        "DEBUG_KMEMLEAK",
        "UBSAN_BOUNDS",
        "FAILSLAB",
        "FAIL_PAGE_ALLOC",
        "FAULT_INJECTION_DEBUG_FS",
        # what the guests boot with, built in (the rootfs has no modules for this kernel)
        "VIRTIO_PCI",
        "VIRTIO_BLK",
        "VIRTIO_NET",
        "HW_RANDOM_VIRTIO",
        "EXT4_FS",
        "HUGETLBFS",
        "TRANSPARENT_HUGEPAGE",
        "MEMORY_HOTPLUG",
        "MODULES",
        "MODULE_UNLOAD",
    ):
        assert wanted[f"CONFIG_{name}"] == "y", name
    # Scanned on purpose after the suites, not by the background thread.
    assert wanted["CONFIG_DEBUG_KMEMLEAK_AUTO_SCAN"] is None


def test_config_mismatches_name_dropped_and_unwanted_options() -> None:
    wanted = debugkernel.parse_fragment(
        'CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C="x"\nCONFIG_D=y\n'
    )
    final = 'CONFIG_A=y\nCONFIG_B=y\nCONFIG_C="x"\n# CONFIG_D is not set\n'
    assert debugkernel.config_mismatches(wanted, final) == [
        "CONFIG_B: wanted unset, got y",
        "CONFIG_D: wanted y, got unset",
    ]
    assert debugkernel.config_mismatches(wanted, 'CONFIG_A=y\nCONFIG_C="x"\nCONFIG_D=y\n') == []


def test_cache_key_follows_source_version_and_config() -> None:
    key = debugkernel.cache_key("6.1.1-1", "CONFIG_A=y\n")
    assert key.startswith("6.1.1-1-")
    assert key == debugkernel.cache_key("6.1.1-1", "CONFIG_A=y\n")
    assert key != debugkernel.cache_key("6.1.2-1", "CONFIG_A=y\n")
    assert key != debugkernel.cache_key("6.1.1-1", "CONFIG_A=n\n")


def _fake_kernel(cache: Path, version: str) -> Path:
    root = cache / "debug-kernel" / debugkernel.cache_key(version, FRAGMENT.read_text())
    (root / debugkernel.SOURCE_PACKAGE).mkdir(parents=True)
    (root / "bzImage").write_bytes(b"kernel")
    (root / debugkernel.MANIFEST).write_text(
        json.dumps({"version": version, "release": "6.1.99-obmm-debug", "build_seconds": 1.0})
    )
    return root


def _fast_initrd(path: Path, stage: Path) -> None:
    (stage / "bin").mkdir(parents=True)
    (stage / "lib" / "modules").mkdir(parents=True)
    (stage / "init").write_text("#!/bin/busybox sh\n")
    (stage / "bin" / "busybox").write_bytes(b"bb")
    (stage / "lib" / "modules" / "virtio.ko").write_bytes(b"ko")
    (stage / "lib" / "modules" / "load-order").write_text("virtio.ko\n")
    files = "\n".join(str(p.relative_to(stage)) for p in sorted(stage.rglob("*"))) + "\n"
    with path.open("wb") as out:
        subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc"],
            cwd=stage,
            input=files.encode(),
            stdout=out,
            check=True,
        )


def _listing(path: Path) -> list[str]:
    out = subprocess.run(
        ["cpio", "-t", "--quiet"], input=path.read_bytes(), capture_output=True, check=True
    )
    return out.stdout.decode().split()


def test_initramfs_without_modules_keeps_init_and_busybox(tmp_path: Path) -> None:
    src = tmp_path / "fast.img"
    _fast_initrd(src, tmp_path / "stage")
    out = tmp_path / "nomod.img"
    initramfs.without_modules(src, out)
    names = _listing(out)
    assert "init" in names and "bin/busybox" in names and "lib/modules/load-order" in names
    assert not [n for n in names if n.endswith(".ko")]


def test_initramfs_without_modules_rejects_other_archives(tmp_path: Path) -> None:
    stage = tmp_path / "s"
    stage.mkdir()
    (stage / "x").write_text("x")
    src = tmp_path / "other.img"
    with src.open("wb") as out:
        subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=stage, input=b"x\n", stdout=out)
    with pytest.raises(initramfs.InitramfsError, match="not a fast-boot initramfs"):
        initramfs.without_modules(src, tmp_path / "out.img")


@pytest.fixture
def base_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> image.Image:
    monkeypatch.setenv("OBMM_TESTBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(debugkernel, "source_version", lambda: "6.1.99-1")
    directory = tmp_path / "images" / "debian-bookworm-0123"
    directory.mkdir(parents=True)
    for name in ("disk.qcow2", "vmlinuz", "initrd.img"):
        (directory / name).write_bytes(b"x")
    _fast_initrd(directory / image.FAST_INITRD, tmp_path / "stage")
    manifest = {"kernel_release": "6.1.0-57-amd64", "fingerprint": "abc", "ssh_key": "/k"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return image.Image.open(directory)


def test_variant_image_boots_the_debug_kernel_on_the_same_disk(
    base_image: image.Image, tmp_path: Path
) -> None:
    root = _fake_kernel(tmp_path / "cache", "6.1.99-1")
    got = image.debug_variant(base_image)
    assert got.kernel.resolve() == root / "bzImage"
    assert got.disk.resolve() == base_image.disk
    assert got.kernel_release == "6.1.99-obmm-debug"
    assert got.kdir == root / debugkernel.SOURCE_PACKAGE
    assert got.fast_init_modules == ()
    assert "idle=halt" in got.extra_cmdline
    assert got.tcg_cpu == "max,la57=off"  # no 5-level paging under KASAN
    assert base_image.tcg_cpu == "max"
    # Boot snapshots are keyed by the fingerprint: the two kernels' must never mix.
    assert got.manifest["fingerprint"] != base_image.manifest["fingerprint"]
    assert got.fast_initrd is not None
    assert not [n for n in _listing(got.fast_initrd) if n.endswith(".ko")]
    # A saved cluster state reopens it like any image; a second call reuses it.
    assert image.Image.open(got.directory).kernel_release == "6.1.99-obmm-debug"
    assert image.debug_variant(base_image).directory == got.directory
    assert base_image.fast_init_modules == qemu.FAST_INIT_MODULES
    assert base_image.kdir is None
    assert base_image.extra_cmdline == ()


def test_variant_image_without_a_built_kernel_says_how_to_build_it(
    base_image: image.Image,
) -> None:
    with pytest.raises(debugkernel.DebugKernelError, match="make debug-kernel"):
        image.debug_variant(base_image)


def test_kernel_knob_selects_the_variant_and_rejects_unknown_values(
    base_image: image.Image, tmp_path: Path
) -> None:
    _fake_kernel(tmp_path / "cache", "6.1.99-1")
    assert kernels.provider("debian").boots(base_image) is base_image
    assert kernels.provider("debug").boots(base_image).kernel_release == "6.1.99-obmm-debug"
    with pytest.raises(image.ImageError, match="kernel 'vanilla': expected debian or debug"):
        kernels.provider("vanilla")
    with pytest.raises(image.ImageError, match="kernel 'vanilla'"):
        kernels.guest_image(kernel="vanilla")  # before any image is looked for


def _fake_tree(root: Path, config: str | None = None) -> Path:
    """A built kernel tree as `make bzImage modules` leaves one (only what the provider reads)."""
    (root / "arch" / "x86" / "boot").mkdir(parents=True)
    (root / "include" / "config").mkdir(parents=True)
    (root / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"tree kernel")
    (root / "include" / "config" / "kernel.release").write_text("6.6.0-olk+\n")
    (root / "Module.symvers").write_text("")
    if config is None:
        config = "".join(f"{name}=y\n" for name in kerneltree.NEEDED) + 'CONFIG_LOCALVERSION="+"\n'
    (root / ".config").write_text(config)
    return root


def test_a_tree_given_by_path_boots_on_the_image_and_builds_the_modules(
    base_image: image.Image, tmp_path: Path
) -> None:
    tree = _fake_tree(tmp_path / "olk")
    got = kernels.provider(str(tree)).boots(base_image)
    assert got.kernel.resolve() == tree / "arch" / "x86" / "boot" / "bzImage"
    assert got.disk.resolve() == base_image.disk
    assert got.kernel_release == "6.6.0-olk+"
    assert got.kdir == tree
    assert got.fast_init_modules == ()
    assert got.fast_initrd is not None
    assert not [n for n in _listing(got.fast_initrd) if n.endswith(".ko")]
    assert "debug_kernel" not in got.manifest  # no kmemleak scan expected of it
    # Snapshots of its boots never mix with the image's or the debug kernel's.
    _fake_kernel(tmp_path / "cache", "6.1.99-1")
    debug = kernels.provider("debug").boots(base_image)
    fingerprints = {base_image.manifest["fingerprint"], debug.manifest["fingerprint"]}
    assert got.manifest["fingerprint"] not in fingerprints
    assert kernels.provider(str(tree)).boots(base_image).directory == got.directory
    # A rebuilt bzImage is another kernel: another variant.
    (tree / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"rebuilt kernel!")
    assert kernels.provider(str(tree)).boots(base_image).directory != got.directory


@pytest.mark.parametrize(
    ("remove", "says"),
    [
        (".config", "no .config"),
        ("arch/x86/boot/bzImage", "no arch/x86/boot/bzImage (run `make bzImage modules` in it)"),
        ("Module.symvers", "no Module.symvers (run `make bzImage modules` in it)"),
        ("include/config/kernel.release", "no include/config/kernel.release"),
    ],
)
def test_an_unbuilt_tree_is_refused_before_anything_boots(
    base_image: image.Image, tmp_path: Path, remove: str, says: str
) -> None:
    tree = _fake_tree(tmp_path / "olk")
    (tree / remove).unlink()
    with pytest.raises(kerneltree.KernelTreeError, match=re.escape(f"kernel tree {tree}: {says}")):
        kernels.provider(str(tree)).boots(base_image)
    assert not (tmp_path / "cache" / "kernel-trees").exists()


def test_a_tree_without_the_guests_drivers_built_in_names_them(
    base_image: image.Image, tmp_path: Path
) -> None:
    config = "".join(f"{n}=y\n" for n in kerneltree.NEEDED if n != "CONFIG_VIRTIO_BLK")
    config = config.replace("CONFIG_EXT4_FS=y", "CONFIG_EXT4_FS=m")
    tree = _fake_tree(tmp_path / "olk", config)
    with pytest.raises(kerneltree.KernelTreeError) as err:
        kernels.provider(str(tree)).boots(base_image)
    assert str(err.value).endswith("its .config has not: CONFIG_VIRTIO_BLK, CONFIG_EXT4_FS")
    with pytest.raises(kerneltree.KernelTreeError, match="no such directory"):
        kernels.provider(str(tmp_path / "nowhere")).boots(base_image)
    with pytest.raises(kerneltree.KernelTreeError, match="x86_64 nodes only, not arm64"):
        kerneltree.load(_fake_tree(tmp_path / "other"), ARM64)


def test_the_debug_kernel_builds_in_what_a_tree_must() -> None:
    wanted = debugkernel.parse_fragment(FRAGMENT.read_text())
    assert [n for n in kerneltree.NEEDED if wanted.get(n) != "y"] == []


def test_kernel_setting_takes_a_name_or_an_absolute_path(tmp_path: Path) -> None:
    assert Settings(kernel=str(tmp_path)).kernel == str(tmp_path)
    with pytest.raises(SettingsError, match="nor the absolute path of a kernel tree"):
        Settings(kernel="olk/build")
    env = {"OBMM_TESTBED_KERNEL": "vanilla"}
    with pytest.raises(ValueError, match="OBMM_TESTBED_KERNEL='vanilla': not a valid kernel"):
        Settings.from_env(env)
    assert Settings.from_env({"OBMM_TESTBED_KERNEL": str(tmp_path)}).kernel == str(tmp_path)


def test_cmdline_of_a_kernel_with_its_modules_built_in_loads_none() -> None:
    topo = Topology()
    assert "obmm_testbed.modules=virtio_net,virtio_rng" in qemu.kernel_cmdline(topo, 0).split()
    words = qemu.kernel_cmdline(topo, 0, modules=()).split()
    assert not [w for w in words if w.startswith("obmm_testbed.modules")]


def test_timeout_scale_stretches_the_boot_timeout() -> None:
    topo = Topology(nodes=2)
    plain = boot_timeout(topo, "tcg")
    assert boot_timeout(topo, "tcg", 3.0) == 3 * plain
    with pytest.raises(SettingsError, match="must be >= 1"):
        Settings(timeout_scale=0.1)
    with pytest.raises(SettingsError, match="OBMM_TESTBED_TIMEOUT_SCALE='slow': not a valid float"):
        Settings.from_env({"OBMM_TESTBED_TIMEOUT_SCALE": "slow"})


LEAK = """unreferenced object 0xffff888003a1c000 (size 64):
  comm "insmod", pid 301, jiffies 4294940000 (age 12.300s)
  backtrace:
    [<ffffffff8150a1b4>] __kmalloc+0x44/0x90
    [<ffffffffc0201234>] obmm_export_ioctl+0x120/0x400 [obmm]
"""


def test_kmemleak_verdict_fails_on_any_report_and_on_no_scan(tmp_path: Path) -> None:
    passed, summary = kmemleak.verdict(tmp_path / "none")
    assert not passed and "ran on nothing" in summary
    (tmp_path / "qemu-test-1-node0.txt").write_text("")
    passed, summary = kmemleak.verdict(tmp_path)
    assert passed and "1 node scan(s), 0 with reports" in summary
    (tmp_path / "cluster-test-1-node1.txt").write_text(LEAK)
    passed, summary = kmemleak.verdict(tmp_path)
    assert not passed
    assert "cluster-test-1-node1: 1 kmemleak report(s)" in summary
    assert "obmm_export_ioctl" in summary


def test_kmemleak_unscanned_nodes_are_listed(tmp_path: Path) -> None:
    (tmp_path / "a-node0.txt").write_text("")
    (tmp_path / f"a-node1{kmemleak.UNSCANNED}").write_text("the node had died before the scan\n")
    passed, summary = kmemleak.verdict(tmp_path)
    assert passed  # a node killed on purpose has no memory left to leak
    assert "a-node1: not scanned: the node had died" in summary


def test_kmemleak_commands_are_no_ops_without_kmemleak(tmp_path: Path) -> None:
    fake = tmp_path / "kmemleak"
    for cmd in (kmemleak.BASELINE_CMD, kmemleak.SCAN_CMD):
        res = subprocess.run(
            ["sh", "-c", cmd.replace(kmemleak.KMEMLEAK, str(fake))],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
    res = subprocess.run(
        ["sh", "-c", kmemleak.SCAN_CMD.replace(kmemleak.KMEMLEAK, str(fake))],
        capture_output=True,
        text=True,
    )
    assert res.stdout.strip() == kmemleak.NO_KMEMLEAK


def test_the_baseline_in_provisioning_never_hides_a_failed_unpack() -> None:
    class Recorder(LocalNode):
        def __init__(self) -> None:
            super().__init__(0)
            self.commands: list[str] = []

        def run(self, command: str, **kw: Any) -> Result:
            self.commands.append(command)
            return Result(command, 0, b"", b"", 0.0)

    from obmm.testbed import provision

    node = Recorder()
    provision.unpack_payload(node, b"")
    unpack = node.commands[0]
    assert kmemleak.BASELINE_CMD in unpack
    # The unpack failing must fail the command, kmemleak or not.
    failing = unpack.replace("tar -xzf -", "false", 1).replace(kmemleak.KMEMLEAK, "/nonexistent")
    failing = failing.replace(str(provision.GUEST_ROOT), "/tmp/obmm-baseline-test")
    assert subprocess.run(["sh", "-c", failing], capture_output=True).returncode != 0


# Helpers whose CONFIG_DEBUG_VM expansion calls dump_mm(), which Linux 6.1 does not export:
# a module using one does not link against the debug kernel (ub_compat's mm.c did).
DUMP_MM_CALLERS = re.compile(
    r"\b(mmap_assert_(?:write_)?locked|VM_BUG_ON_MM|VM_WARN_ON(?:_ONCE)?_MM)\s*\("
)


def test_no_module_calls_what_links_to_the_unexported_dump_mm() -> None:
    kmod = Path(__file__).resolve().parents[3] / "kmod"
    callers = [
        f"{src.relative_to(kmod)}:{n}: {line.strip()}"
        for src in sorted(kmod.rglob("*.[ch]"))
        for n, line in enumerate(src.read_text().splitlines(), 1)
        if DUMP_MM_CALLERS.search(line) and not line.lstrip().startswith(("*", "/*", "//"))
    ]
    assert not callers, "does not link on the debug kernel:\n" + "\n".join(callers)


def test_every_module_builds_against_the_debug_kernel(tmp_path: Path) -> None:
    """What `make fuzz` and `make debug-test` load: all of kmod/, against the debug build tree
    (skips until `make debug-kernel` has built it)."""
    try:
        kernel = debugkernel.cached()
    except debugkernel.DebugKernelError as exc:
        pytest.skip(f"no debug kernel: {exc}")
    if kernel is None:
        pytest.skip("no debug kernel built (make debug-kernel)")
    kmod = Path(__file__).resolve().parents[3] / "kmod"
    built = kbuild.build_modules(kernel.kdir, kmod, tmp_path / "out", build_dir=tmp_path / "b")
    assert {p.name for p in built} >= {"obmm.ko", "ub_compat.ko"}
