"""The emulated obmm unloads clean and loads again: nothing of a region outlives rmmod.

The module's regions keep their mappings on inodes of a pseudo filesystem of
the module (kern_mount at load, kern_unmount at unload).  An inode left behind
would show as "VFS: Busy inodes after unmount of obmm_emu_region" at rmmod.
The reload uses the parameters the module was loaded with.  Emulator-only:
the real obmm.ko is not reloaded under a running suite.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import MAP_HUGETLB, MODULE, SZ_2M, Fabric, exported, unload_bound
from obmm_fixtures import MODULE_KO as KO
from obmm_fixtures import MODULE_PARAMS as PARAMS
from obmm_fixtures import module_loaded as loaded

import obmm
from obmm.tools import logscan

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.emulator_only

# The parameters the testbed loads the module with (obmm.testbed.provision.insmod_command).
RELOAD_PARAMS = ("node_id", "pool_base", "pool_size", "ubc_dev")


def rmmod() -> float:
    """rmmod, which must succeed within the unload bound; the seconds it took."""
    t0 = time.monotonic()
    subprocess.run(["rmmod", MODULE], check=True, timeout=120 + unload_bound())
    took = time.monotonic() - t0
    assert took < unload_bound(), f"rmmod took {took:.1f} s"
    return took


def load_parameters() -> dict[str, str]:
    """Every parameter the module shows that a test may load it with."""
    return {p.name: p.read_text() for p in PARAMS.iterdir() if p.name not in TEST_KNOBS}


# Run-time knobs of the tests (root-writable), not load parameters.
TEST_KNOBS = ("test_pin_delay_ms", "test_zero_delay_ms", "test_exit_delay_ms")


@pytest.fixture
def reload_args() -> Iterator[list[str]]:
    """The module's load parameters; it is loaded again with them whatever the test did."""
    if not KO.is_file() or not loaded():
        pytest.skip(f"{KO} not loaded from the testbed's payload")
    args = [f"{p}={(PARAMS / p).read_text().strip()}" for p in RELOAD_PARAMS]
    before = load_parameters()
    yield args
    if loaded() and load_parameters() != before:
        subprocess.run(["rmmod", MODULE], check=True)
    if not loaded():
        subprocess.run(["insmod", str(KO), *args], check=True)


def test_unload_after_regions_opened_through_other_nodes_leaves_no_inode(
    reload_args: list[str], fabric: Fabric, tmp_path: Path, kernel_log: KernelLog
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)], check=True)
    try:
        with obmm.Obmm() as dev, exported(dev) as exp:
            imp = fabric.import_loopback(dev, exp)
            try:
                for mem_id in (exp.mem_id, imp.mem_id):
                    node = Path(f"/dev/obmm_shmdev{mem_id}")
                    os.mknod(mnt / node.name, 0o600 | stat.S_IFCHR, node.stat().st_rdev)
                    with obmm.ShmDev(mem_id, dev_dir=str(mnt)) as shm, shm.mmap(SZ_2M) as m:
                        m.write(0, b"reload")
            finally:
                dev.unimport(imp.mem_id)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    kernel_log.take()

    rmmod()
    assert not loaded()
    log = kernel_log.take()
    assert "Busy inodes" not in log, log
    assert not logscan.scan(log, allow=()), log

    subprocess.run(["insmod", str(KO), *reload_args], check=True)
    with (
        obmm.Obmm() as dev,
        exported(dev) as exp,
        obmm.ShmDev(exp.mem_id) as shm,
        shm.mmap(SZ_2M) as m,
    ):
        assert m.read(0, 6) == bytes(6), "a new export is zeroed"
    log = kernel_log.take()
    assert not logscan.scan(log, allow=()), log


def module_log_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if f" {MODULE}: " in line]


