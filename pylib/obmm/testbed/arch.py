"""The guest architectures: every fact that differs between an x86_64 and an arm64 node, in
one table (:data:`ARCHS`), read by the image build, the module builds, the KVM probe and the
QEMU command line instead of constants of their own.

A leaf of the spine (the builds below the machines read it too).  Adding an architecture is a
row here, its recipe's packages (if any differ), its NUMA tables (:mod:`obmm.testbed.vm.numa`)
and the golden command lines of its tests.

The arm64 node is shaped like a Kunpeng 920 host: QEMU's `virt` machine with a GICv3 and the
`neoverse-n1` CPU model.  Kunpeng 920's TaiShan v110 cores implement ARMv8.2-A (LSE atomics,
RAS, dot product, FP16, 4 KiB pages, 48-bit VA); of the models QEMU 7.2 offers, neoverse-n1 is
the ARMv8.2 server core with exactly that feature set.  `cortex-a76` is the same
microarchitecture as a client part; `max` adds ARMv8.5+ features Kunpeng lacks (pointer
authentication, whose QARMA emulation also makes TCG several times slower; MTE, BTI), so user
code probing HWCAPs would see a machine no UB host is.
"""

from __future__ import annotations

from dataclasses import dataclass

from obmm.testbed.errors import TestbedError


class ArchError(TestbedError, ValueError):
    """An architecture the testbed has no row for."""


@dataclass(frozen=True)
class Arch:
    """One guest architecture."""

    #: The setting's value (OBMM_TESTBED_ARCH, --arch).
    name: str
    #: `uname -m` in the guest.
    machine: str
    #: Debian's architecture (packages, mmdebstrap --architectures, linux-image-<debian>).
    debian: str
    #: ARCH= of a kernel build.
    kernel_arch: str
    #: CROSS_COMPILE= of a module build on an x86_64 host ('' : native).
    cross_compile: str
    #: The compiler's Debian package (make setup installs it).
    cross_gcc_package: str
    qemu_binary: str
    #: QEMU's Debian package holding `qemu_binary`.
    qemu_package: str
    #: -machine (without its memory backend option).
    qemu_machine: str
    #: -cpu under TCG (under KVM: host).
    tcg_cpu: str
    #: The serial console the kernel writes to.
    console: str
    #: ELF e_machine name of the guest's modules (the ELF pre-flight).
    elf_machine: str
    #: Where the spare NUMA nodes borrowing hot-adds to are declared: "acpi" (an SRAT and a
    #: SLIT passed with -acpitable) or "dtb" (memory nodes and a distance-map in the device
    #: tree, since `virt` booted without firmware has no ACPI).
    numa_tables: str
    #: Guest-physical address where the node's RAM (and so the RAM file) starts.
    ram_base: int
    #: Firmware of the fast boot (None: the machine's own loader).
    fast_firmware: str | None
    #: Kernel parameters only this architecture takes.
    cmdline: tuple[str, ...] = ()
    #: The fast boot starts the kernel's ELF at its PVH entry (x86: no decompression under
    #: TCG; obmm.testbed.vm.pvh); else the image's kernel as Debian ships it.
    pvh_entry: bool = False
    #: A foreign architecture's packages run at image build under qemu-user (binfmt_misc).
    binfmt: str | None = None
    #: How the host writes a paused guest's PCI configuration (a snapshot restore maps the
    #: ivshmem BARs before loading): "port" (the 0xCF8/0xCFC ports, through the monitor's
    #: port writes) or "ecam" (memory-mapped config space, which no monitor command writes:
    #: through a qtest socket given to the restoring QEMU).
    pci_config: str = "port"


X86_64 = Arch(
    name="x86_64",
    machine="x86_64",
    debian="amd64",
    kernel_arch="x86",
    cross_compile="",
    cross_gcc_package="gcc",
    qemu_binary="qemu-system-x86_64",
    qemu_package="qemu-system-x86",
    qemu_machine="q35",
    tcg_cpu="max",
    console="ttyS0,115200",
    elf_machine="EM_X86_64",
    numa_tables="acpi",
    ram_base=0,
    # qboot (shipped with QEMU) initialises PCI and jumps to the kernel in a fraction of
    # SeaBIOS's time under TCG.
    fast_firmware="/usr/share/qemu/qboot.rom",
    # The TSC is QEMU's host-clock-based counter, so it is monotonic; but a starved vCPU
    # thread between the watchdog's two reads looks like skew, and the kernel then switches
    # to the HPET for good (seen on a node of an 8-node bench cluster), which makes every
    # clock read a syscall.  So no clocksource watchdog.
    cmdline=("tsc=reliable",),
    pvh_entry=True,
)

ARM64 = Arch(
    name="arm64",
    machine="aarch64",
    debian="arm64",
    kernel_arch="arm64",
    cross_compile="aarch64-linux-gnu-",
    cross_gcc_package="gcc-aarch64-linux-gnu",
    qemu_binary="qemu-system-aarch64",
    qemu_package="qemu-system-arm",
    # GICv3 as on Kunpeng (and more than 8 CPUs possible); PCIe ECAM and 64-bit BARs above
    # 4 GiB (highmem), where the windows go.
    qemu_machine="virt,gic-version=3",
    tcg_cpu="neoverse-n1",
    console="ttyAMA0",
    elf_machine="EM_AARCH64",
    numa_tables="dtb",
    ram_base=0x4000_0000,
    # QEMU's own loader boots an Image directly (with its device tree); no firmware.
    fast_firmware=None,
    binfmt="qemu-aarch64",
    # `virt` has no configuration ports: its PCIe config space is ECAM only.
    pci_config="ecam",
)


def kbuild_vars(arch: Arch) -> dict[str, str]:
    """Make variables of a module build for `arch` on this (x86_64) host: none when native."""
    if not arch.cross_compile:
        return {}
    return {"ARCH": arch.kernel_arch, "CROSS_COMPILE": arch.cross_compile}


ARCHS: dict[str, Arch] = {a.name: a for a in (X86_64, ARM64)}
DEFAULT = X86_64.name
#: The names by Debian's and uname's spelling too (an image manifest, `uname -m`).
_ALIASES = {a.debian: a for a in ARCHS.values()} | {a.machine: a for a in ARCHS.values()}


def get(name: str | None) -> Arch:
    """The row of `name` (the setting's value, or Debian's or uname's name); None: x86_64."""
    found = ARCHS.get(name or DEFAULT) or _ALIASES.get(name or DEFAULT)
    if found is None:
        raise ArchError(f"architecture {name!r}: expected one of {', '.join(ARCHS)}")
    return found
