"""Guest tests proving the testbed plumbing: modules loaded, devices present, tools importable."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest


def _loaded_modules() -> set[str]:
    return {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_runs_as_root_in_a_guest() -> None:
    assert os.geteuid() == 0
    assert Path("/opt/obmm-testbed/pylib/obmm/__init__.py").is_file()


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_testhook_module_loaded() -> None:
    assert "obmm_testhook" in _loaded_modules()


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_testhook_device_answers() -> None:
    dev = Path("/dev/obmm_testhook")
    assert dev.is_char_device()
    assert dev.read_text() == "obmm_testhook ready\n"


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_testhook_rejects_unknown_command() -> None:
    with pytest.raises(OSError) as exc:
        Path("/dev/obmm_testhook").write_text("bogus\n")
    assert exc.value.errno == 22  # EINVAL


def test_python_and_cffi_present() -> None:
    import cffi

    assert sys.version_info >= (3, 9)
    ffi = cffi.FFI()
    ffi.cdef("int abs(int);")
    lib = ffi.dlopen(None)
    assert lib.abs(-7) == 7


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_obmm_package_importable_from_copied_tree() -> None:
    import obmm

    assert obmm.__file__ is not None
    assert obmm.__file__.startswith("/opt/obmm-testbed/pylib/")


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_node_environment_matches_the_topology() -> None:
    node = int(os.environ["OBMM_NODE_ID"])
    nodes = int(os.environ["OBMM_NODES"])
    assert 0 <= node < nodes
    assert Path("/proc/sys/kernel/hostname").read_text().strip() == f"node{node}"
    # mem= hides the export pool from the kernel: it sees less than the QEMU RAM size.
    pool_base = int(os.environ["OBMM_POOL_BASE"])
    memtotal_kib = int(Path("/proc/meminfo").read_text().split()[1])
    assert memtotal_kib * 1024 <= pool_base


@pytest.mark.emulator_only  # QEMU testbed plumbing
@pytest.mark.skipif(
    platform.machine() != "x86_64",
    reason="x86 only: arm64's clocksource is the architected timer (arch_sys_counter), read "
    "in the vDSO with no watchdog",
)
def test_the_clock_is_the_tsc_and_no_watchdog_can_take_it() -> None:
    """Every clock read of the suites stays in the vDSO: the TSC is the clocksource, and the
    kernel was told it is reliable, so a vCPU starved under load cannot make the clocksource
    watchdog switch to the HPET (it did once, on an 8-node bench cluster)."""
    cs = Path("/sys/devices/system/clocksource/clocksource0")
    assert (cs / "current_clocksource").read_text().strip() == "tsc"
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    assert "Marking TSC unstable" not in log
    assert "tsc=reliable" in Path("/proc/cmdline").read_text().split()


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_fabric_windows_and_control_region_present() -> None:
    # ivshmem-plain is PCI 1af4:1110; one control region plus one window per node.
    nodes = int(os.environ["OBMM_NODES"])
    devices = [
        d
        for d in Path("/sys/bus/pci/devices").iterdir()
        if (d / "vendor").read_text().strip() == "0x1af4"
        and (d / "device").read_text().strip() == "0x1110"
    ]
    assert len(devices) == nodes + 1
    slots = sorted(int(d.name.split(":")[2].split(".")[0], 16) for d in devices)
    assert slots == [0x0F, *range(0x10, 0x10 + nodes)]


@pytest.mark.emulator_only  # QEMU testbed plumbing
def test_kernel_headers_match_running_kernel() -> None:
    release = os.uname().release
    if release.endswith("-obmm-debug"):
        # The debug kernel (obmm.testbed.builds.debugkernel) boots Debian's image with its own
        # kernel; modules are built against its build tree on the host, never in the guest.
        pytest.skip(f"debug kernel {release}: the image carries Debian's headers only")
    assert Path(f"/usr/src/linux-headers-{release}/Makefile").is_file()


def test_the_bindings_in_use_have_the_parsed_declarations_layouts() -> None:
    """Whichever ffi `import obmm` took (the payload's precompiled declarations, made by the
    host's cffi, or parsed here), this cffi lays every struct out as parsing them here does."""
    from obmm import abi

    parsed = abi.parse_ffi()
    for struct in abi.STRUCT_NAMES:
        assert abi.ffi.sizeof(struct) == parsed.sizeof(struct), struct
        assert abi.ffi.alignof(struct) == parsed.alignof(struct), struct
        fields = [name for name, _ in parsed.typeof(struct).fields]
        assert [name for name, _ in abi.ffi.typeof(struct).fields] == fields, struct
        for name in fields:
            assert abi.ffi.offsetof(struct, name) == parsed.offsetof(struct, name), (struct, name)
    for name in ("ioctl", "mmap", "munmap"):
        ours = abi.ffi.typeof(getattr(abi.libc(), name))
        assert str(ours) == str(parsed.typeof(getattr(parsed.dlopen(None), name)))


@pytest.mark.emulator_only  # the QEMU testbed's payload
def test_the_payload_bindings_come_precompiled() -> None:
    # The guest's cffi (Debian's) loads the host-made module: no pycparser in guest processes.
    from obmm import abi

    assert abi.FFI_ORIGIN == "precompiled"