def test_modprobe_finds_the_module_where_a_ub_host_has_it(
    reload_args: list[str], kernel_log: KernelLog
) -> None:
    """The module is `obmm`, installed as /lib/modules/$(uname -r)/obmm/obmm.ko and indexed:
    `modprobe -r obmm`, `modprobe obmm ...` and ubs-test's insmod of that path work, and the
    kernel command line hands the module no parameter of the testbed's own."""
    installed = Path("/lib/modules") / os.uname().release / "obmm" / "obmm.ko"
    assert installed.read_bytes() == KO.read_bytes()
    lsmod = subprocess.run(["lsmod"], check=True, capture_output=True, text=True).stdout
    assert re.search(r"^obmm\s", lsmod, re.M), lsmod
    kernel_log.take()
    subprocess.run(["modprobe", "-r", MODULE], check=True)
    assert not loaded()
    subprocess.run(["modprobe", MODULE, *reload_args], check=True)
    assert loaded()
    with obmm.Obmm() as dev, exported(dev) as exp:
        assert exp.mem_id > 0
    log = kernel_log.take()
    # The real driver's own lines (obmm_core.c:obmm_init, obmm_exit, ubmem_feature_probe).
    real = [m.group(1) for m in re.finditer(r"OBMM: (obmm_module: .*|ub_feature: .*)$", log, re.M)]
    assert real == [
        "obmm_module: exit started",
        "obmm_module: exit completed",
        "obmm_module: init started",
        "ub_feature: 0xf, obmm_enabled: 1",
        "obmm_module: init completed",
    ], log
    assert not [ln for ln in module_log_lines(log) if "unknown parameter" in ln], log
    subprocess.run(["rmmod", f"{MODULE}.ko"], check=True)  # as ubs-test spells it
    subprocess.run(["insmod", str(installed), *reload_args], check=True)
    assert loaded()
    assert not logscan.scan(kernel_log.take(), allow=())


# A real host's controller directory, as a seed program hard-codes it
# (docs/obmm-driver.md section 8.2: /sys/devices/ub_bus_controller1/00002/primary_cna).
REAL_HOST_UBC = Path("/sys/devices/ub_bus_controller1/00002")
HARD_CODED_READER = r"""
#include <stdio.h>
int main(void)
{
	unsigned int cna, eid;
	FILE *f = fopen("/sys/devices/ub_bus_controller1/00002/primary_cna", "r");

	if (!f || fscanf(f, "%x", &cna) != 1)
		return 1;
	fclose(f);
	f = fopen("/sys/devices/ub_bus_controller1/00002/eid", "r");
	if (!f || fscanf(f, "%u", &eid) != 1)
		return 2;
	printf("%#x %#x\n", cna, eid);
	return 0;
}
"""


def test_ubc_index_and_device_name_parameters(
    reload_args: list[str], fabric: Fabric, tmp_path: Path
) -> None:
    """ubc_index=1 ubc_dev=00002: a program that hard-codes a real host's controller path
    runs unchanged, and the CNA it reads is the scna IMPORT takes."""
    src, exe = tmp_path / "reader.c", tmp_path / "reader"
    src.write_text(HARD_CODED_READER)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    rmmod()
    args = [a for a in reload_args if not a.startswith("ubc_dev=")]
    subprocess.run(["insmod", str(KO), *args, "ubc_index=1", "ubc_dev=00002"], check=True)
    try:
        assert not Path("/sys/devices/ub_bus_controller0").exists()
        assert (REAL_HOST_UBC / "ubc").is_file()
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        cna, eid = (int(v, 16) for v in out.split())
        assert (cna, eid) == (fabric.cna, fabric.eid)
        with obmm.Obmm() as dev, exported(dev) as exp:
            imp = dev.import_(
                fabric.loopback_addr(dev, exp.mem_id), SZ_2M, scna=cna, tokenid=exp.tokenid
            )
            dev.unimport(imp.mem_id)
    finally:
        rmmod()
    subprocess.run(["insmod", str(KO), *args], check=True)
    assert Path("/sys/devices/ub_bus_controller0/00001/primary_cna").is_file()
    assert not REAL_HOST_UBC.exists()


@pytest.mark.parametrize(
    "param", ["ubc_index=8", "ubc_dev=a/b", "ubc_dev=..", f"ubc_dev={'x' * 33}"]
)
def test_bad_ubc_parameters_fail_the_load(
    reload_args: list[str], param: str, kernel_log: KernelLog
) -> None:
    rmmod()
    res = subprocess.run(["insmod", str(KO), *reload_args, param], capture_output=True)
    assert res.returncode != 0
    assert not loaded()
    assert not list(Path("/sys/devices").glob("ub_bus_controller*"))
    log = kernel_log.take()
    assert re.search(r"obmm: ubc_(index|dev) .* (out of range|is not a directory name)", log)
    assert not logscan.scan(log, allow=()), log


def test_reload_after_a_borrow_finds_the_pool_again(
    reload_args: list[str], fabric: Fabric, kernel_log: KernelLog
) -> None:
    """A borrow's hot-add moves the kernel's high_memory up to the window and its removal
    does not move it back: the reloaded module must still find the RAM end (mem=) and its
    pool (it used to find no pool: every EXPORT then failed with ENODEV)."""
    block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text(), 16)
    quarantined = Path("/sys/kernel/obmm_emu/quarantined")
    deadline = time.monotonic() + 60
    while int(quarantined.read_text(), 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    with obmm.Obmm() as dev, exported(dev, block) as exp:
        if fabric.loopback_addr(dev, exp.mem_id) % block:
            pytest.skip("the pool gave no block-aligned range")
        imp = fabric.import_loopback(dev, exp, flags=obmm.abi.OBMM_IMPORT_FLAG_NUMA_REMOTE)
        dev.unimport(imp.mem_id)
    while int(quarantined.read_text(), 0) and time.monotonic() < deadline + 60:
        time.sleep(0.2)
    kernel_log.take()
    rmmod()
    subprocess.run(["insmod", str(KO), *reload_args], check=True)
    assert "obmm_emu pool" in Path("/proc/iomem").read_text()
    with obmm.Obmm() as dev, exported(dev, block) as exp:
        assert exp.length == block
    log = kernel_log.take()
    assert "no export pool" not in log, log
    assert not logscan.scan(log, allow=()), log


# ---- unload does not wait for the module's background work, nor runs it after the fabric ----


def test_unload_stops_the_zero_worker_at_once(
    reload_args: list[str], kernel_log: KernelLog
) -> None:
    """Loaded with the test build's test_zero_delay_ms at its 5 s maximum, the zero worker
    holds each of the pool's 127 freshly dirty granules 5 s before clearing it; rmmod waited
    for all of them (about 10 minutes).  Unload now wakes the worker from the granule it is at
    and stops it there.  The test build logs how each granule's delay ended: unload never
    waits one out, ends at most one, and no granule is taken after it (events, not rmmod's
    wall time, which a busy host stretches; on one, the unload may come while the worker
    clears a granule between two delays, and end none)."""
    if not (PARAMS / "test_zero_delay_ms").exists():
        pytest.skip("not the suites' build of obmm_emu (no test_zero_delay_ms)")
    rmmod()
    kernel_log.take()
    subprocess.run(["insmod", str(KO), *reload_args, "test_zero_delay_ms=5000"], check=True)
    time.sleep(1)  # the worker has claimed its first granule and waits
    rmmod()
    subprocess.run(["insmod", str(KO), *reload_args], check=True)
    log = kernel_log.take()
    ends = [how for _, how in ZERO_DELAY_END.findall(log)]
    assert ends, f"no zero-worker delay line in the log:\n{log}"
    assert "served while unload waited" not in ends, log
    assert ends.count("ended by unload") <= 1, log
    assert "ended by unload" not in ends[:-1], log
    assert not logscan.scan(log, allow=()), log


#: The test build's line for the end of a granule's zero delay (pool.c).
ZERO_DELAY_END = re.compile(
    r"test: zero worker: granule (\d+): delay (ended by unload|served while unload waited|served)$",
    re.MULTILINE,
)


def test_unload_cancels_the_export_pid_quarantine_before_the_fabric_goes(
    reload_args: list[str], hugepages: int, kernel_log: KernelLog
) -> None:
    """An unexported EXPORT_PID region stays pinned in a quarantine whose delayed work reads
    the control region.  Module exit tore the fabric down (control region unmapped, its locks
    destroyed) before it cancelled that work; with the test build's test_exit_delay_ms holding
    exit after the fabric's teardown, the work ran then (a WARN: the fabric is gone).  Now it
    is cancelled first, and the pages are let go at unload."""
    if not (PARAMS / "test_exit_delay_ms").exists():
        pytest.skip("not the suites' build of obmm_emu (no test_exit_delay_ms)")
    buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    buf.write(b"pid-quarantine")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    with obmm.Obmm() as dev:
        exp = dev.export_pid(addr, SZ_2M)
        dev.unexport(exp.mem_id)  # pinned for quarantine_ms (1 s) and every peer's ack
    (PARAMS / "test_exit_delay_ms").write_text("2500")
    kernel_log.take()
    rmmod()
    subprocess.run(["insmod", str(KO), *reload_args], check=True)
    log = kernel_log.take()
    assert not logscan.scan(log, allow=()), log
    assert buf[:14] == b"pid-quarantine"


CTL_RESOURCE = Path("/sys/bus/pci/devices/0000:00:0f.0/resource2")
# obmm_emu_ctl.h: the node table at 0x1000, 0x100 per node, state the second u32
NODE_STATE_OFF, NODE_STRIDE, NODE_ONLINE = 0x1000 + 4, 0x100, 1


def vm_pin_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmPin:\s+(\d+) kB", status, re.M).group(1))  # type: ignore[union-attr]


def test_unload_unpins_quarantined_export_pid_pages_only_once_the_node_is_offline(
    reload_args: list[str], hugepages: int, fabric: Fabric
) -> None:
    """EXPORT_PID pages in the unexport quarantine wait for every peer's acknowledgment; at
    unload they were unpinned before the node went OFFLINE, so a peer still mapping them read
    and wrote freed pages until its next scan (issue 36, finding 10).  Now the node goes
    OFFLINE (peers revoke their imports of it) first: in the pause of the test build's
    test_exit_delay_ms after the fabric's teardown the pages are still pinned."""
    if not (PARAMS / "test_exit_delay_ms").exists():
        pytest.skip("not the suites' build of obmm_emu (no test_exit_delay_ms)")
    if not CTL_RESOURCE.exists():
        pytest.skip("no control region device 00:0f.0")
    fd = os.open(CTL_RESOURCE, os.O_RDONLY | os.O_SYNC)
    try:
        ctl = mmap.mmap(fd, SZ_2M, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    state_at = NODE_STATE_OFF + fabric.node_id * NODE_STRIDE
    buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    buf.write(b"pid-quarantine")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    pinned_before = vm_pin_kib()
    with obmm.Obmm() as dev:
        exp = dev.export_pid(addr, SZ_2M)
        dev.unexport(exp.mem_id)  # pinned for quarantine_ms (1 s) and every peer's ack
    assert vm_pin_kib() == pinned_before + SZ_2M // 1024, "not pinned in quarantine"
    (PARAMS / "test_exit_delay_ms").write_text("2500")
    unload = subprocess.Popen(["rmmod", MODULE])
    offline_pins: list[int] = []
    while unload.poll() is None:
        if int.from_bytes(ctl[state_at : state_at + 4], "little") != NODE_ONLINE:
            offline_pins.append(vm_pin_kib() - pinned_before)
        time.sleep(0.05)
    ctl.close()
    assert unload.returncode == 0
    subprocess.run(["insmod", str(KO), *reload_args], check=True)
    assert vm_pin_kib() == pinned_before, "the pages stayed pinned after unload"
    assert offline_pins, "the node was never seen OFFLINE during the unload"
    assert offline_pins[0] == SZ_2M // 1024, (
        f"unpinned before the node went OFFLINE (pinned KiB once OFFLINE: {offline_pins[:5]})"
    )
    assert buf[:14] == b"pid-quarantine"


# ---- module parameters as the real driver has them (ubmempool_allocator.c, obmm_cache.c) ----

# name: (value after a load that does not set it, mode)
REAL_PARAMS = {
    "mempool_size": ("1G", 0o440),
    "mempool_allocator": ("buddy_highmem", 0o440),
    "mem_allocator_granu": ("2M", 0o440),
    "mempool_refill_timeout": ("30000", 0o440),
    "skip_cache_maintain": ("N", 0o444),
}


def test_real_parameters_read_as_after_a_real_load(reload_args: list[str]) -> None:
    """Loaded with only the fabric's parameters, each of the real driver's reads what the
    real driver's does after load (mem_allocator_granu: the granule in use)."""
    subprocess.run(["rmmod", MODULE], check=True)
    subprocess.run(["modprobe", MODULE, *reload_args], check=True)
    for name, (value, perm) in REAL_PARAMS.items():
        path = PARAMS / name
        assert path.read_text() == value + "\n", name
        assert stat.S_IMODE(path.stat().st_mode) == perm, name


@pytest.mark.parametrize(
    ("args", "granu", "pool_mib"),
    [
        (["mempool_size=256M", "mempool_allocator=hugetlb_pmd"], "2M", 256),
        (["mempool_size=64M", "mem_allocator_granu=4M"], "4M", 64),
        (["mempool_size=32Mx"], "2M", 32),  # the real mempool_size parser ignores the tail
    ],
)
def test_modprobe_with_pool_parameters(
    reload_args: list[str], args: list[str], granu: str, pool_mib: int
) -> None:
    """`modprobe obmm mempool_size=NG mempool_allocator=hugetlb_pmd` as ubs-test loads it:
    the pool is mempool_size (no pool_size given) and exports take the granule."""
    fabric_args = [a for a in reload_args if not a.startswith("pool_size=")]
    subprocess.run(["modprobe", "-r", MODULE], check=True)
    subprocess.run(["modprobe", MODULE, *fabric_args, *args], check=True)
    given = dict(a.split("=", 1) for a in args)
    for name, value in given.items():
        assert (PARAMS / name).read_text() == value + "\n"
    assert (PARAMS / "mem_allocator_granu").read_text() == granu + "\n"
    total = int(next(Path("/sys/kernel/obmm_mempool").glob("obmm-*/total")).read_text(), 0)
    # The pool is claimed in whole granules below the firmware's reserved top.
    assert pool_mib << 20 >= total > (pool_mib << 20) - (4 << 20)
    granu_bytes = int(granu[:-1]) << 20
    with obmm.Obmm() as dev, exported(dev, granu_bytes) as exp:
        assert exp.length == granu_bytes
        with pytest.raises(obmm.ObmmError) as err:
            dev.export(granu_bytes // 2)  # not a whole granule
        assert err.value.errname == "EINVAL"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mem_allocator_granu=4Mx"], "invalid mem_allocator_granu: 4Mx"),
        (["mem_allocator_granu=1M"], "unsupported mem_allocator_granu: 1M"),
        (["mem_allocator_granu=3M"], "unsupported mem_allocator_granu: 3M"),
        (["mem_allocator_granu=6M"], "mem_allocator_granu must be power of 2: 6M"),
        (
            ["mempool_allocator=hugetlb_pmd", "mem_allocator_granu=4M"],
            "unsupported mem_allocator_granu for hugetlb_pmd allocator: 4M",
        ),
        (
            ["mempool_allocator=hugetlb_pud", "mem_allocator_granu=2M"],
            "unsupported mem_allocator_granu for hugetlb_pud allocator: 2M",
        ),
        (["mempool_allocator=slab"], "invalid mem allocator specified: slab"),
    ],
)
def test_bad_pool_parameters_fail_the_load_as_the_real_parser(
    reload_args: list[str], args: list[str], message: str, kernel_log: KernelLog
) -> None:
    subprocess.run(["rmmod", MODULE], check=True)
    kernel_log.take()
    res = subprocess.run(["insmod", str(KO), *reload_args, *args], capture_output=True, text=True)
    assert res.returncode != 0
    assert "Invalid parameters" in res.stderr, res.stderr  # kmod's words for EINVAL
    assert not loaded()
    log = kernel_log.take()
    assert message in log, log
    assert not Path("/dev/obmm").exists()
    assert not logscan.scan(log, allow=()), log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["coherence=loose"], "obmm: emulator: coherence=loose: not coherent or strict"),
        (
            ["coherence=strict", "coherence_evict=1001"],
            "obmm: emulator: coherence_evict=1001 out of range (0..1000, in 1/1000)",
        ),
        (["coherence_scan_ms=2"], "obmm: emulator: coherence_scan_ms=2 out of range (5..1000)"),
    ],
)
def test_bad_coherence_parameters_fail_the_load_with_a_line(
    reload_args: list[str], args: list[str], message: str, kernel_log: KernelLog
) -> None:
    """A coherence_* value the emulator does not take fails the load and says which."""
    rmmod()
    kernel_log.take()
    res = subprocess.run(["insmod", str(KO), *reload_args, *args], capture_output=True, text=True)
    assert res.returncode != 0
    assert not loaded()
    log = kernel_log.take()
    assert message in log, log
    assert not logscan.scan(log, allow=()), log
